// Fused per-depth top-K and log-normaliser over drafter logits. One read of each row computes the logsumexp
// and the histogram of the top radix digit; radix-select refinement passes (served from L2) narrow the K-th
// largest key; a collect pass and a shared-memory bitonic sort by (logit desc, token id asc) finish.
//
// Histograms are kept per lane (bin * 32 + lane), so the shared-memory atomics of a warp never collide. When
// there are fewer rows than SMs, each row's first pass is split over several blocks: they add their digit
// histograms and logsumexp partials into global scratch, and the last block to finish carries on with the
// whole row.
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cmath>

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

// Warp 0: the bin holding the `needed`-th largest element, scanning bins from the top.
__device__ void choose_bin(const uint32_t* hist, int bins, int needed, BinChoice* out) {
  const int lane = threadIdx.x & 31;
  const int per_lane = (bins + 31) / 32;
  int sum = 0;
  for (int j = 0; j < per_lane; ++j) {
    const int b = bins - 1 - (lane * per_lane + j);
    if (b >= 0) sum += static_cast<int>(hist[b]);
  }
  int inclusive = sum;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
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

__device__ __forceinline__ int next_pow2(int n) {
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
                                                              bool* __restrict__ out_invalid) {
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

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> topk_log_probs_cuda(const at::Tensor& logits, int64_t k) {
  check_cuda(logits, "logits");
  TORCH_CHECK(logits.dim() == 3, "logits must be [B, L, V]");
  const int64_t batch = logits.size(0), depth = logits.size(1), vocab = logits.size(2);
  TORCH_CHECK(vocab >= 1 && vocab < (int64_t{1} << 31), "vocabulary size out of range");
  TORCH_CHECK(k >= 1 && k <= vocab && k <= kMaxBudget, "k must be in [1, min(V, ", kMaxBudget, ")]");
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor contiguous = logits.contiguous();
  const auto float_options = logits.options().dtype(at::kFloat);
  at::Tensor log_probs = at::empty({batch, depth, k}, float_options);
  at::Tensor ids = at::empty({batch, depth, k}, logits.options().dtype(at::kLong));
  at::Tensor invalid_rows = at::empty({batch, depth}, logits.options().dtype(at::kBool));
  const int64_t rows = batch * depth;
  if (rows > 0) {
    int sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, logits.device().index()));
    const int threads = rows >= sms ? 512 : 1024;
    // Fewer rows than SMs: split each row's first pass so that about one block per SM works.
    const int64_t by_sms = rows >= sms ? 1 : sms / rows;
    const int splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({by_sms, kMaxSplits, vocab / kMinSplitLength})));
    at::Tensor scratch, partials;
    if (splits > 1) {
      scratch = at::zeros({rows * kScratchWords}, logits.options().dtype(at::kInt));
      partials = at::empty({rows * splits * 2}, float_options);
    }
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, contiguous.scalar_type(), "ddtree_topk_log_probs", [&] {
      TORCH_CHECK(contiguous.scalar_type() != at::kDouble, "float64 logits are not supported");
      if constexpr (!std::is_same_v<scalar_t, double>) {
        topk_log_probs_kernel<scalar_t><<<static_cast<unsigned>(rows * splits), threads, 0, stream>>>(
            contiguous.data_ptr<scalar_t>(), vocab, static_cast<int>(k), splits,
            splits > 1 ? reinterpret_cast<uint32_t*>(scratch.data_ptr<int32_t>()) : nullptr,
            splits > 1 ? partials.data_ptr<float>() : nullptr, log_probs.data_ptr<float>(), ids.data_ptr<int64_t>(),
            invalid_rows.data_ptr<bool>());
      }
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {log_probs, ids, invalid_rows.any(1)};
}

}  // namespace ddtree
