// The parallel "threshold" path of the tree kernel; ddtree_runtime/tree_threshold.py is its numpy model (same
// steps, same capacity and fallback decisions) and explains why it is exact. In short: with nonincreasing rows
// <= 0, best-first popping equals sorting the prefix lattice by (score desc, rank path asc), and any bound
// `beta` at most the B-th largest score key of some B prefixes keeps every tree node and its ancestors. So
// the block grows the lattice level by level, keeping the children whose key is >= beta, raises beta by a
// radix select (and compacts) only when the kept set would outgrow its shared-memory capacity, and finally
// sorts the kept set. When the kept set cannot fit, the caller runs the sequential pop loop instead.
//
// Included once, by tree.cu, inside namespace ddtree::{anonymous}; uses its score_key / key_score.
#pragma once

constexpr int kThreads = 512;  // threads per block of the tree kernel
constexpr int kWarps = kThreads / 32;
constexpr int kMaxKept = 4096;            // kept-set capacity ceiling (the host may grant less)
// Smaller budgets take the sequential loop: on an H200 it measured 9.6 / 35 us at budgets 16 / 64 against the
// threshold path's 31 / 37 us, and 152 us at 256 against 72 us (docs/benchmarks.md, fourth version).
constexpr int kThresholdMinBudget = 96;
constexpr int kSelectPasses = 3;          // 8-bit radix digits per selection: a bound within 24 key bits
constexpr int kVirtualLimit = 8 * kMaxKept;  // most would-be children enumerated for one selection
constexpr int kCountingRankLimit = 384;   // up to this many kept nodes are ranked by counting, not sorted
constexpr int kKeptPathWords = 3;         // rank paths: 10 bits per level, 6 levels per word
constexpr int kLevelsPerWord = 6;
constexpr int kRankBits = 10;
// Shared-memory bytes per kept node: key, rank path, packed parent/depth/rank and one int of scratch.
constexpr size_t kBytesPerKept = sizeof(uint64_t) * (1 + kKeptPathWords) + sizeof(uint32_t) + sizeof(int);

// Fixed scratch of the threshold path, in static shared memory.
struct ThresholdScratch {
  unsigned long long bin_min[256];
  int hist[256];
  int warp_sums[kWarps];
  int value[4];
};

// The kept set, carved from the dynamic shared memory after the log-prob table.
struct KeptSmem {
  uint64_t* key;
  uint64_t* path;   // [capacity * kKeptPathWords]
  uint32_t* meta;   // (parent + 1) << 15 | depth << 10 | rank; parent is a kept index, -1 = root
  int* scratch;     // per kept node or per parent: child offsets, new indices, ranks, sort order
  int capacity;
};

__device__ __forceinline__ KeptSmem carve_kept(unsigned char* base, int capacity) {
  KeptSmem s;
  s.key = reinterpret_cast<uint64_t*>(base);
  s.path = s.key + capacity;
  s.meta = reinterpret_cast<uint32_t*>(s.path + static_cast<size_t>(capacity) * kKeptPathWords);
  s.scratch = reinterpret_cast<int*>(s.meta + capacity);
  s.capacity = capacity;
  return s;
}

__device__ __forceinline__ uint32_t pack_kept(int parent, int depth, int rank) {
  return (static_cast<uint32_t>(parent + 1) << 15) | (static_cast<uint32_t>(depth) << 10) | static_cast<uint32_t>(rank);
}
__device__ __forceinline__ int kept_parent(uint32_t m) { return static_cast<int>(m >> 15) - 1; }
__device__ __forceinline__ int kept_depth(uint32_t m) { return static_cast<int>((m >> 10) & 0x1fu); }
__device__ __forceinline__ int kept_rank(uint32_t m) { return static_cast<int>(m & 0x3ffu); }

// The parents of the level being grown: the root (first level) or the kept nodes [first, first + count).
struct Parents {
  int first;
  int count;
  bool root;
};

__device__ __forceinline__ double parent_score(const KeptSmem& s, const Parents& p, int i) {
  return p.root ? 0.0 : key_score(s.key[p.first + i]);
}

// Exclusive prefix sum over the block of one value per thread; `total` receives the sum. The caller must
// separate two calls with a barrier (warp_sums is reused).
__device__ int block_exclusive_scan(int value, ThresholdScratch& x, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += y;
  }
  if (lane == 31) x.warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kWarps ? x.warp_sums[lane] : 0;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += y;
    }
    if (lane < kWarps) x.warp_sums[lane] = w;
  }
  __syncthreads();
  total = x.warp_sums[kWarps - 1];
  return (warp == 0 ? 0 : x.warp_sums[warp - 1]) + inclusive - value;
}

// How many leading ranks of `row` give a child key >= beta (the keys fall with the rank).
__device__ __forceinline__ int count_children(double score, const float* row, int k, uint64_t beta) {
  int low = 0, high = k;
  while (low < high) {
    const int mid = (low + high) >> 1;
    if (score_key(score + static_cast<double>(row[mid])) >= beta) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
}

// A contiguous chunk of [0, n) per thread, so that per-thread sums scan into ordered offsets.
__device__ __forceinline__ void thread_chunk(int n, int& begin, int& end) {
  const int per = (n + kThreads - 1) / kThreads;
  begin = min(n, static_cast<int>(threadIdx.x) * per);
  end = min(n, begin + per);
}

// scratch[i] = first child slot of parent i; returns the number of children (same in every thread).
__device__ int child_offsets(const KeptSmem& s, const Parents& p, const float* row, int k, uint64_t beta,
                             ThresholdScratch& x) {
  int begin, end;
  thread_chunk(p.count, begin, end);
  int local = 0;
  for (int i = begin; i < end; ++i) {
    const int c = count_children(parent_score(s, p, i), row, k, beta);
    s.scratch[i] = c;
    local += c;
  }
  int total;
  int offset = block_exclusive_scan(local, x, total);
  for (int i = begin; i < end; ++i) {
    const int c = s.scratch[i];
    s.scratch[i] = offset;
    offset += c;
  }
  __syncthreads();
  return total;
}

// Child slot j's parent (the last parent whose first slot is <= j) and rank.
__device__ __forceinline__ void child_of_slot(const KeptSmem& s, const Parents& p, int j, int& parent, int& rank) {
  int low = 0, high = p.count - 1;
  while (low < high) {
    const int mid = (low + high + 1) >> 1;
    if (s.scratch[mid] <= j) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  parent = low;
  rank = j - s.scratch[low];
}

__device__ __forceinline__ uint64_t child_key(const KeptSmem& s, const Parents& p, const float* row, int j) {
  int parent, rank;
  child_of_slot(s, p, j, parent, rank);
  return score_key(parent_score(s, p, parent) + static_cast<double>(row[rank]));
}

__device__ __forceinline__ void add_to_histogram(uint64_t key, int shift, uint64_t prefix, ThresholdScratch& x) {
  if (shift < 56 && (key >> (shift + 8)) != (prefix >> (shift + 8))) return;
  const int digit = static_cast<int>((key >> shift) & 0xffu);
  atomicAdd(&x.hist[digit], 1);
  atomicMin(&x.bin_min[digit], static_cast<unsigned long long>(key));
}

// Warp 0: the digit bin (scanned from the largest) that holds the remaining-th key. Writes value[0] = bin
// (-1 when fewer keys exist), value[1] = keys in larger bins.
__device__ void choose_bin(int remaining, ThresholdScratch& x) {
  const int lane = threadIdx.x;
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += x.hist[255 - 8 * lane - i];
  int inclusive = sum;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += y;
  }
  const unsigned reached = __ballot_sync(0xffffffffu, inclusive >= remaining);
  if (reached == 0) {
    if (lane == 0) x.value[0] = -1;
    return;
  }
  if (lane == __ffs(reached) - 1) {
    int above = inclusive - sum;
    for (int i = 0; i < 8; ++i) {
      const int bin = 255 - 8 * lane - i;
      if (above + x.hist[bin] >= remaining) {
        x.value[0] = bin;
        x.value[1] = above;
        break;
      }
      above += x.hist[bin];
    }
  }
}

// A bound with at least `rank` keys >= it and at most the rank-th largest key, over the kept keys >= beta
// plus, when `children` > 0, the would-be children of `p` (slots from child_offsets). 0 when too few keys.
__device__ uint64_t select_bound(const KeptSmem& s, int n, uint64_t beta, int rank, const Parents& p,
                                 const float* row, int children, ThresholdScratch& x) {
  uint64_t prefix = 0, bound = 0;
  int remaining = rank;
  for (int pass = 0; pass < kSelectPasses; ++pass) {
    const int shift = 56 - 8 * pass;
    if (threadIdx.x < 256) {
      x.hist[threadIdx.x] = 0;
      x.bin_min[threadIdx.x] = ~0ull;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const uint64_t key = s.key[i];
      if (key >= beta) add_to_histogram(key, shift, prefix, x);
    }
    for (int j = threadIdx.x; j < children; j += kThreads) add_to_histogram(child_key(s, p, row, j), shift, prefix, x);
    __syncthreads();
    if (threadIdx.x < 32) choose_bin(remaining, x);
    __syncthreads();
    const int bin = x.value[0];
    if (bin < 0) return 0;
    const int above = x.value[1];
    const bool closes = above + x.hist[bin] == remaining;
    bound = x.bin_min[bin];
    prefix |= static_cast<uint64_t>(bin) << shift;
    remaining -= above;
    __syncthreads();  // every thread has read the histogram before the next pass clears it
    if (closes) break;
  }
  return bound;
}

// Drops the kept nodes with key < beta in place, keeping order, and remaps parents; the parents of the level
// being grown (the tail) follow. Returns the new size.
__device__ int compact(const KeptSmem& s, int n, uint64_t beta, Parents& p, ThresholdScratch& x) {
  int begin, end;
  thread_chunk(n, begin, end);
  int local = 0, local_tail = 0;
  for (int i = begin; i < end; ++i) {
    const bool live = s.key[i] >= beta;
    local += live;
    local_tail += live && !p.root && i >= p.first;
  }
  if (threadIdx.x == 0) x.value[2] = 0;
  int total;
  int next = block_exclusive_scan(local, x, total);
  if (local_tail > 0) atomicAdd(&x.value[2], local_tail);
  for (int i = begin; i < end; ++i) s.scratch[i] = s.key[i] >= beta ? next++ : -1;
  __syncthreads();
  // Rounds of kThreads nodes: a node only moves down, onto slots whose old nodes were read in an earlier round.
  for (int round = 0; round < n; round += kThreads) {
    const int i = round + static_cast<int>(threadIdx.x);
    const int dest = i < n ? s.scratch[i] : -1;
    uint64_t key = 0, path[kKeptPathWords];
    uint32_t meta = 0;
    if (dest >= 0) {
      key = s.key[i];
#pragma unroll
      for (int w = 0; w < kKeptPathWords; ++w) path[w] = s.path[i * kKeptPathWords + w];
      meta = s.meta[i];
      const int parent = kept_parent(meta);
      meta = pack_kept(parent >= 0 ? s.scratch[parent] : -1, kept_depth(meta), kept_rank(meta));
    }
    __syncthreads();
    if (dest >= 0) {
      s.key[dest] = key;
#pragma unroll
      for (int w = 0; w < kKeptPathWords; ++w) s.path[dest * kKeptPathWords + w] = path[w];
      s.meta[dest] = meta;
    }
    __syncthreads();
  }
  if (!p.root) {
    p.count = x.value[2];
    p.first = total - p.count;
  }
  __syncthreads();  // value[2] is read before anyone reuses it
  return total;
}

// Appends the children of `p` (slots from child_offsets) at [n, n + children).
__device__ void append_children(const KeptSmem& s, int n, const Parents& p, const float* row, int depth,
                                int children) {
  const int level = depth - 1;
  const int word = level / kLevelsPerWord;
  const int shift = (kLevelsPerWord - 1 - level % kLevelsPerWord) * kRankBits;
  for (int j = threadIdx.x; j < children; j += kThreads) {
    int parent, rank;
    child_of_slot(s, p, j, parent, rank);
    const int dest = n + j;
    s.key[dest] = score_key(parent_score(s, p, parent) + static_cast<double>(row[rank]));
    const int parent_index = p.root ? -1 : p.first + parent;
    s.meta[dest] = pack_kept(parent_index, depth, rank);
#pragma unroll
    for (int w = 0; w < kKeptPathWords; ++w) {
      const uint64_t inherited = parent_index >= 0 ? s.path[parent_index * kKeptPathWords + w] : 0;
      s.path[dest * kKeptPathWords + w] = inherited | (w == word ? static_cast<uint64_t>(rank) << shift : 0);
    }
  }
  __syncthreads();
}

// Node a precedes node b in the tree order: score key desc, then rank path asc (a prefix first).
__device__ __forceinline__ bool precedes(const KeptSmem& s, int a, int b) {
  const uint64_t ka = s.key[a], kb = s.key[b];
  if (ka != kb) return ka > kb;
#pragma unroll
  for (int w = 0; w < kKeptPathWords; ++w) {
    const uint64_t pa = s.path[a * kKeptPathWords + w], pb = s.path[b * kKeptPathWords + w];
    if (pa != pb) return pa < pb;
  }
  return kept_depth(s.meta[a]) < kept_depth(s.meta[b]);
}

// scratch[i] = position of kept node i in the tree order, by counting the nodes that precede it.
__device__ void rank_by_counting(const KeptSmem& s, int n) {
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const uint64_t key = s.key[i];
    int before = 0;
    for (int j = 0; j < n; ++j) {
      const uint64_t other = s.key[j];
      before += other > key || (other == key && j != i && precedes(s, j, i));
    }
    s.scratch[i] = before;
  }
  __syncthreads();
}

// A bitonic sort of kept indices in scratch[0, padded) (a power of two, at most the capacity; -1 pads and
// sorts last), then position[node] = its place in the tree order. `position` overlays the rank paths, which
// the sort no longer needs once it is done.
__device__ int* rank_by_sorting(const KeptSmem& s, int n, int padded) {
  int* order = s.scratch;
  for (int i = threadIdx.x; i < padded; i += kThreads) order[i] = i < n ? i : -1;
  __syncthreads();
  for (int size = 2; size <= padded; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < padded / 2; t += kThreads) {
        const int low = 2 * t - (t & (stride - 1));
        const int high = low + stride;
        const bool tree_order = (low & size) == 0;
        const int a = order[low], b = order[high];
        const bool b_first = b >= 0 && (a < 0 || precedes(s, b, a));
        if (b_first == tree_order) {
          order[low] = b;
          order[high] = a;
        }
      }
      __syncthreads();
    }
  }
  int* position = reinterpret_cast<int*>(s.path);
  for (int i = threadIdx.x; i < n; i += kThreads) position[order[i]] = i;
  __syncthreads();
  return position;
}

// Grows and reads off the tree. Returns false when the kept set cannot fit (the caller then pops
// sequentially); otherwise *size = kept nodes and the returned array maps a kept node to its position in the
// tree order (node number - 1; positions >= budget are not in the tree).
__device__ bool grow_threshold_tree(const KeptSmem& s, const float* lp, int k_max, int depth_limit, int budget,
                                    int k, ThresholdScratch& x, int& size, const int*& position) {
  uint64_t beta = 0;  // below every score key: keep everything until the capacity asks for a bound
  int n = 0;
  Parents p{0, 1, true};
  const float* row = lp;
  for (int depth = 1; depth <= depth_limit; ++depth) {
    row = lp + static_cast<int64_t>(depth - 1) * k_max;
    int children = child_offsets(s, p, row, k, beta, x);
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (n + children <= s.capacity) break;
      if (attempt == 1 && children > kVirtualLimit) break;
      const uint64_t bound = select_bound(s, n, beta, budget, p, row, attempt == 1 ? children : 0, x);
      if (bound > beta) {
        beta = bound;
        n = compact(s, n, beta, p, x);
      }
      children = child_offsets(s, p, row, k, beta, x);
    }
    if (n + children > s.capacity) return false;
    if (children == 0) break;
    append_children(s, n, p, row, depth, children);
    p = Parents{n, children, false};
    n += children;
  }
  if (n > budget) {
    const uint64_t bound = select_bound(s, n, beta, budget, p, row, 0, x);
    if (bound > beta) n = compact(s, n, bound, p, x);
  }
  size = n;
  int padded = 1;
  while (padded < n) padded <<= 1;
  if (n <= kCountingRankLimit || padded > s.capacity) {
    rank_by_counting(s, n);
    position = s.scratch;
  } else {
    position = rank_by_sorting(s, n, padded);
  }
  return true;
}
