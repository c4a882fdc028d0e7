// Shared helpers of the ddtree_runtime kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

namespace ddtree {

// Deepest draft tree the kernels support (rank paths are packed as 16 levels of 16 bits).
constexpr int kMaxDepth = 16;
// Largest node budget (and per-depth top-K) the kernels support.
constexpr int kMaxBudget = 1024;
// "No node" / "no token" sentinel, never a real token id or node index.
constexpr int64_t kNoNode = -1;

// Order-preserving map of a float32 to uint32 (larger float -> larger key). -0.0 is folded onto +0.0 so that
// equal values compare equal, as torch's comparisons do.
__device__ __forceinline__ uint32_t float_to_key(float x) {
  uint32_t bits = __float_as_uint(x);
  if (bits == 0x80000000u) bits = 0u;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float key_to_float(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  return __uint_as_float(bits);
}

inline void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
}

inline int blocks_for(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

// The device's opt-in shared memory per block, in bytes (an H200 allows 232448, an RTX PRO 6000 Blackwell 101376).
// DDTREE_SMEM_LIMIT caps it, so that tests run a smaller GPU's launch plans on the GPU they have.
inline int smem_optin_bytes(int device) {
  int optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const char* cap = std::getenv("DDTREE_SMEM_LIMIT");
  if (cap != nullptr && *cap != '\0') {
    char* end = nullptr;
    const long value = std::strtol(cap, &end, 10);
    TORCH_CHECK(end != cap && *end == '\0' && value > 0,
                "DDTREE_SMEM_LIMIT must be a positive number of bytes, not '", cap, "'");
    optin = static_cast<int>(std::min<long>(optin, value));
  }
  return optin;
}

// Dynamic shared memory a kernel may ask for on a device: the opt-in limit less the kernel's static shared memory.
template <typename Kernel>
int dynamic_smem_room(int optin, Kernel* kernel) {
  cudaFuncAttributes attributes{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  return std::max(0, optin - static_cast<int>(attributes.sharedSizeBytes));
}

}  // namespace ddtree
