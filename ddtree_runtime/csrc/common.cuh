// Shared helpers of the ddtree_runtime kernels.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>

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

}  // namespace ddtree
