// Fused per-depth top-K and log-normaliser over drafter logits.
//
// Chunked path (fewer rows than SMs), two kernels. (1) Each row is cut into chunks of about 8K logits, one block per
// chunk: the block reads its chunk once into shared memory as order-preserving keys while it accumulates the chunk's
// logsumexp partial and the histogram of the top radix digit, then radix-selects the chunk's K largest (value, lower
// token id) pairs from shared memory and writes them, unsorted, as 64-bit composite keys (value key << 32 | ~token
// id, unique per token). (2) One block per row radix-selects the K largest of the chunks' candidates, sorts them
// (bitonic), combines the logsumexp partials and writes the row. Because the composite keys are unique and ordered
// exactly as (logit desc, token id asc), selection needs no tie rule: a chunk's K best contain every one of the row's
// K best that lies in that chunk.
//
// Whole-row path (at least as many rows as SMs, where it measured faster, or a vocabulary too long for the
// chunks' shared memory at this K): one row per block, the first pass split over blocks that add their
// histograms into global scratch when rows are few; radix-select refinement passes over the row, a collect
// pass and shared-memory bitonic sorts.
//
// Histograms are kept per lane (bin * 32 + lane), so the shared-memory atomics of a warp never collide.
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "common.cuh"

namespace ddtree {
namespace {

constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr int kLanes = 32;
constexpr int kTieCapacity = 2048;
constexpr int kMaxWarps = 32;
constexpr int kMaxSplits = 16;
constexpr int kMinSplitLength = 4096;
// Global scratch per row when rows are split: the digit histogram, an arrival counter and the bad-value flag.
constexpr int kScratchWords = kBins + 2;

// Number of leading bits of the float32 key that can differ between values of the input dtype; below them
// all values of one sign share the same bits, so radix passes stop there.
template <typename scalar_t>
struct KeyBits;
template <>
struct KeyBits<float> {
  static constexpr int value = 32;
};
template <>
struct KeyBits<at::BFloat16> {
  static constexpr int value = 16;
};
template <>
struct KeyBits<at::Half> {
  static constexpr int value = 19;
};

// Calls f(index, value) for every element of the row that this thread owns; 16-byte loads when aligned.
template <typename scalar_t, typename F>
__device__ __forceinline__ void for_each_in_row(const scalar_t* __restrict__ row, int64_t vocab, F&& f) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    const int64_t vectors = vocab / kVec;
    const uint4* vrow = reinterpret_cast<const uint4*>(row);
#pragma unroll 4
    for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      const uint4 raw = __ldg(vrow + v);
      const scalar_t* values = reinterpret_cast<const scalar_t*>(&raw);
#pragma unroll
      for (int j = 0; j < kVec; ++j) f(v * kVec + j, static_cast<float>(values[j]));
    }
    done = vectors * kVec;
  }
  for (int64_t i = done + threadIdx.x; i < vocab; i += blockDim.x) f(i, static_cast<float>(row[i]));
}

struct LogSumExp {
  float max;
  float sum;  // sum of exp(x - max)
};

__device__ __forceinline__ LogSumExp combine(LogSumExp a, LogSumExp b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ LogSumExp block_logsumexp(LogSumExp mine, LogSumExp* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    LogSumExp other{__shfl_down_sync(0xffffffffu, mine.max, offset), __shfl_down_sync(0xffffffffu, mine.sum, offset)};
    mine = combine(mine, other);
  }
  if (lane == 0) scratch[warp] = mine;
  __syncthreads();
  LogSumExp total = scratch[0];
  for (int w = 1; w < warps; ++w) total = combine(total, scratch[w]);
  return total;
}

__device__ __forceinline__ float log_normaliser(LogSumExp total) {
  return total.max == -INFINITY ? -INFINITY : total.max + logf(total.sum);
}

// Sums the per-lane copies of bins [0, bins) into `total`; each warp reads 32 different banks per step.
__device__ void merge_lane_histograms(const uint32_t* copies, int bins, uint32_t* total) {
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    uint32_t sum = 0;
#pragma unroll 8
    for (int j = 0; j < kLanes; ++j) sum += copies[b * kLanes + ((j + b) & (kLanes - 1))];
    total[b] = sum;
  }
}

__device__ void zero_words(uint32_t* words, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) words[i] = 0;
}

struct BinChoice {
  int bin;    // digit value of the K-th largest key
  int above;  // elements in higher bins
  int count;  // elements in that bin
};

// Inclusive prefix sum over the lanes of a warp (every lane must call it).
__device__ __forceinline__ int warp_inclusive_sum(int value) {
  const int lane = threadIdx.x & 31;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += up;
  }
  return value;
}

// Warp 0: the bin holding the `needed`-th largest element, scanning bins from the top.
__device__ void choose_bin(const uint32_t* hist, int bins, int needed, BinChoice* out) {
  const int lane = threadIdx.x & 31;
  const int per_lane = (bins + 31) / 32;
  int sum = 0;
  for (int j = 0; j < per_lane; ++j) {
    const int b = bins - 1 - (lane * per_lane + j);
    if (b >= 0) sum += static_cast<int>(hist[b]);
  }
  const int inclusive = warp_inclusive_sum(sum);
  int running = inclusive - sum;
  if (running < needed && needed <= inclusive) {
    for (int j = 0; j < per_lane; ++j) {
      const int b = bins - 1 - (lane * per_lane + j);
      const int c = static_cast<int>(hist[b]);
      if (running + c >= needed) {
        *out = {b, running, c};
        break;
      }
      running += c;
    }
  }
}

__device__ __forceinline__ uint64_t sort_key(uint32_t key, uint32_t index) {
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint64_t>(~index);
}

// Bitonic sort of data[0..n) (n a power of two) in shared memory, descending or ascending.
template <typename T>
__device__ void bitonic_sort(T* data, int n, bool descending) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int partner = i ^ stride;
        if (partner > i) {
          const bool block_descending = ((i & size) == 0) == descending;
          const T a = data[i], b = data[partner];
          if (block_descending ? (a < b) : (a > b)) {
            data[i] = b;
            data[partner] = a;
          }
        }
      }
    }
  }
  __syncthreads();
}

__host__ __device__ __forceinline__ int next_pow2(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// One row (or, with splits > 1, one split of a row's first pass) per block.
template <typename scalar_t>
__global__ void __launch_bounds__(1024, 1) topk_log_probs_kernel(const scalar_t* __restrict__ logits, int64_t vocab, int k,
                                                              int splits, uint32_t* __restrict__ scratch,
                                                              float* __restrict__ partials,
                                                              float* __restrict__ out_log_probs,
                                                              int64_t* __restrict__ out_ids,
                                                              bool* __restrict__ out_invalid,
                                                              const int* __restrict__ only_rows) {
  constexpr int kLowestBit = 32 - KeyBits<scalar_t>::value;
  // Per-lane histograms while radix selecting; afterwards the same memory holds the selected keys and ties.
  __shared__ uint64_t arena[kBins * kLanes / 2];
  static_assert(sizeof(arena) >= kMaxBudget * sizeof(uint64_t) + kTieCapacity * sizeof(uint32_t), "arena too small");
  uint32_t* const hist = reinterpret_cast<uint32_t*>(arena);
  uint64_t* const selected = arena;
  uint32_t* const ties = reinterpret_cast<uint32_t*>(arena + kMaxBudget);
  __shared__ uint32_t hist_total[kBins];
  __shared__ LogSumExp lse_scratch[kMaxWarps];
  __shared__ BinChoice choice;
  __shared__ int selected_count, tie_count, warp_totals[kMaxWarps];
  __shared__ bool last_block, row_bad;
  __shared__ LogSumExp row_total;

  const int lane_id = threadIdx.x & (kLanes - 1);
  const int64_t row_index = blockIdx.x / splits;
  const int split = blockIdx.x % splits;
  if (only_rows != nullptr && only_rows[row_index] == 0) return;  // the filter path finished this row
  const scalar_t* row = logits + row_index * vocab;
  zero_words(hist, kBins * kLanes);
  if (threadIdx.x == 0) {
    selected_count = 0;
    tie_count = 0;
  }
  __syncthreads();

  // Pass 1 (this block's part of the row): logsumexp, NaN/+inf detection and the histogram of the top digit.
  const int64_t chunk = ((vocab + splits - 1) / splits + 7) / 8 * 8;  // multiples of 16 bytes keep loads aligned
  const int64_t chunk_start = min(vocab, split * chunk);
  const int64_t chunk_length = min(chunk, vocab - chunk_start);
  LogSumExp mine{-INFINITY, 0.f};
  bool bad = false;
  for_each_in_row(row + chunk_start, chunk_length, [&](int64_t, float v) {
    bad |= isnan(v) || v == INFINITY;
    if (v > mine.max) {
      mine.sum = mine.sum * expf(mine.max - v) + 1.f;
      mine.max = v;
    } else if (v != -INFINITY) {
      mine.sum += expf(v - mine.max);
    }
    atomicAdd(&hist[(float_to_key(v) >> (32 - kDigitBits)) * kLanes + lane_id], 1u);
  });
  bad = __syncthreads_or(bad);
  LogSumExp total = block_logsumexp(mine, lse_scratch);
  merge_lane_histograms(hist, kBins, hist_total);
  __syncthreads();

  if (splits > 1) {
    uint32_t* row_scratch = scratch + row_index * kScratchWords;
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
      if (hist_total[b] != 0) atomicAdd(&row_scratch[b], hist_total[b]);
    }
    if (threadIdx.x == 0) {
      partials[(row_index * splits + split) * 2] = total.max;
      partials[(row_index * splits + split) * 2 + 1] = total.sum;
      if (bad) atomicOr(&row_scratch[kBins + 1], 1u);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last_block = atomicAdd(&row_scratch[kBins], 1u) == static_cast<uint32_t>(splits - 1);
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) hist_total[b] = __ldcg(&row_scratch[b]);
    if (threadIdx.x == 0) {
      LogSumExp all{-INFINITY, 0.f};
      for (int s = 0; s < splits; ++s) {
        all = combine(all, LogSumExp{__ldcg(&partials[(row_index * splits + s) * 2]),
                                     __ldcg(&partials[(row_index * splits + s) * 2 + 1])});
      }
      row_total = all;
      row_bad = __ldcg(&row_scratch[kBins + 1]) != 0;
    }
    __syncthreads();
    total = row_total;
    bad = row_bad;
  }
  const float log_z = log_normaliser(total);

  // Radix select of the k-th largest key: `prefix` under `mask` is the part of it resolved so far.
  uint32_t prefix = 0, mask = 0;
  int needed = k, shift = 32 - kDigitBits, width = kDigitBits;
  bool take_all = false;
  while (true) {
    __syncthreads();  // hist_total complete
    if (threadIdx.x < 32) choose_bin(hist_total, 1 << width, needed, &choice);
    __syncthreads();
    const BinChoice c = choice;
    needed -= c.above;
    prefix |= static_cast<uint32_t>(c.bin) << shift;
    mask |= ((1u << width) - 1u) << shift;
    if (c.count == needed) {
      take_all = true;
      break;
    }
    if (shift <= kLowestBit) break;  // every key is resolved: the remaining candidates are exact ties
    const int next_shift = max(shift - kDigitBits, kLowestBit);
    width = shift - next_shift;
    shift = next_shift;
    zero_words(hist, kBins * kLanes);
    __syncthreads();
    const uint32_t digit_mask = (1u << width) - 1u;
    for_each_in_row(row, vocab, [&](int64_t, float v) {
      const uint32_t key = float_to_key(v);
      if ((key & mask) == prefix) atomicAdd(&hist[((key >> shift) & digit_mask) * kLanes + lane_id], 1u);
    });
    __syncthreads();
    merge_lane_histograms(hist, 1 << width, hist_total);
  }
  const int tie_total = choice.count;
  const bool buffer_ties = !take_all && tie_total <= kTieCapacity;

  // Collect: keys above the threshold (and all threshold keys when they are all taken) in any order; the
  // threshold ties go to a buffer so that the lowest token ids can be kept.
  for_each_in_row(row, vocab, [&](int64_t i, float v) {
    const uint32_t key = float_to_key(v);
    const uint32_t masked = key & mask;
    if (masked > prefix || (take_all && masked == prefix)) {
      selected[atomicAdd(&selected_count, 1)] = sort_key(key, static_cast<uint32_t>(i));
    } else if (buffer_ties && masked == prefix) {
      ties[atomicAdd(&tie_count, 1)] = static_cast<uint32_t>(i);
    }
  });
  __syncthreads();
  const int above = selected_count;
  if (buffer_ties) {
    const int padded = next_pow2(tie_total);
    for (int i = tie_total + threadIdx.x; i < padded; i += blockDim.x) ties[i] = 0xffffffffu;
    bitonic_sort(ties, padded, /*descending=*/false);
    for (int j = threadIdx.x; j < needed; j += blockDim.x) {
      const uint32_t index = ties[j];
      selected[above + j] = sort_key(float_to_key(static_cast<float>(row[index])), index);
    }
  } else if (!take_all) {
    // More exact ties than the buffer holds (e.g. a constant row): keep the first `needed` in index order.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int taken = 0;
    for (int64_t base = 0; base < vocab && taken < needed; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      const uint32_t key = i < vocab ? float_to_key(static_cast<float>(row[i])) : 0u;
      const bool tie = i < vocab && (key & mask) == prefix;
      const uint32_t ballot = __ballot_sync(0xffffffffu, tie);
      if (lane == 0) warp_totals[warp] = __popc(ballot);
      __syncthreads();
      int rank = taken + __popc(ballot & ((1u << lane) - 1u));
      int total = 0;
      for (int w = 0; w < warps; ++w) {
        if (w < warp) rank += warp_totals[w];
        total += warp_totals[w];
      }
      if (tie && rank < needed) selected[above + rank] = sort_key(key, static_cast<uint32_t>(i));
      taken += total;
      __syncthreads();
    }
  }
  const int padded = next_pow2(k);
  for (int i = k + threadIdx.x; i < padded; i += blockDim.x) selected[i] = 0;  // real keys are never 0
  bitonic_sort(selected, padded, /*descending=*/true);

  for (int r = threadIdx.x; r < k; r += blockDim.x) {
    const uint64_t entry = selected[r];
    const float top = key_to_float(static_cast<uint32_t>(entry >> 32));
    out_log_probs[row_index * k + r] = top == -INFINITY ? -INFINITY : top - log_z;
    out_ids[row_index * k + r] = static_cast<int64_t>(~static_cast<uint32_t>(entry));
  }
  if (threadIdx.x == 0) out_invalid[row_index] = bad;
}


// --- Main path: chunk candidates, then a per-row merge ------------------------------------------------------

constexpr int kChunkThreads = 512;
constexpr int kMergeThreads = 1024;
constexpr int kChunkTarget = 8192;      // logits per chunk block (rounded so that chunks stay 16-byte aligned)
constexpr int kMaxChunk = 32768;        // longest chunk that fits the chunk block's shared memory
constexpr int kMaxCandidates = 8192;    // chunks x K that the merge block holds
constexpr int kHistWords = kBins * kLanes;
constexpr int kTopDigitShift = 56;
constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ constexpr size_t chunk_smem_bytes(int chunk) {
  return (static_cast<size_t>(kHistWords) + static_cast<size_t>(chunk)) * sizeof(uint32_t);
}
__host__ __device__ constexpr size_t merge_smem_bytes(int candidates, int padded_k) {
  return static_cast<size_t>(kHistWords) * sizeof(uint32_t) +
         (static_cast<size_t>(candidates) + static_cast<size_t>(padded_k)) * sizeof(uint64_t);
}

__device__ __forceinline__ uint64_t composite_key(uint32_t value_key, uint32_t token) {
  return (static_cast<uint64_t>(value_key) << 32) | static_cast<uint64_t>(~token);
}

// The digit after (shift, width) of a composite key: value bits from the top down to value_low (below it all
// values of one sign share their bits), then token bits from index_bits (above it ~token is all ones) down
// to 0. False when every bit is resolved.
__device__ __forceinline__ bool next_digit(int& shift, int& width, int value_low, int index_bits) {
  int next;
  if (shift > value_low) {
    next = max(shift - kDigitBits, value_low);
  } else if (shift >= 32) {
    next = max(index_bits - kDigitBits, 0);
    shift = index_bits;
  } else if (shift > 0) {
    next = max(shift - kDigitBits, 0);
  } else {
    return false;
  }
  width = shift - next;
  shift = next;
  return width > 0;
}

struct Selection {
  uint64_t prefix;  // resolved bits of the needed-th largest key
  uint64_t mask;    // which bits are resolved; selected keys are those with (key & mask) >= prefix
};

// Block-wide radix select of the `needed` largest of n unique composite keys key_at(i). On entry hist_total
// holds the histogram of the top digit (bits 56..63).
template <typename KeyAt>
__device__ Selection select_largest(KeyAt key_at, int n, int needed, int value_low, int index_bits, uint32_t* hist,
                                    uint32_t* hist_total, BinChoice* choice) {
  const int lane = threadIdx.x & (kLanes - 1);
  uint64_t prefix = 0, mask = 0;
  int shift = kTopDigitShift, width = kDigitBits;
  while (true) {
    __syncthreads();  // hist_total complete
    if (threadIdx.x < 32) choose_bin(hist_total, 1 << width, needed, choice);
    __syncthreads();
    const BinChoice c = *choice;
    needed -= c.above;
    prefix |= static_cast<uint64_t>(c.bin) << shift;
    mask |= ((uint64_t{1} << width) - 1) << shift;
    if (c.count == needed || !next_digit(shift, width, value_low, index_bits)) break;
    zero_words(hist, (1 << width) * kLanes);
    __syncthreads();
    const uint64_t digit_mask = (uint64_t{1} << width) - 1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint64_t key = key_at(i);
      if ((key & mask) == prefix) atomicAdd(&hist[static_cast<int>((key >> shift) & digit_mask) * kLanes + lane], 1u);
    }
    __syncthreads();
    merge_lane_histograms(hist, 1 << width, hist_total);
  }
  return {prefix, mask};
}

// Adds values x[0..count) to a running logsumexp (exp2 of pre-scaled differences; -inf terms add nothing).
template <int count>
__device__ __forceinline__ void absorb(LogSumExp& lse, const float (&x)[count]) {
  float top = x[0];
#pragma unroll
  for (int j = 1; j < count; ++j) top = fmaxf(top, x[j]);
  const float new_max = fmaxf(lse.max, top);
  if (new_max == -INFINITY) return;
  if (new_max > lse.max) lse.sum *= exp2f((lse.max - new_max) * kLog2e);
  lse.max = new_max;
#pragma unroll
  for (int j = 0; j < count; ++j) lse.sum += exp2f((x[j] - new_max) * kLog2e);
}

// Reads a chunk once: keys into shared memory, the top-digit histogram, the logsumexp and the bad flag.
template <typename scalar_t>
__device__ __forceinline__ void load_chunk(const scalar_t* __restrict__ src, int n, uint32_t* keys, uint32_t* hist,
                                           LogSumExp& lse, bool& bad) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  const int lane = threadIdx.x & (kLanes - 1);
  int done = 0;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const int vectors = n / kVec;
    const uint4* vsrc = reinterpret_cast<const uint4*>(src);
#pragma unroll 2
    for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
      const uint4 raw = __ldg(vsrc + v);
      const scalar_t* values = reinterpret_cast<const scalar_t*>(&raw);
      float x[kVec];
      uint32_t k[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        x[j] = static_cast<float>(values[j]);
        bad |= isnan(x[j]) || x[j] == INFINITY;
        k[j] = float_to_key(x[j]);
        atomicAdd(&hist[(k[j] >> (32 - kDigitBits)) * kLanes + lane], 1u);
      }
      absorb(lse, x);
      uint4* dst = reinterpret_cast<uint4*>(keys + v * kVec);
#pragma unroll
      for (int q = 0; q < kVec / 4; ++q) dst[q] = make_uint4(k[4 * q], k[4 * q + 1], k[4 * q + 2], k[4 * q + 3]);
    }
    done = vectors * kVec;
  }
  for (int i = done + threadIdx.x; i < n; i += blockDim.x) {
    const float x[1] = {static_cast<float>(src[i])};
    bad |= isnan(x[0]) || x[0] == INFINITY;
    const uint32_t k = float_to_key(x[0]);
    atomicAdd(&hist[(k >> (32 - kDigitBits)) * kLanes + lane], 1u);
    absorb(lse, x);
    keys[i] = k;
  }
}

// One block per chunk of a row: the chunk's min(k, n) best composite keys, padded with 0 (below every real
// key) to k slots, and the chunk's logsumexp partial and bad flag.
template <typename scalar_t>
__global__ void __launch_bounds__(kChunkThreads) chunk_candidates_kernel(
    const scalar_t* __restrict__ logits, int64_t vocab, int k, int splits, int chunk, int index_bits,
    uint64_t* __restrict__ candidates, float2* __restrict__ partials, int* __restrict__ bad_flags) {
  extern __shared__ __align__(16) unsigned char chunk_smem[];
  uint32_t* const hist = reinterpret_cast<uint32_t*>(chunk_smem);
  uint32_t* const keys = hist + kHistWords;
  __shared__ uint32_t hist_total[kBins];
  __shared__ LogSumExp lse_scratch[kMaxWarps];
  __shared__ BinChoice choice;
  __shared__ int taken;

  const int64_t row_index = blockIdx.x / splits;
  const int64_t start = static_cast<int64_t>(blockIdx.x % splits) * chunk;
  const int n = static_cast<int>(min(static_cast<int64_t>(chunk), vocab - start));
  zero_words(hist, kHistWords);
  if (threadIdx.x == 0) taken = 0;
  __syncthreads();
  LogSumExp mine{-INFINITY, 0.f};
  bool bad = false;
  load_chunk(logits + row_index * vocab + start, n, keys, hist, mine, bad);
  bad = __syncthreads_or(bad);
  const LogSumExp total = block_logsumexp(mine, lse_scratch);
  merge_lane_histograms(hist, kBins, hist_total);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = make_float2(total.max, total.sum);
    bad_flags[blockIdx.x] = bad ? 1 : 0;
  }
  const uint32_t first_token = static_cast<uint32_t>(start);
  const auto key_at = [&](int i) { return composite_key(keys[i], first_token + static_cast<uint32_t>(i)); };
  const int needed = min(k, n);
  Selection selection{0, 0};  // keeps every key
  if (needed < n) {
    selection = select_largest(key_at, n, needed, 64 - KeyBits<scalar_t>::value, index_bits, hist, hist_total, &choice);
  }
  uint64_t* const out = candidates + static_cast<int64_t>(blockIdx.x) * k;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t key = key_at(i);
    if ((key & selection.mask) >= selection.prefix) {
      const int slot = atomicAdd(&taken, 1);
      if (slot < k) out[slot] = key;
    }
  }
  for (int i = needed + threadIdx.x; i < k; i += blockDim.x) out[i] = 0;
}

// One block per row: the k best of the row's chunk candidates, ranked, as log-probabilities and token ids.
__global__ void __launch_bounds__(kMergeThreads) merge_candidates_kernel(
    const uint64_t* __restrict__ candidates, const float2* __restrict__ partials, const int* __restrict__ bad_flags,
    int splits, int k, int value_low, int index_bits, float* __restrict__ out_log_probs, int64_t* __restrict__ out_ids,
    bool* __restrict__ out_invalid) {
  extern __shared__ __align__(16) unsigned char merge_smem[];
  uint32_t* const hist = reinterpret_cast<uint32_t*>(merge_smem);
  const int n = splits * k;
  uint64_t* const keys = reinterpret_cast<uint64_t*>(hist + kHistWords);
  uint64_t* const selected = keys + n;
  __shared__ uint32_t hist_total[kBins];
  __shared__ BinChoice choice;
  __shared__ int taken;
  __shared__ LogSumExp row_total;

  const int64_t row_index = blockIdx.x;
  const int lane = threadIdx.x & (kLanes - 1);
  zero_words(hist, kHistWords);
  if (threadIdx.x == 0) {
    taken = 0;
    LogSumExp all{-INFINITY, 0.f};
    int bad = 0;
    for (int s = 0; s < splits; ++s) {
      const float2 part = partials[row_index * splits + s];
      all = combine(all, LogSumExp{part.x, part.y});
      bad |= bad_flags[row_index * splits + s];
    }
    row_total = all;
    out_invalid[row_index] = bad != 0;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t key = candidates[row_index * n + i];
    keys[i] = key;
    atomicAdd(&hist[static_cast<int>(key >> kTopDigitShift) * kLanes + lane], 1u);
  }
  __syncthreads();
  merge_lane_histograms(hist, kBins, hist_total);
  const auto key_at = [&](int i) { return keys[i]; };
  Selection selection{0, 0};
  if (k < n) selection = select_largest(key_at, n, k, value_low, index_bits, hist, hist_total, &choice);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t key = keys[i];
    if ((key & selection.mask) >= selection.prefix) {
      const int slot = atomicAdd(&taken, 1);
      if (slot < k) selected[slot] = key;
    }
  }
  const int padded = next_pow2(k);
  for (int i = k + threadIdx.x; i < padded; i += blockDim.x) selected[i] = 0;
  bitonic_sort(selected, padded, /*descending=*/true);
  const float log_z = log_normaliser(row_total);
  for (int r = threadIdx.x; r < k; r += blockDim.x) {
    const uint64_t entry = selected[r];
    const float top = key_to_float(static_cast<uint32_t>(entry >> 32));
    out_log_probs[row_index * k + r] = top == -INFINITY ? -INFINITY : top - log_z;
    out_ids[row_index * k + r] = static_cast<int64_t>(~static_cast<uint32_t>(entry));
  }
}

// --- Filter path: one streaming read, a threshold from group maxima, a small exact selection ------------------
//
// The row is cut into groups of 8 consecutive 16-byte vectors (64 bf16 / fp16 or 32 fp32 logits). Blocks stream a
// row's groups once, keeping the logsumexp partial, the bad-value flag and each group's largest key (global memory).
// The last block of a row to finish then takes T = the K-th largest group key, truncated to its top 16 bits. K
// groups hold an element >= T, so at least K elements are >= T and T is at most the row's K-th largest key: every
// element of the row's top K, ties at the K-th value included, is >= T. Only the groups whose largest key is >= T are
// read again (about K of a row's thousands of groups), their elements >= T gathered as composite keys (value, lower
// token id first) and sorted. Rows whose candidates overflow the block's buffer (mass ties, a mostly -inf row) are
// left to the whole-row kernel, which a second launch runs for those rows only.

constexpr int kFilterThreads = 512;
constexpr int kGroupVectors = 8;              // 16-byte vectors per group: 8 lanes of one warp load one group
constexpr int kFilterCapacity = 4096;         // candidate keys the last block can hold and sort
constexpr int kFilterGroupCapacity = 2048;    // groups with a key >= T the last block can list
constexpr int kFilterMaxSplits = 64;
// Measured on an H100 (2026-12-05): 8 vectors in flight or one wave per row were no faster.
constexpr int kFilterUnroll = 4;  // vectors each thread has in flight while streaming
constexpr int kFilterWaves = 2;   // blocks per row: about this many waves of resident blocks
constexpr int kFilterSortPairs = kFilterCapacity / 2 / kFilterThreads;  // compare-exchanges per thread per step
constexpr int kFilterMaxGroups = 8192;       // group keys a row's last block holds (in the candidate buffer's room)
constexpr int kFilterGatherUnroll = 2;        // vectors each thread of the last block has in flight while gathering
static_assert(kFilterMaxGroups * sizeof(uint32_t) <= kFilterCapacity * sizeof(uint64_t),
              "the group keys live in the candidate buffer until the gather");

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// max() that returns NaN when either operand is NaN (fmaxf drops it), so one test per vector finds NaN.
__device__ __forceinline__ float max_or_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return (isnan(a) || isnan(b)) ? NAN : fmaxf(a, b);
#endif
}

// absorb() with the hardware exp2 (relative error ~2^-22 per term, far inside the 1e-5 the log-normaliser keeps).
// `top` is the largest of x (NaN when x holds one: the sum then turns NaN, and the caller flags the row anyway).
template <int count>
__device__ __forceinline__ void absorb_fast(LogSumExp& lse, const float (&x)[count], float top) {
  const float new_max = fmaxf(lse.max, top);
  if (new_max == -INFINITY) return;
  if (new_max > lse.max) lse.sum *= fast_exp2((lse.max - new_max) * kLog2e);
  lse.max = new_max;
#pragma unroll
  for (int j = 0; j < count; ++j) lse.sum += fast_exp2((x[j] - new_max) * kLog2e);
}

// Streams groups [first_group, last_group) of one row: the logsumexp partial, the bad flag, and each group's largest
// key written to group_keys. Every thread runs the same number of iterations so that the 8 lanes of a group can
// combine their maxima with shuffles; a lane past the row contributes key 0 (below every real key).
template <typename scalar_t>
__device__ __forceinline__ void stream_groups(const scalar_t* __restrict__ row, int64_t row_vectors, int first_group,
                                              int last_group, uint32_t* __restrict__ group_keys, LogSumExp& lse,
                                              bool& bad) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  const uint4* vrow = reinterpret_cast<const uint4*>(row);
  const int64_t first = static_cast<int64_t>(first_group) * kGroupVectors;
  const int64_t end = min(static_cast<int64_t>(last_group) * kGroupVectors, row_vectors);
  const int64_t span = static_cast<int64_t>(last_group - first_group) * kGroupVectors;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kFilterUnroll;
  for (int64_t base = 0; base < span; base += step) {
    uint4 raw[kFilterUnroll];
#pragma unroll
    for (int u = 0; u < kFilterUnroll; ++u) {
      const int64_t v = first + base + u * blockDim.x + threadIdx.x;
      raw[u] = v < end ? __ldg(vrow + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kFilterUnroll; ++u) {
      const int64_t v = first + base + u * blockDim.x + threadIdx.x;
      const bool present = v < end;
      uint32_t top_key = 0;
      if (present) {
        const scalar_t* values = reinterpret_cast<const scalar_t*>(&raw[u]);
        float x[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) x[j] = static_cast<float>(values[j]);
        // One NaN-propagating max per element; the bad test and the order key then run once per vector. The key
        // of the largest float is the largest key (float_to_key is monotone), so the group key stays exact.
        float top = x[0];
#pragma unroll
        for (int j = 1; j < kVec; ++j) top = max_or_nan(top, x[j]);
        bad |= !(top < INFINITY);  // NaN or +inf
        top_key = float_to_key(top);
        absorb_fast(lse, x, top);
      }
      top_key = max(top_key, __shfl_xor_sync(0xffffffffu, top_key, 1));
      top_key = max(top_key, __shfl_xor_sync(0xffffffffu, top_key, 2));
      top_key = max(top_key, __shfl_xor_sync(0xffffffffu, top_key, 4));
      const int64_t local = base + u * blockDim.x + threadIdx.x;  // vector index within this block's groups
      if ((threadIdx.x & (kGroupVectors - 1)) == 0 && local < span) {
        group_keys[first_group + local / kGroupVectors] = top_key;
      }
    }
  }
}

// Adds one to hist[bin] for every lane with `take`, one shared atomic per warp for the lanes that share the first
// taker's bin (group keys of a row mostly share their top digits, and same-address atomics of a warp serialise).
// Every lane of the warp must call it.
__device__ __forceinline__ void count_in_bin(uint32_t* hist, bool take, uint32_t bin) {
  const unsigned takers = __ballot_sync(0xffffffffu, take);
  if (takers == 0) return;
  const int lane = threadIdx.x & (kLanes - 1);
  const int leader = __ffs(takers) - 1;
  const uint32_t leader_bin = __shfl_sync(0xffffffffu, bin, leader);
  const unsigned same = __ballot_sync(0xffffffffu, take && bin == leader_bin);
  if (lane == leader) atomicAdd(&hist[leader_bin], static_cast<uint32_t>(__popc(same)));
  if (take && bin != leader_bin) atomicAdd(&hist[bin], 1u);
}

// Descending bitonic sort of data[0..n), n a power of two <= kFilterCapacity. Each thread loads all of its
// compare-exchanges of a step before comparing, so their shared-memory latencies overlap. A warp's pairs at a stride
// below 32 stay inside its own windows of 64 elements, so a step needs only a warp barrier when both it and the step
// before it have a stride below 32.
__device__ void filter_sort_descending(uint64_t* data, int n) {
  const int pairs = n >> 1;
  int previous_stride = n;  // the candidates were written by every warp
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (previous_stride >= kLanes || stride >= kLanes) {
        __syncthreads();
      } else {
        __syncwarp();
      }
      previous_stride = stride;
      uint64_t a[kFilterSortPairs], b[kFilterSortPairs];
      int low[kFilterSortPairs];
#pragma unroll
      for (int q = 0; q < kFilterSortPairs; ++q) {
        const int p = q * kFilterThreads + static_cast<int>(threadIdx.x);
        low[q] = ((p & ~(stride - 1)) << 1) | (p & (stride - 1));
        if (p < pairs) {
          a[q] = data[low[q]];
          b[q] = data[low[q] + stride];
        }
      }
#pragma unroll
      for (int q = 0; q < kFilterSortPairs; ++q) {
        const int p = q * kFilterThreads + static_cast<int>(threadIdx.x);
        const bool descending = (low[q] & size) == 0;
        if (p < pairs && (descending ? a[q] < b[q] : a[q] > b[q])) {
          data[low[q]] = b[q];
          data[low[q] + stride] = a[q];
        }
      }
    }
  }
  __syncthreads();
}

// The lower bound T described above: the K-th largest of the row's group keys, with its low 16 bits cleared (two
// 8-bit radix passes over the keys in shared memory). Loops stay rolled here and below: the tail runs once per row
// and block, so its code is fetched cold, and on an H200 fully unrolled loops made it wait on instruction fetch
// (about 50 KB of code: threshold 4.5 us, gather 7-13 us for 16 groups).
__device__ uint32_t group_threshold(const uint32_t* keys, int groups, int k, uint32_t* hist, BinChoice* choice) {
  uint32_t prefix = 0;
  int needed = k;
  for (int pass = 0; pass < 2; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
#pragma unroll 1
    for (int base = 0; base < groups; base += blockDim.x) {  // the same trip count in every lane
      const int g = base + static_cast<int>(threadIdx.x);
      const uint32_t key = g < groups ? keys[g] : 0u;
      const bool take = g < groups && (pass == 0 || (key >> 24) == (prefix >> 24));
      count_in_bin(hist, take, (key >> shift) & (kBins - 1));
    }
    __syncthreads();
    if (threadIdx.x < 32) choose_bin(hist, kBins, needed, choice);
    __syncthreads();
    const BinChoice c = *choice;
    needed -= c.above;
    prefix |= static_cast<uint32_t>(c.bin) << shift;
  }
  __syncthreads();
  return prefix;
}

// Warp 0 of the row's last block: the row's log-normaliser parts and bad flags from its split blocks, combined.
__device__ void combine_row_partials(const float2* __restrict__ partials, const int* __restrict__ bad_flags,
                                     int64_t row_index, int splits, LogSumExp* total, bool* any_bad) {
  LogSumExp all{-INFINITY, 0.f};
  int bad = 0;
#pragma unroll 1
  for (int s = threadIdx.x; s < splits; s += kLanes) {
    const float2 part = __ldcg(&partials[row_index * splits + s]);
    all = combine(all, LogSumExp{part.x, part.y});
    bad |= __ldcg(&bad_flags[row_index * splits + s]);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    all = combine(all, LogSumExp{__shfl_xor_sync(0xffffffffu, all.max, offset),
                                 __shfl_xor_sync(0xffffffffu, all.sum, offset)});
  }
  *total = all;
  *any_bad = __any_sync(0xffffffffu, bad != 0);
}

// Diagnosis only (build with -DDDTREE_FILTER_PROFILE): the last block of row 0 prints when each of its phases ended,
// in ns after that block started.
#ifdef DDTREE_FILTER_PROFILE
#define FILTER_STAMP(i) \
  if (threadIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(stamps[i]))
#else
#define FILTER_STAMP(i)
#endif

template <typename scalar_t>
__global__ void __launch_bounds__(kFilterThreads, 2) filter_topk_kernel(
    const scalar_t* __restrict__ logits, int64_t vocab, int k, int splits, int groups, int groups_per_split,
    uint32_t* __restrict__ group_keys, float2* __restrict__ partials, int* __restrict__ bad_flags,
    unsigned* __restrict__ arrivals, int* __restrict__ fallback_rows, float* __restrict__ out_log_probs,
    int64_t* __restrict__ out_ids, bool* __restrict__ out_invalid) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  __shared__ uint64_t candidates[kFilterCapacity];
  __shared__ int group_list[kFilterGroupCapacity];
  __shared__ uint32_t hist[kBins];
  __shared__ LogSumExp lse_scratch[kMaxWarps];
  __shared__ BinChoice choice;
  __shared__ int listed, taken;
  __shared__ bool last_block;

#ifdef DDTREE_FILTER_PROFILE
  unsigned long long stamps[9] = {};
#endif
  FILTER_STAMP(0);
  const int64_t row_index = blockIdx.x / splits;
  const int split = blockIdx.x % splits;
  const scalar_t* row = logits + row_index * vocab;
  const int64_t row_vectors = vocab / kVec;
  uint32_t* const row_group_keys = group_keys + row_index * groups;

  const int first_group = min(groups, split * groups_per_split);
  const int last_group = min(groups, first_group + groups_per_split);
  LogSumExp mine{-INFINITY, 0.f};
  bool bad = false;
  stream_groups(row, row_vectors, first_group, last_group, row_group_keys, mine, bad);
  FILTER_STAMP(1);
  // No fence per thread: thread 0's fence below, after this barrier, is cumulative over the block's writes (the
  // pattern of cooperative groups' grid barrier), so the group keys are visible before the arrival.
  bad = __syncthreads_or(bad);
  const LogSumExp total = block_logsumexp(mine, lse_scratch);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = make_float2(total.max, total.sum);
    bad_flags[blockIdx.x] = bad ? 1 : 0;
    __threadfence();
    last_block = atomicAdd(&arrivals[row_index], 1u) == static_cast<unsigned>(splits - 1);
  }
  __syncthreads();
  if (!last_block) return;
  FILTER_STAMP(2);
  __threadfence();

  // The row's last block. Its group keys, copied into the candidate buffer's room (free until the gather).
  uint32_t* const keys = reinterpret_cast<uint32_t*>(candidates);
#pragma unroll 4
  for (int g = threadIdx.x; g < groups; g += blockDim.x) keys[g] = __ldcg(row_group_keys + g);
  // The log-normaliser and the bad flag of the whole row.
  if (threadIdx.x < kLanes) {
    LogSumExp all;
    bool any_bad;
    combine_row_partials(partials, bad_flags, row_index, splits, &all, &any_bad);
    if (threadIdx.x == 0) {
      lse_scratch[0] = all;
      out_invalid[row_index] = any_bad;
      listed = 0;
      taken = 0;
    }
  }
  __syncthreads();
  FILTER_STAMP(3);
  const uint32_t threshold = group_threshold(keys, groups, k, hist, &choice);
  FILTER_STAMP(4);
  const float log_z = log_normaliser(lse_scratch[0]);

  // List the groups that can hold a top-K element (warp-aggregated appends).
  const int lane = threadIdx.x & (kLanes - 1);
#pragma unroll 1
  for (int base = 0; base < groups; base += blockDim.x) {  // the same trip count in every lane
    const int g = base + static_cast<int>(threadIdx.x);
    const bool hit = g < groups && keys[g] >= threshold;
    const uint32_t ballot = __ballot_sync(0xffffffffu, hit);
    int first_slot = 0;
    if (lane == 0 && ballot != 0) first_slot = atomicAdd(&listed, __popc(ballot));
    first_slot = __shfl_sync(0xffffffffu, first_slot, 0);
    const int slot = first_slot + __popc(ballot & ((1u << lane) - 1u));
    if (hit && slot < kFilterGroupCapacity) group_list[slot] = g;
  }
  __syncthreads();
  FILTER_STAMP(5);
  const int group_count = listed;
  if (group_count <= kFilterGroupCapacity) {
    // Gather: one 16-byte vector of a listed group per thread and step (group i's vectors are items 8i..8i+7), its
    // elements >= T counted, and a warp scan places them with one shared atomic per warp.
    const uint4* vrow = reinterpret_cast<const uint4*>(row);
    const int items = group_count * kGroupVectors;
    const int step = static_cast<int>(blockDim.x) * kFilterGatherUnroll;
#pragma unroll 1
    for (int base = 0; base < items; base += step) {  // the same trip count in every lane
      uint4 raw[kFilterGatherUnroll];
      int64_t first_index[kFilterGatherUnroll];
#pragma unroll
      for (int u = 0; u < kFilterGatherUnroll; ++u) {
        const int item = base + u * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);
        const int64_t v = item < items ? static_cast<int64_t>(group_list[item / kGroupVectors]) * kGroupVectors +
                                             item % kGroupVectors
                                       : row_vectors;
        first_index[u] = v * kVec;
        raw[u] = v < row_vectors ? __ldg(vrow + v) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kFilterGatherUnroll; ++u) {
        const bool present = first_index[u] < row_vectors * kVec;
        const scalar_t* values = reinterpret_cast<const scalar_t*>(&raw[u]);
        int hits = 0;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          hits += present && float_to_key(static_cast<float>(values[j])) >= threshold ? 1 : 0;
        }
        const int inclusive = warp_inclusive_sum(hits);
        const int warp_hits = __shfl_sync(0xffffffffu, inclusive, kLanes - 1);
        int warp_first = 0;
        if (lane == kLanes - 1 && warp_hits > 0) warp_first = atomicAdd(&taken, warp_hits);
        int slot = __shfl_sync(0xffffffffu, warp_first, kLanes - 1) + inclusive - hits;
        if (hits == 0) continue;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const uint32_t key = float_to_key(static_cast<float>(values[j]));
          if (key >= threshold) {
            if (slot < kFilterCapacity) candidates[slot] = composite_key(key, static_cast<uint32_t>(first_index[u] + j));
            ++slot;
          }
        }
      }
    }
  }
  __syncthreads();
  FILTER_STAMP(6);
  const int count = taken;
  // Too many candidates, or (only in a row holding NaN, whose group key may be no element's key) too few: the
  // whole-row kernel takes the row.
  if (group_count > kFilterGroupCapacity || count > kFilterCapacity || count < k) {
    if (threadIdx.x == 0) fallback_rows[row_index] = 1;
    return;
  }
  // Otherwise count >= k: the k groups with a key >= T each hold an element >= T.
  const int padded = next_pow2(count);
  for (int i = count + threadIdx.x; i < padded; i += blockDim.x) candidates[i] = 0;
  filter_sort_descending(candidates, padded);
  FILTER_STAMP(7);
  for (int r = threadIdx.x; r < k; r += blockDim.x) {
    const uint64_t entry = candidates[r];
    const float top = key_to_float(static_cast<uint32_t>(entry >> 32));
    out_log_probs[row_index * k + r] = top == -INFINITY ? -INFINITY : top - log_z;
    out_ids[row_index * k + r] = static_cast<int64_t>(~static_cast<uint32_t>(entry));
  }
#ifdef DDTREE_FILTER_PROFILE
  FILTER_STAMP(8);
  if (threadIdx.x == 0 && row_index == 0) {
    printf("filter row 0 (k %d, splits %d, groups %d, listed %d, candidates %d): stream %llu, arrive %llu, keys+lse %llu, "
           "threshold %llu, list %llu, gather %llu, sort %llu, write %llu ns\n", k, splits, groups, group_count, count,
           stamps[1] - stamps[0], stamps[2] - stamps[1], stamps[3] - stamps[2], stamps[4] - stamps[3],
           stamps[5] - stamps[4], stamps[6] - stamps[5], stamps[7] - stamps[6], stamps[8] - stamps[7]);
  }
#endif
}

// Dynamic shared memory each main-path kernel may use on a device: what its largest launch needs, or less where the
// device allows less (an H200 fits both; an RTX PRO 6000 Blackwell fits neither, so plan_chunks keeps its launches
// within these limits or leaves the row to the whole-row kernel). Set once per device, on the first call.
struct ChunkSmem {
  size_t chunk;
  size_t merge;
};

template <typename scalar_t>
ChunkSmem chunk_smem_limits(int device) {
  static std::once_flag flags[64];
  static ChunkSmem limits[64];
  std::call_once(flags[device % 64], [device] {
    const int optin = smem_optin_bytes(device);
    const int chunk = static_cast<int>(std::min<size_t>(
        chunk_smem_bytes(kMaxChunk), static_cast<size_t>(dynamic_smem_room(optin, chunk_candidates_kernel<scalar_t>))));
    const int merge = static_cast<int>(std::min<size_t>(merge_smem_bytes(kMaxCandidates, kMaxBudget),
                                                        static_cast<size_t>(dynamic_smem_room(optin, merge_candidates_kernel))));
    C10_CUDA_CHECK(cudaFuncSetAttribute(chunk_candidates_kernel<scalar_t>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        chunk));
    C10_CUDA_CHECK(cudaFuncSetAttribute(merge_candidates_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, merge));
    limits[device % 64] = {static_cast<size_t>(chunk), static_cast<size_t>(merge)};
  });
  return limits[device % 64];
}

// How a row is cut into chunks for the main path (chunk == 0: the row does not fit, use the fallback).
struct ChunkPlan {
  int splits;
  int chunk;
};

ChunkPlan plan_chunks(int64_t vocab, int64_t k, ChunkSmem limits) {
  int64_t splits = std::max<int64_t>(1, std::min<int64_t>((vocab + kChunkTarget - 1) / kChunkTarget, kMaxCandidates / k));
  const int64_t chunk = ((vocab + splits - 1) / splits + 7) / 8 * 8;  // multiples of 16 bytes keep loads aligned
  splits = (vocab + chunk - 1) / chunk;
  if (chunk > kMaxChunk || chunk_smem_bytes(static_cast<int>(chunk)) > limits.chunk ||
      merge_smem_bytes(static_cast<int>(splits * k), next_pow2(static_cast<int>(k))) > limits.merge) {
    return {0, 0};
  }
  return {static_cast<int>(splits), static_cast<int>(chunk)};
}

}  // namespace

namespace {

template <typename scalar_t>
int value_low_bit() {
  return 64 - KeyBits<scalar_t>::value;
}

// Bits that the largest token id of the vocabulary needs (at least one).
int token_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

template <typename scalar_t>
void launch_chunked(const at::Tensor& logits, int64_t rows, int64_t vocab, int k, ChunkPlan plan, at::Tensor& log_probs,
                    at::Tensor& ids, at::Tensor& invalid_rows, cudaStream_t stream) {
  const auto options = logits.options();
  const int64_t blocks = rows * plan.splits;
  at::Tensor candidates = at::empty({blocks * k}, options.dtype(at::kLong));
  at::Tensor partials = at::empty({blocks * 2}, options.dtype(at::kFloat));
  at::Tensor bad_flags = at::empty({blocks}, options.dtype(at::kInt));
  const int index_bits = token_bits(vocab);
  uint64_t* const candidate_keys = reinterpret_cast<uint64_t*>(candidates.data_ptr<int64_t>());
  float2* const partial_pairs = reinterpret_cast<float2*>(partials.data_ptr<float>());
  chunk_candidates_kernel<scalar_t><<<static_cast<unsigned>(blocks), kChunkThreads, chunk_smem_bytes(plan.chunk), stream>>>(
      logits.data_ptr<scalar_t>(), vocab, k, plan.splits, plan.chunk, index_bits, candidate_keys, partial_pairs,
      bad_flags.data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  merge_candidates_kernel<<<static_cast<unsigned>(rows), kMergeThreads,
                            merge_smem_bytes(plan.splits * k, next_pow2(k)), stream>>>(
      candidate_keys, partial_pairs, bad_flags.data_ptr<int>(), plan.splits, k, value_low_bit<scalar_t>(), index_bits,
      log_probs.data_ptr<float>(), ids.data_ptr<int64_t>(), invalid_rows.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t>
void launch_whole_rows(const at::Tensor& logits, int64_t rows, int64_t vocab, int k, int sms, at::Tensor& log_probs,
                       at::Tensor& ids, at::Tensor& invalid_rows, cudaStream_t stream,
                       const int* only_rows = nullptr) {
  const int threads = rows >= sms ? 512 : 1024;
  // Fewer rows than SMs: split each row's first pass so that about one block per SM works (not for the filter path's
  // rare leftovers, where the split's scratch would cost every call).
  const int64_t by_sms = rows >= sms || only_rows != nullptr ? 1 : sms / rows;
  const int splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({by_sms, kMaxSplits, vocab / kMinSplitLength})));
  at::Tensor scratch, partials;
  if (splits > 1) {
    scratch = at::zeros({rows * kScratchWords}, logits.options().dtype(at::kInt));
    partials = at::empty({rows * splits * 2}, logits.options().dtype(at::kFloat));
  }
  topk_log_probs_kernel<scalar_t><<<static_cast<unsigned>(rows * splits), threads, 0, stream>>>(
      logits.data_ptr<scalar_t>(), vocab, k, splits,
      splits > 1 ? reinterpret_cast<uint32_t*>(scratch.data_ptr<int32_t>()) : nullptr,
      splits > 1 ? partials.data_ptr<float>() : nullptr, log_probs.data_ptr<float>(), ids.data_ptr<int64_t>(),
      invalid_rows.data_ptr<bool>(), only_rows);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// How the filter path cuts rows (groups == 0: it does not apply to these logits).
struct FilterPlan {
  int groups;            // 8-vector groups per row
  int splits;            // blocks per row
  int groups_per_split;
};

template <typename scalar_t>
FilterPlan plan_filter(const at::Tensor& logits, int64_t rows, int64_t vocab, int64_t k, int sms) {
  constexpr int64_t kVec = 16 / sizeof(scalar_t);
  constexpr int64_t group_elements = kVec * kGroupVectors;
  // Rows must start on 16-byte boundaries, and there must be at least k groups for the threshold to exist.
  if ((vocab * static_cast<int64_t>(sizeof(scalar_t))) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(logits.data_ptr()) % 16 != 0) {
    return {0, 0, 0};
  }
  const int64_t groups = (vocab + group_elements - 1) / group_elements;
  if (groups < k || groups > kFilterMaxGroups) return {0, 0, 0};
  int resident = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, filter_topk_kernel<scalar_t>,
                                                               kFilterThreads, 0));
  // About kFilterWaves waves of resident blocks, so that a row's tail work overlaps other rows' streaming; a split
  // keeps at least a few vectors per thread.
  const int64_t wanted = std::max<int64_t>(
      1, (kFilterWaves * static_cast<int64_t>(std::max(resident, 1)) * sms + rows - 1) / rows);
  const int64_t min_groups = std::max<int64_t>(1, kFilterThreads / kGroupVectors);
  const int64_t splits_cap = std::max<int64_t>(1, std::min<int64_t>(kFilterMaxSplits, groups / min_groups));
  int64_t splits = std::min(wanted, splits_cap);
  const int64_t per_split = (groups + splits - 1) / splits;
  splits = (groups + per_split - 1) / per_split;
  return {static_cast<int>(groups), static_cast<int>(splits), static_cast<int>(per_split)};
}

template <typename scalar_t>
void launch_filtered(const at::Tensor& logits, int64_t rows, int64_t vocab, int k, FilterPlan plan, int sms,
                     at::Tensor& log_probs, at::Tensor& ids, at::Tensor& invalid_rows, cudaStream_t stream) {
  const auto options = logits.options();
  const int64_t blocks = rows * plan.splits;
  at::Tensor group_keys = at::empty({rows * plan.groups}, options.dtype(at::kInt));
  at::Tensor partials = at::empty({blocks * 2}, options.dtype(at::kFloat));
  at::Tensor bad_flags = at::empty({blocks}, options.dtype(at::kInt));
  at::Tensor counters = at::zeros({2 * rows}, options.dtype(at::kInt));  // arrivals, then fallback flags
  int* const fallback_rows = counters.data_ptr<int>() + rows;
  filter_topk_kernel<scalar_t><<<static_cast<unsigned>(blocks), kFilterThreads, 0, stream>>>(
      logits.data_ptr<scalar_t>(), vocab, k, plan.splits, plan.groups, plan.groups_per_split,
      reinterpret_cast<uint32_t*>(group_keys.data_ptr<int>()), reinterpret_cast<float2*>(partials.data_ptr<float>()),
      bad_flags.data_ptr<int>(), reinterpret_cast<unsigned*>(counters.data_ptr<int>()), fallback_rows,
      log_probs.data_ptr<float>(), ids.data_ptr<int64_t>(), invalid_rows.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // Rows the filter could not finish (flagged on the device): the whole-row kernel, which every other row leaves at
  // once. Nothing is read on the host, so the pair stays capturable in a CUDA graph.
  launch_whole_rows<scalar_t>(logits, rows, vocab, k, sms, log_probs, ids, invalid_rows, stream, fallback_rows);
}

enum class TopkPath { kFilter, kChunked, kWholeRows };

// DDTREE_TOPK_PATH=filter|chunked|whole forces a path (benchmarks and diagnosis) where it applies to the logits;
// unset, empty or "auto" leaves the choice to choose_topk_path. Read on every call (host side only, so a CUDA
// graph keeps the path it was captured with).
std::optional<TopkPath> forced_topk_path() {
  const char* value = std::getenv("DDTREE_TOPK_PATH");
  if (value == nullptr || *value == '\0' || std::string(value) == "auto") return std::nullopt;
  const std::string name(value);
  if (name == "filter") return TopkPath::kFilter;
  if (name == "chunked") return TopkPath::kChunked;
  if (name == "whole") return TopkPath::kWholeRows;
  TORCH_CHECK(false, "DDTREE_TOPK_PATH must be auto, filter, chunked or whole, not '", name, "'");
}

// The filter path reads every row once, so it wins from a few rows up; but with very few rows and a large k its
// once-per-row tail (threshold, gather and sort of >= k candidates in one block) outlasts the chunked path, whose
// selection is spread over the chunk blocks. H100, GPU time per call (docs/benchmarks.md): 15 rows, k = 1024,
// filter 85 vs chunked 58 us (V = 248320) and 83 vs 52 (V = 151936); 30 rows, k = 1024: 87 vs 89 and 84 vs 63;
// 30 rows, k = 512: the filter wins (65 vs 77 us), as it does at 60 rows and k = 1024 (94 vs 143 us).
constexpr int64_t kChunkedPreferredAboveK = 512;

TopkPath choose_topk_path(bool filter_applies, bool chunked_applies, int64_t rows, int64_t k, int sms) {
  const std::optional<TopkPath> forced = forced_topk_path();
  if (forced == TopkPath::kFilter && filter_applies) return TopkPath::kFilter;
  if (forced == TopkPath::kChunked && chunked_applies) return TopkPath::kChunked;
  if (forced == TopkPath::kWholeRows) return TopkPath::kWholeRows;
  const bool few_rows_large_k = 4 * rows <= sms && k > kChunkedPreferredAboveK;
  if (filter_applies && !(few_rows_large_k && chunked_applies)) return TopkPath::kFilter;
  return chunked_applies ? TopkPath::kChunked : TopkPath::kWholeRows;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> topk_log_probs_cuda(const at::Tensor& logits, int64_t k) {
  check_cuda(logits, "logits");
  TORCH_CHECK(logits.dim() == 3, "logits must be [B, L, V]");
  const int64_t batch = logits.size(0), depth = logits.size(1), vocab = logits.size(2);
  TORCH_CHECK(vocab >= 1 && vocab < (int64_t{1} << 31), "vocabulary size out of range");
  TORCH_CHECK(k >= 1 && k <= vocab && k <= kMaxBudget, "k must be in [1, min(V, ", kMaxBudget, ")]");
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor contiguous = logits.contiguous();
  at::Tensor log_probs = at::empty({batch, depth, k}, logits.options().dtype(at::kFloat));
  at::Tensor ids = at::empty({batch, depth, k}, logits.options().dtype(at::kLong));
  at::Tensor invalid_rows = at::empty({batch, depth}, logits.options().dtype(at::kBool));
  const int64_t rows = batch * depth;
  if (rows > 0) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    int sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, logits.device().index()));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, contiguous.scalar_type(), "ddtree_topk_log_probs", [&] {
      TORCH_CHECK(contiguous.scalar_type() != at::kDouble, "float64 logits are not supported");
      if constexpr (!std::is_same_v<scalar_t, double>) {
        // The chunked path applies while rows are fewer than SMs (with many rows its per-chunk selection passes
        // cost more than the whole-row kernel: batch 16 on an H200, 229 vs 173 us).
        const FilterPlan filter = plan_filter<scalar_t>(contiguous, rows, vocab, k, sms);
        const ChunkPlan plan = rows < sms
                                   ? plan_chunks(vocab, k, chunk_smem_limits<scalar_t>(logits.device().index()))
                                   : ChunkPlan{0, 0};
        switch (choose_topk_path(filter.groups > 0, plan.chunk > 0, rows, k, sms)) {
          case TopkPath::kFilter:
            launch_filtered<scalar_t>(contiguous, rows, vocab, static_cast<int>(k), filter, sms, log_probs, ids,
                                      invalid_rows, stream);
            break;
          case TopkPath::kChunked:
            launch_chunked<scalar_t>(contiguous, rows, vocab, static_cast<int>(k), plan, log_probs, ids, invalid_rows,
                                     stream);
            break;
          case TopkPath::kWholeRows:
            launch_whole_rows<scalar_t>(contiguous, rows, vocab, static_cast<int>(k), sms, log_probs, ids,
                                        invalid_rows, stream);
            break;
        }
      }
    });
  }
  return {log_probs, ids, invalid_rows.any(1)};
}

}  // namespace ddtree
