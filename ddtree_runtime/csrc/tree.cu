// Best-first DDTree construction from per-depth top-K log-probabilities, one block per request.
//
// Two paths give the same trees. The threshold path (tree_threshold.cuh) grows the tree level by level with
// the whole block and sorts it; it runs when every row is nonincreasing and <= 0 and the kept set fits the
// shared memory. Otherwise the sequential pop loop below runs.
//
// The pop loop runs in one warp. The frontier lives in shared memory as slots of (64-bit score key, packed
// parent/depth/rank); lane l owns slots l, l + 32, ... and keeps the best of them in registers. A pop is a
// warp arg-max of the lanes' bests on the score key (two __reduce_max_sync), with the rank path consulted
// only when scores tie exactly; the winning lane then rescans its own slots. A pop's first push reuses the
// popped slot and the second is appended, so at most budget + 1 slots exist. The order (float64 score desc,
// rank path asc) equals the Python heap's pop order exactly.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common.cuh"

namespace ddtree {
namespace {

constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kPathWords = kMaxDepth / 4;
constexpr uint64_t kSignBit = uint64_t{1} << 63;

// Order-preserving map of a float64 score to uint64 (larger score -> larger key); -0.0 folds onto +0.0.
// Key 0 would be a NaN pattern that the scores never take, so it marks an empty slot.
__device__ __forceinline__ uint64_t score_key(double score) {
  uint64_t bits = static_cast<uint64_t>(__double_as_longlong(score));
  if (bits == kSignBit) bits = 0;
  return (bits & kSignBit) ? ~bits : (bits | kSignBit);
}

__device__ __forceinline__ double key_score(uint64_t key) {
  const uint64_t bits = (key & kSignBit) ? (key & ~kSignBit) : ~key;
  return __longlong_as_double(static_cast<long long>(bits));
}

#include "tree_threshold.cuh"

// A frontier entry's node-to-be: parent node (< 2^16), depth (1..16) and rank (< 1024).
__device__ __forceinline__ uint32_t pack_entry(int parent, int depth, int rank) {
  return (static_cast<uint32_t>(parent) << 16) | (static_cast<uint32_t>(depth) << 10) | static_cast<uint32_t>(rank);
}
__device__ __forceinline__ int entry_parent(uint32_t e) { return static_cast<int>(e >> 16); }
__device__ __forceinline__ int entry_depth(uint32_t e) { return static_cast<int>((e >> 10) & 0x3fu); }
__device__ __forceinline__ int entry_rank(uint32_t e) { return static_cast<int>(e & 0x3ffu); }

// Word `word` of a rank path holding only `value` at `level`. Paths store rank + 1 per level (0 = absent),
// 16 bits per level, most significant level first, so comparing words orders paths as tuples do.
__device__ __forceinline__ uint64_t level_bits(int word, int level, int value) {
  return word == (level >> 2) ? static_cast<uint64_t>(value) << ((3 - (level & 3)) * 16) : uint64_t{0};
}

// Rank path of an entry ascending: its parent's path plus its own rank at level depth - 1. All eight words
// are loaded before any comparison, so the loads overlap instead of waiting on each other.
__device__ bool path_less(uint32_t a, uint32_t b, const uint64_t* __restrict__ node_path) {
  const uint64_t* pa = node_path + entry_parent(a) * kPathWords;
  const uint64_t* pb = node_path + entry_parent(b) * kPathWords;
  uint64_t wa[kPathWords], wb[kPathWords];
#pragma unroll
  for (int w = 0; w < kPathWords; ++w) {
    wa[w] = pa[w] | level_bits(w, entry_depth(a) - 1, entry_rank(a) + 1);
    wb[w] = pb[w] | level_bits(w, entry_depth(b) - 1, entry_rank(b) + 1);
  }
#pragma unroll
  for (int w = 0; w < kPathWords; ++w) {
    if (wa[w] != wb[w]) return wa[w] < wb[w];
  }
  return false;
}

// The sequential path's shared memory, carved from the region after the log-prob table (8-byte arrays first).
struct TreeSmem {
  double* node_score;    // [max_budget + 1], node 0 = root
  uint64_t* node_path;   // [(max_budget + 1) * kPathWords]
  uint64_t* slot_key;    // [max_budget + 1]
  int* node_parent;      // [max_budget + 1]
  int* node_depth_rank;  // [max_budget], depth << 16 | rank of node i + 1
  uint32_t* slot_entry;  // [max_budget + 1]
  const float* lp;       // [L * K], the table before the region
};

__host__ __device__ inline size_t sequential_region_bytes(int max_budget) {
  const size_t nodes = static_cast<size_t>(max_budget) + 1;
  return nodes * (sizeof(double) + kPathWords * sizeof(uint64_t) + sizeof(uint64_t) + sizeof(int) + sizeof(int) +
                  sizeof(uint32_t));
}

// The log-prob table, rounded up so that the region after it is 16-byte aligned.
__host__ __device__ inline size_t table_bytes(int64_t table) {
  return (static_cast<size_t>(table) * sizeof(float) + 15) / 16 * 16;
}

__host__ __device__ inline size_t region_bytes(int max_budget, int capacity) {
  const size_t kept = static_cast<size_t>(capacity) * kBytesPerKept;
  const size_t sequential = sequential_region_bytes(max_budget);
  return kept > sequential ? kept : sequential;
}

__device__ TreeSmem carve(unsigned char* region, int max_budget, const float* lp) {
  const size_t nodes = static_cast<size_t>(max_budget) + 1;
  TreeSmem s;
  s.node_score = reinterpret_cast<double*>(region);
  s.node_path = reinterpret_cast<uint64_t*>(s.node_score + nodes);
  s.slot_key = s.node_path + nodes * kPathWords;
  s.node_parent = reinterpret_cast<int*>(s.slot_key + nodes);
  s.node_depth_rank = s.node_parent + nodes;
  s.slot_entry = reinterpret_cast<uint32_t*>(s.node_depth_rank + nodes);
  s.lp = lp;
  return s;
}

// Lane-local best of one slot vs the current best (key desc, then rank path asc).
__device__ __forceinline__ void consider_slot(int slot, const TreeSmem& s, uint64_t& best_key, int& best_slot) {
  const uint64_t key = s.slot_key[slot];
  if (key > best_key ||
      (key == best_key && key != 0 && path_less(s.slot_entry[slot], s.slot_entry[best_slot], s.node_path))) {
    best_key = key;
    best_slot = slot;
  }
}

// A lane's best slot from scratch. The scan keeps the largest key, its first slot and whether another slot
// ties it, with selects only, so the independent loads pipeline; exact ties then rescan by rank path.
__device__ __forceinline__ void rescan_own_slots(int lane, int slot_count, const TreeSmem& s, uint64_t& best_key,
                                                 int& best_slot) {
  uint64_t top = 0;
  int first = -1;
  bool tie = false;
#pragma unroll 4
  for (int i = lane; i < slot_count; i += 32) {
    const uint64_t key = s.slot_key[i];
    tie = key == top ? true : (key > top ? false : tie);
    first = key > top ? i : first;
    top = key > top ? key : top;
  }
  best_key = top;
  best_slot = top == 0 ? -1 : first;
  if (top == 0 || !tie) return;
  for (int i = first + 32; i < slot_count; i += 32) {
    if (s.slot_key[i] == top && path_less(s.slot_entry[i], s.slot_entry[best_slot], s.node_path)) best_slot = i;
  }
}

// Warp 0: the pops. Returns the number of nodes popped (same value in every lane).
__device__ int pop_loop(const TreeSmem& s, int budget, int k, int depth_limit, int k_max) {
  const int lane = threadIdx.x;
  uint64_t best_key = 0;
  int best_slot = -1;
  int slot_count = 0;
  if (lane < kPathWords) s.node_path[lane] = 0;
  if (lane == 0) s.node_score[0] = 0.0;
  if (budget > 0 && depth_limit > 0 && k_max > 0) {
    slot_count = 1;
    if (lane == 0) {
      best_key = score_key(0.0 + static_cast<double>(s.lp[0]));
      best_slot = 0;
      s.slot_key[0] = best_key;
      s.slot_entry[0] = pack_entry(0, 1, 0);
    }
  }
  __syncwarp();
  int count = 0;
  for (int step = 0; step < budget; ++step) {
    const uint32_t hi = __reduce_max_sync(kFullWarp, static_cast<uint32_t>(best_key >> 32));
    const uint32_t lo =
        __reduce_max_sync(kFullWarp, static_cast<uint32_t>(best_key >> 32) == hi ? static_cast<uint32_t>(best_key) : 0u);
    const uint64_t top = (static_cast<uint64_t>(hi) << 32) | lo;
    if (top == 0) break;  // the frontier ran dry (tiny vocabulary and depth)
    uint32_t tied = __ballot_sync(kFullWarp, best_key == top);
    int winner = __ffs(tied) - 1;
    int slot = __shfl_sync(kFullWarp, best_slot, winner);
    for (tied &= tied - 1; tied != 0; tied &= tied - 1) {  // exact score ties across lanes: rank paths decide
      const int other = __ffs(tied) - 1;
      const int other_slot = __shfl_sync(kFullWarp, best_slot, other);
      if (path_less(s.slot_entry[other_slot], s.slot_entry[slot], s.node_path)) {
        winner = other;
        slot = other_slot;
      }
    }
    const uint32_t entry = s.slot_entry[slot];
    const int parent = entry_parent(entry), depth = entry_depth(entry), rank = entry_rank(entry);
    const double score = key_score(top);
    const int node = step + 1;
    count = node;
    const bool more = node < budget;  // pushes of the last pop could never be popped
    const bool has_sibling = more && rank + 1 < k;
    const bool has_child = more && depth < depth_limit;
    // Every read of this pop happens before the __syncwarp below, every write after it.
    const uint64_t path_word =
        lane < kPathWords ? s.node_path[parent * kPathWords + lane] | level_bits(lane, depth - 1, rank + 1) : 0;
    uint64_t first_key = 0;
    uint32_t first_entry = 0;
    uint64_t child_key = 0;
    if (has_child) child_key = score_key(score + static_cast<double>(s.lp[depth * k_max]));
    if (has_sibling) {
      // From the parent's score, never logw - lp[r] + lp[r + 1]: -inf must not turn into NaN.
      first_key = score_key(s.node_score[parent] + static_cast<double>(s.lp[(depth - 1) * k_max + rank + 1]));
      first_entry = pack_entry(parent, depth, rank + 1);
    } else if (has_child) {
      first_key = child_key;
      first_entry = pack_entry(node, depth + 1, 0);
    }
    __syncwarp();
    if (lane == 0) {
      s.node_score[node] = score;
      s.node_parent[node] = parent;
      s.node_depth_rank[step] = (depth << 16) | rank;
    }
    if (lane < kPathWords) s.node_path[node * kPathWords + lane] = path_word;
    if (lane == winner) {
      s.slot_key[slot] = first_key;
      s.slot_entry[slot] = first_entry;
    }
    const bool append = has_sibling && has_child;
    const int appended = slot_count;
    if (append) {
      ++slot_count;
      if (lane == (appended & 31)) {
        s.slot_key[appended] = child_key;
        s.slot_entry[appended] = pack_entry(node, depth + 1, 0);
      }
    }
    __syncwarp();
    if (lane == winner) {
      rescan_own_slots(lane, slot_count, s, best_key, best_slot);
    } else if (append && lane == (appended & 31)) {
      consider_slot(appended, s, best_key, best_slot);
    }
    __syncwarp();
  }
  return count;
}

// Every row's first k log-probs are NaN-free, start <= 0 and never increase (what the threshold path needs).
__device__ bool rows_allow_threshold(const float* lp, int depth_limit, int k, int k_max) {
  bool bad = false;
  for (int i = threadIdx.x; i < depth_limit * k; i += kThreads) {
    const int d = i / k, r = i % k;
    const float value = lp[d * k_max + r];
    bad |= !(value <= (r == 0 ? 0.0f : lp[d * k_max + r - 1]));  // NaN fails every comparison
  }
  return __syncthreads_or(bad) == 0;
}

struct TreeOutputs {
  int64_t* token_ids;
  int64_t* depths;
  int64_t* parents;
  double* scores;
  int64_t* ranks;
  int64_t* num_nodes;
};

// Writes the threshold path's tree: kept node i is node position[i] + 1 when that position is < budget.
__device__ void write_threshold_tree(const KeptSmem& kept, int size, const int* position, int budget,
                                     const int64_t* ids, int k_max, int64_t request, int64_t width,
                                     const TreeOutputs& out) {
  const int count = min(budget, size);
  for (int i = threadIdx.x; i < size; i += kThreads) {
    const int slot = position[i];
    if (slot >= count) continue;
    const uint32_t meta = kept.meta[i];
    const int depth = kept_depth(meta), rank = kept_rank(meta), parent = kept_parent(meta);
    out.token_ids[request * width + slot] = ids[(depth - 1) * k_max + rank];
    out.depths[request * width + slot] = depth;
    out.ranks[request * width + slot] = rank;
    out.scores[request * width + slot] = key_score(kept.key[i]);
    out.parents[request * (width + 1) + slot + 1] = parent >= 0 ? position[parent] + 1 : 0;
  }
  for (int slot = count + static_cast<int>(threadIdx.x); slot < width; slot += kThreads) {
    out.token_ids[request * width + slot] = kNoNode;
    out.depths[request * width + slot] = 0;
    out.ranks[request * width + slot] = kNoNode;
    out.scores[request * width + slot] = -INFINITY;
    out.parents[request * (width + 1) + slot + 1] = kNoNode;
  }
  if (threadIdx.x == 0) {
    out.parents[request * (width + 1)] = kNoNode;
    out.num_nodes[request] = count;
  }
}

// Writes the sequential path's tree from the popped nodes.
__device__ void write_sequential_tree(const TreeSmem& s, int count, const int64_t* ids, int k_max, int64_t request,
                                      int64_t width, const TreeOutputs& out) {
  for (int i = threadIdx.x; i < width; i += kThreads) {
    const bool real = i < count;
    const int depth = real ? s.node_depth_rank[i] >> 16 : 0;
    const int rank = real ? s.node_depth_rank[i] & 0xffff : 0;
    out.token_ids[request * width + i] = real ? ids[(depth - 1) * k_max + rank] : kNoNode;
    out.depths[request * width + i] = depth;
    out.ranks[request * width + i] = real ? rank : kNoNode;
    out.scores[request * width + i] = real ? s.node_score[i + 1] : -INFINITY;
  }
  for (int i = threadIdx.x; i <= width; i += kThreads) {
    out.parents[request * (width + 1) + i] = (i >= 1 && i <= count) ? s.node_parent[i] : kNoNode;
  }
  if (threadIdx.x == 0) out.num_nodes[request] = count;
}

__global__ void __launch_bounds__(kThreads) build_tree_kernel(
    const float* __restrict__ log_probs, const int64_t* __restrict__ top_ids, const int64_t* __restrict__ budgets,
    int depth_limit, int k_max, int max_budget, int capacity, bool stage_table, TreeOutputs out) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ ThresholdScratch scratch;
  __shared__ int popped;
  const int64_t table = static_cast<int64_t>(depth_limit) * k_max;
  const int64_t request = blockIdx.x;
  // The log-prob table is read many times: staged in shared memory when it fits beside the region, else read
  // where it is (same values, slower; a GPU with less shared memory at the widest tables).
  float* staged = reinterpret_cast<float*>(smem);
  unsigned char* region = smem + (stage_table ? table_bytes(table) : 0);
  if (stage_table) {
    for (int64_t i = threadIdx.x; i < table; i += blockDim.x) staged[i] = log_probs[request * table + i];
  }
  const float* lp = stage_table ? staged : log_probs + request * table;
  const int64_t requested = budgets[request];
  const int budget = requested < 0 ? 0 : static_cast<int>(requested > max_budget ? max_budget : requested);
  const int k = min(max(budget, 1), k_max);
  const int64_t* ids = top_ids + request * table;
  __syncthreads();
  const bool threshold = budget >= kThresholdMinBudget && capacity > 0 && depth_limit > 0 && k_max > 0 &&
                         rows_allow_threshold(lp, depth_limit, k, k_max);
  if (threshold) {
    const KeptSmem kept = carve_kept(region, capacity);
    int size = 0;
    const int* position = nullptr;
    if (grow_threshold_tree(kept, lp, k_max, depth_limit, budget, k, scratch, size, position)) {
      write_threshold_tree(kept, size, position, budget, ids, k_max, request, max_budget, out);
      return;
    }
    __syncthreads();  // the pop loop reuses the region
  }
  const TreeSmem s = carve(region, max_budget, lp);
  if (threadIdx.x < 32) {
    const int count = pop_loop(s, budget, k, depth_limit, k_max);
    if (threadIdx.x == 0) popped = count;
  }
  __syncthreads();
  write_sequential_tree(s, popped, ids, k_max, request, max_budget, out);
}

// The device's opt-in shared memory per block, less the kernel's static shared memory; set as the kernel's
// dynamic limit once per device (before any graph capture, on the first call).
int dynamic_smem_limit(int device) {
  static std::once_flag flags[64];
  static int limits[64];
  std::call_once(flags[device % 64], [device] {
    const int limit = dynamic_smem_room(smem_optin_bytes(device), build_tree_kernel);
    C10_CUDA_CHECK(cudaFuncSetAttribute(build_tree_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
    limits[device % 64] = limit;
  });
  return limits[device % 64];
}

// DDTREE_TREE_PATH=sequential disables the threshold path (for benchmarks and diagnosis); read once.
bool threshold_path_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("DDTREE_TREE_PATH");
    return value == nullptr || std::string(value) != "sequential";
  }();
  return enabled;
}

// The kept-set capacity that fits beside the staged table: as large as allowed up to kMaxKept, a multiple of 32.
int kept_capacity(int limit, size_t staged_bytes) {
  if (!threshold_path_enabled()) return 0;
  const int64_t room = (static_cast<int64_t>(limit) - static_cast<int64_t>(staged_bytes)) /
                       static_cast<int64_t>(kBytesPerKept);
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(kMaxKept, room)) / 32 * 32);
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
    const int64_t table = log_probs.size(1) * log_probs.size(2);
    const int limit = dynamic_smem_limit(log_probs.device().index());
    const size_t sequential = sequential_region_bytes(static_cast<int>(max_budget));
    const bool stage_table = table_bytes(table) + sequential <= static_cast<size_t>(limit);
    const size_t staged_bytes = stage_table ? table_bytes(table) : 0;
    const int capacity = kept_capacity(limit, staged_bytes);
    const size_t smem = staged_bytes + region_bytes(static_cast<int>(max_budget), capacity);
    TORCH_CHECK(smem <= static_cast<size_t>(limit), "build_tree needs ", smem, " bytes of shared memory per block, ",
                "this GPU allows ", limit, " (lower max_budget)");
    const TreeOutputs out{token_ids.data_ptr<int64_t>(), depths.data_ptr<int64_t>(), parents.data_ptr<int64_t>(),
                          scores.data_ptr<double>(), ranks.data_ptr<int64_t>(), num_nodes.data_ptr<int64_t>()};
    build_tree_kernel<<<static_cast<unsigned>(batch), kThreads, smem, c10::cuda::getCurrentCUDAStream()>>>(
        lp.data_ptr<float>(), ids.data_ptr<int64_t>(), budget_long.data_ptr<int64_t>(),
        static_cast<int>(log_probs.size(1)), static_cast<int>(log_probs.size(2)), static_cast<int>(max_budget),
        capacity, stage_table, out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {token_ids, depths, parents, scores, ranks, num_nodes};
}

}  // namespace ddtree
