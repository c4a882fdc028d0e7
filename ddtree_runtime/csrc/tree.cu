// Best-first DDTree construction from per-depth top-K log-probabilities, one block per request.
//
// The frontier is the reference's fixed slot array (pop t writes its next sibling to slot 1 + 2t and its first
// child to slot 2 + 2t); each thread owns two slots in registers. A pop is a block-wide arg-best over the
// frontier by (float64 score desc, rank path asc), so the result equals the Python heap's pop order exactly.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <mutex>

#include "common.cuh"

namespace ddtree {
namespace {

constexpr int kSlotsPerThread = 2;
constexpr int kPathWords = kMaxDepth / 4;

// A frontier entry. The rank path stores rank + 1 per level (0 = level absent), 16 bits per level, most
// significant level first, so comparing the words lexicographically orders paths as tuples do (a prefix
// before its extensions).
struct Entry {
  double score;
  uint64_t path[kPathWords];
  int parent;
  int depth;
  int rank;
  int slot;  // -1: empty
};

__device__ __forceinline__ Entry empty_entry() {
  Entry e{};
  e.slot = -1;
  return e;
}

__device__ __forceinline__ bool precedes(const Entry& a, const Entry& b) {
  if (a.slot < 0) return false;
  if (b.slot < 0) return true;
  if (a.score != b.score) return a.score > b.score;
#pragma unroll
  for (int w = 0; w < kPathWords; ++w) {
    if (a.path[w] != b.path[w]) return a.path[w] < b.path[w];
  }
  return a.slot < b.slot;
}

__device__ __forceinline__ void set_level(uint64_t (&path)[kPathWords], int level, int value) {
  const int shift = (3 - (level & 3)) * 16;
#pragma unroll
  for (int w = 0; w < kPathWords; ++w) {
    if (w == (level >> 2)) path[w] = (path[w] & ~(uint64_t{0xffff} << shift)) | (static_cast<uint64_t>(value) << shift);
  }
}

__device__ __forceinline__ Entry shuffle_down(const Entry& e, int offset) {
  Entry out;
  out.score = __shfl_down_sync(0xffffffffu, e.score, offset);
#pragma unroll
  for (int w = 0; w < kPathWords; ++w) out.path[w] = __shfl_down_sync(0xffffffffu, e.path[w], offset);
  out.parent = __shfl_down_sync(0xffffffffu, e.parent, offset);
  out.depth = __shfl_down_sync(0xffffffffu, e.depth, offset);
  out.rank = __shfl_down_sync(0xffffffffu, e.rank, offset);
  out.slot = __shfl_down_sync(0xffffffffu, e.slot, offset);
  return out;
}

__device__ __forceinline__ Entry warp_best(Entry best) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Entry other = shuffle_down(best, offset);
    if (precedes(other, best)) best = other;
  }
  return best;
}

__global__ void __launch_bounds__(1024) build_tree_kernel(
    const float* __restrict__ log_probs, const int64_t* __restrict__ top_ids, const int64_t* __restrict__ budgets,
    int depth_limit, int k_max, int max_budget, int64_t* __restrict__ token_ids, int64_t* __restrict__ depths,
    int64_t* __restrict__ parents, double* __restrict__ scores, int64_t* __restrict__ ranks,
    int64_t* __restrict__ num_nodes) {
  // The request's [L, K] log-probabilities, so that the pop loop touches shared memory only.
  extern __shared__ float lp[];
  __shared__ double node_score[kMaxBudget + 1];
  __shared__ int node_parent[kMaxBudget + 1];
  __shared__ int node_depth_rank[kMaxBudget];  // depth << 16 | rank
  __shared__ Entry warp_winners[32];
  __shared__ Entry popped;

  const int request = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t width = max_budget;
  for (int i = threadIdx.x; i < max_budget; i += blockDim.x) {
    token_ids[request * width + i] = kNoNode;
    depths[request * width + i] = 0;
    ranks[request * width + i] = kNoNode;
    scores[request * width + i] = -INFINITY;
  }
  for (int i = threadIdx.x; i <= max_budget; i += blockDim.x) parents[request * (width + 1) + i] = kNoNode;
  const int64_t table = static_cast<int64_t>(depth_limit) * k_max;
  for (int64_t i = threadIdx.x; i < table; i += blockDim.x) lp[i] = log_probs[request * table + i];

  const int64_t requested = budgets[request];
  const int budget = requested < 0 ? 0 : static_cast<int>(requested > max_budget ? max_budget : requested);
  const int k = min(max(budget, 1), k_max);

  Entry slots[kSlotsPerThread];
#pragma unroll
  for (int j = 0; j < kSlotsPerThread; ++j) slots[j] = empty_entry();
  __syncthreads();
  if (threadIdx.x == 0) {
    node_score[0] = 0.0;
    if (budget > 0 && depth_limit > 0 && k_max > 0) {
      slots[0].score = 0.0 + static_cast<double>(lp[0]);
      set_level(slots[0].path, 0, 1);
      slots[0].parent = 0;
      slots[0].depth = 1;
      slots[0].rank = 0;
      slots[0].slot = 0;
    }
  }

  int count = 0;
  for (int step = 0; step < budget; ++step) {
    Entry best = empty_entry();
#pragma unroll
    for (int j = 0; j < kSlotsPerThread; ++j) {
      if (precedes(slots[j], best)) best = slots[j];
    }
    best = warp_best(best);
    if (lane == 0) warp_winners[warp] = best;
    __syncthreads();
    if (warp == 0) {
      best = warp_best(lane < warps ? warp_winners[lane] : empty_entry());
      if (lane == 0) popped = best;
    }
    __syncthreads();
    const Entry p = popped;
    if (p.slot < 0) break;  // the frontier ran dry (tiny vocabulary and depth)
    const int node = step + 1;
    count = node;
    if (threadIdx.x == 0) {
      node_score[node] = p.score;
      node_parent[node] = p.parent;
      node_depth_rank[step] = (p.depth << 16) | p.rank;
    }
    const bool more = node < budget;  // pushes of the last pop could never be popped
    const int sibling_slot = 1 + 2 * step, child_slot = 2 + 2 * step;
#pragma unroll
    for (int j = 0; j < kSlotsPerThread; ++j) {
      const int slot = j * blockDim.x + threadIdx.x;
      if (slot == p.slot) slots[j].slot = -1;
      if (more && slot == sibling_slot && p.rank + 1 < k) {
        Entry e = p;
        // From the parent's score, never logw - lp[r] + lp[r + 1]: -inf must not turn into NaN.
        e.score = node_score[p.parent] + static_cast<double>(lp[(p.depth - 1) * k_max + p.rank + 1]);
        set_level(e.path, p.depth - 1, p.rank + 2);
        e.rank = p.rank + 1;
        e.slot = slot;
        slots[j] = e;
      }
      if (more && slot == child_slot && p.depth < depth_limit) {
        Entry e = p;
        e.score = p.score + static_cast<double>(lp[p.depth * k_max]);
        set_level(e.path, p.depth, 1);
        e.parent = node;
        e.depth = p.depth + 1;
        e.rank = 0;
        e.slot = slot;
        slots[j] = e;
      }
    }
  }
  __syncthreads();
  const int64_t* ids = top_ids + request * table;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int depth = node_depth_rank[i] >> 16, rank = node_depth_rank[i] & 0xffff;
    token_ids[request * width + i] = ids[(depth - 1) * k_max + rank];
    depths[request * width + i] = depth;
    ranks[request * width + i] = rank;
    scores[request * width + i] = node_score[i + 1];
    parents[request * (width + 1) + i + 1] = node_parent[i + 1];
  }
  if (threadIdx.x == 0) num_nodes[request] = count;
}

// The [L, K] table takes up to 64 KiB of dynamic shared memory: above the default 48 KiB, so opt in once per
// device (before any graph capture, on the first call).
void allow_log_prob_table(int device) {
  static std::once_flag flags[64];
  std::call_once(flags[device % 64], [] {
    C10_CUDA_CHECK(cudaFuncSetAttribute(build_tree_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kMaxDepth * kMaxBudget * sizeof(float))));
  });
}

}  // namespace

std::vector<at::Tensor> build_tree_cuda(const at::Tensor& log_probs, const at::Tensor& top_ids,
                                        const at::Tensor& budgets, int64_t max_budget) {
  check_cuda(log_probs, "log_probs");
  check_cuda(top_ids, "top_ids");
  check_cuda(budgets, "budgets");
  TORCH_CHECK(log_probs.dim() == 3 && log_probs.sizes() == top_ids.sizes(), "log_probs and top_ids must be [B, L, K]");
  TORCH_CHECK(log_probs.scalar_type() == at::kFloat, "log_probs must be float32");
  TORCH_CHECK(top_ids.scalar_type() == at::kLong, "top_ids must be int64");
  TORCH_CHECK(budgets.dim() == 1 && budgets.size(0) == log_probs.size(0), "budgets must be [B]");
  TORCH_CHECK(max_budget >= 0 && max_budget <= kMaxBudget, "max_budget must be in [0, ", kMaxBudget, "]");
  TORCH_CHECK(log_probs.size(1) <= kMaxDepth, "depth must be at most ", kMaxDepth);
  TORCH_CHECK(log_probs.size(2) <= kMaxBudget, "top-k width must be at most ", kMaxBudget);
  const c10::cuda::CUDAGuard guard(log_probs.device());
  const int64_t batch = log_probs.size(0);
  const auto long_options = log_probs.options().dtype(at::kLong);
  at::Tensor token_ids = at::empty({batch, max_budget}, long_options);
  at::Tensor depths = at::empty({batch, max_budget}, long_options);
  at::Tensor parents = at::empty({batch, max_budget + 1}, long_options);
  at::Tensor scores = at::empty({batch, max_budget}, log_probs.options().dtype(at::kDouble));
  at::Tensor ranks = at::empty({batch, max_budget}, long_options);
  at::Tensor num_nodes = at::empty({batch}, long_options);
  if (batch > 0) {
    const at::Tensor lp = log_probs.contiguous();
    const at::Tensor ids = top_ids.contiguous();
    const at::Tensor budget_long = budgets.to(at::kLong).contiguous();
    // Slots 0 .. 2 * max_budget - 2 are ever written; each thread owns kSlotsPerThread of them.
    const int threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, ((max_budget + 31) / 32) * 32)));
    const size_t table_bytes = static_cast<size_t>(log_probs.size(1)) * log_probs.size(2) * sizeof(float);
    allow_log_prob_table(log_probs.device().index());
    build_tree_kernel<<<static_cast<unsigned>(batch), threads, table_bytes, c10::cuda::getCurrentCUDAStream()>>>(
        lp.data_ptr<float>(), ids.data_ptr<int64_t>(), budget_long.data_ptr<int64_t>(),
        static_cast<int>(log_probs.size(1)), static_cast<int>(log_probs.size(2)), static_cast<int>(max_budget),
        token_ids.data_ptr<int64_t>(), depths.data_ptr<int64_t>(), parents.data_ptr<int64_t>(),
        scores.data_ptr<double>(), ranks.data_ptr<int64_t>(), num_nodes.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {token_ids, depths, parents, scores, ranks, num_nodes};
}

}  // namespace ddtree
