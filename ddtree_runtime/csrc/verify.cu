// Everything a tree-verify forward needs, from the built tree: verify tokens, positions, ancestor masks (dense
// [B, N, N] and SGLang's flat FULL_MASK layout) and EAGLE-style retrieve lists; then the greedy acceptance walk
// over those lists and the KV-compaction slot pairs. Fixed shapes, no host synchronisation.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <cub/block/block_radix_sort.cuh>

#include "common.cuh"

namespace ddtree {
namespace {

// One block per request: tokens, positions and retrieve lists of every slot. A node's first child is the lowest
// later node whose parent it is, its next sibling the lowest later node with the same parent. Both come from one
// block-wide sort of the real nodes by (parent, index): a parent's children then sit side by side in index order.
constexpr int kParentShift = 11;  // node indices are < 2^11 (width <= kMaxBudget + 1)
constexpr uint32_t kNodeMask = (1u << kParentShift) - 1u;
constexpr uint32_t kNoKey = (kNodeMask << kParentShift) | kNodeMask;  // sorts after every real (parent, node)
static_assert(kMaxBudget + 1 <= (1 << kParentShift), "node indices must fit the sort key");

template <int kThreads, int kItems>
__global__ void __launch_bounds__(kThreads) tree_links_kernel(
    const int64_t* __restrict__ token_ids, const int64_t* __restrict__ depths, const int64_t* __restrict__ parents,
    const int64_t* __restrict__ num_nodes, const int64_t* __restrict__ root_tokens,
    const int64_t* __restrict__ seq_lens, int width, int64_t* __restrict__ input_ids,
    int64_t* __restrict__ positions, int64_t* __restrict__ retrieve_index, int64_t* __restrict__ next_token,
    int64_t* __restrict__ next_sibling) {
  using Sort = cub::BlockRadixSort<uint32_t, kThreads, kItems>;
  __shared__ typename Sort::TempStorage sort_storage;
  __shared__ uint32_t sorted[kThreads * kItems];
  __shared__ int child_of[kMaxBudget + 1], sibling_of[kMaxBudget + 1];
  const int64_t request = blockIdx.x;
  const int64_t base = request * width;
  const int n = static_cast<int>(min(num_nodes[request], static_cast<int64_t>(width - 1)));
  for (int i = threadIdx.x; i < width; i += kThreads) {
    child_of[i] = static_cast<int>(kNoNode);
    sibling_of[i] = static_cast<int>(kNoNode);
  }
  // Nodes 1..n, blocked: thread t holds nodes t * kItems + 1 .. (t + 1) * kItems. A parent outside the tree
  // links nothing, as no slot carries that index.
  uint32_t keys[kItems];
#pragma unroll
  for (int item = 0; item < kItems; ++item) {
    const int node = threadIdx.x * kItems + item + 1;
    const int64_t parent = node <= n ? parents[base + node] : -1;
    keys[item] = parent >= 0 && parent < width
                     ? (static_cast<uint32_t>(parent) << kParentShift) | static_cast<uint32_t>(node)
                     : kNoKey;
  }
  Sort(sort_storage).Sort(keys, 0, 2 * kParentShift);
#pragma unroll
  for (int item = 0; item < kItems; ++item) sorted[threadIdx.x * kItems + item] = keys[item];
  __syncthreads();
  for (int s = threadIdx.x; s < kThreads * kItems; s += kThreads) {
    const uint32_t key = sorted[s];
    if (key == kNoKey) continue;
    const int parent = static_cast<int>(key >> kParentShift), node = static_cast<int>(key & kNodeMask);
    const uint32_t previous = s > 0 ? sorted[s - 1] : kNoKey;
    const bool after_parent = node > parent;
    const bool first_after_parent = static_cast<int>(previous >> kParentShift) != parent ||
                                    static_cast<int>(previous & kNodeMask) <= parent;
    if (after_parent && first_after_parent) child_of[parent] = node;
    if (s + 1 < kThreads * kItems && (sorted[s + 1] >> kParentShift) == key >> kParentShift) {
      sibling_of[node] = static_cast<int>(sorted[s + 1] & kNodeMask);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < width; i += kThreads) {
    const bool real = i <= n;
    input_ids[base + i] = i == 0 ? root_tokens[request] : token_ids[request * (width - 1) + i - 1];
    positions[base + i] = seq_lens[request] + (i == 0 ? 0 : depths[request * (width - 1) + i - 1]);
    retrieve_index[base + i] = real ? base + i : kNoNode;
    next_token[base + i] = real ? child_of[i] : kNoNode;
    next_sibling[base + i] = real && i > 0 ? sibling_of[i] : kNoNode;
  }
}

// One block per (slot, request): the slot's ancestor-or-self row, dense and in the flat SGLang layout
// (seq_len visible past columns followed by the N tree columns, request blocks concatenated; a request's block
// starts after the N * (seq_len + N) elements of each earlier request).
__global__ void tree_mask_kernel(const int64_t* __restrict__ parents, const int64_t* __restrict__ num_nodes,
                                 const int64_t* __restrict__ seq_lens, int width, bool write_flat,
                                 bool* __restrict__ visibility, bool* __restrict__ flat_mask) {
  __shared__ int ancestors[kMaxDepth + 1];
  __shared__ int ancestor_count;
  const int row = blockIdx.x;
  const int64_t request = blockIdx.y;
  if (threadIdx.x == 0) {
    int count = 0, node = row;
    ancestors[count++] = node;
    if (row <= num_nodes[request]) {  // padded slots see only themselves
      while (node > 0 && count <= kMaxDepth) {
        node = static_cast<int>(parents[request * width + node]);
        ancestors[count++] = node;
      }
    }
    ancestor_count = count;
  }
  __syncthreads();
  const int count = ancestor_count;
  bool* dense_row = visibility + (request * width + row) * width;
  const int64_t seq_len = seq_lens[request];
  bool* flat_row = nullptr;
  if (write_flat) {
    int64_t offset = 0;
    for (int64_t r = 0; r < request; ++r) offset += (seq_lens[r] + width) * width;
    flat_row = flat_mask + offset + row * (seq_len + width);
  }
  for (int col = threadIdx.x; col < width; col += blockDim.x) {
    bool visible = false;
    for (int a = 0; a < count; ++a) visible |= ancestors[a] == col;
    dense_row[col] = visible;
    if (write_flat) flat_row[seq_len + col] = visible;
  }
  if (write_flat) {
    for (int64_t col = threadIdx.x; col < seq_len; col += blockDim.x) flat_row[col] = true;
  }
}

// One thread per request: walk from the root while the target's token at the current node is one of its
// children; then the slot pairs that commit the accepted path to the KV cache.
__global__ void greedy_accept_kernel(const int64_t* __restrict__ candidates, const int64_t* __restrict__ next_token,
                                     const int64_t* __restrict__ next_sibling,
                                     const int64_t* __restrict__ target_predict, const int64_t* __restrict__ starts,
                                     int64_t batch, int width, int max_depth, int64_t* __restrict__ accept_index,
                                     int64_t* __restrict__ num_accepted, int64_t* __restrict__ bonus,
                                     int64_t* __restrict__ kv_src, int64_t* __restrict__ kv_dst) {
  const int64_t request = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (request >= batch) return;
  const int64_t base = request * width;
  const int64_t out = request * (max_depth + 1);
  int64_t current = 0;
  int accepted = 1;
  accept_index[out] = 0;
  for (int level = 1; level <= max_depth; ++level) {
    const int64_t wanted = target_predict[base + current];
    int64_t found = kNoNode;
    for (int64_t probe = next_token[base + current]; probe >= 0 && probe < width; probe = next_sibling[base + probe]) {
      if (candidates[base + probe] == wanted) {
        found = probe;
        break;
      }
    }
    if (found == kNoNode) break;
    current = found;
    accept_index[out + level] = found;
    ++accepted;
  }
  for (int level = accepted; level <= max_depth; ++level) accept_index[out + level] = kNoNode;
  num_accepted[request] = accepted;
  bonus[request] = target_predict[base + current];
  const int64_t start = starts[request];
  for (int j = 0; j <= max_depth; ++j) {
    const bool live = j < accepted;
    kv_src[out + j] = live ? start + accept_index[out + j] : kNoNode;
    kv_dst[out + j] = live ? start + j : kNoNode;
  }
}

}  // namespace

std::vector<at::Tensor> tree_verify_inputs_cuda(const at::Tensor& token_ids, const at::Tensor& depths,
                                                const at::Tensor& parents, const at::Tensor& num_nodes,
                                                const at::Tensor& root_tokens, const at::Tensor& seq_lens,
                                                int64_t mask_numel) {
  for (const auto* t : {&token_ids, &depths, &parents, &num_nodes, &root_tokens, &seq_lens}) check_cuda(*t, "tree tensor");
  TORCH_CHECK(parents.dim() == 2, "parents must be [B, N]");
  const int64_t batch = parents.size(0), width = parents.size(1);
  TORCH_CHECK(width >= 1 && width <= kMaxBudget + 1, "tree width must be in [1, ", kMaxBudget + 1, "]");
  TORCH_CHECK(token_ids.sizes() == at::IntArrayRef({batch, width - 1}) && depths.sizes() == token_ids.sizes(),
              "token_ids and depths must be [B, N - 1]");
  TORCH_CHECK(num_nodes.numel() == batch && root_tokens.numel() == batch && seq_lens.numel() == batch,
              "num_nodes, root_tokens and seq_lens must have B elements");
  const c10::cuda::CUDAGuard guard(parents.device());
  const auto as_long = [](const at::Tensor& t) { return t.to(at::kLong).contiguous(); };
  const at::Tensor tokens_l = as_long(token_ids), depths_l = as_long(depths), parents_l = as_long(parents);
  const at::Tensor nodes_l = as_long(num_nodes).reshape({batch}), roots_l = as_long(root_tokens).reshape({batch});
  const at::Tensor seq_l = as_long(seq_lens).reshape({batch});
  const auto long_options = parents.options().dtype(at::kLong);
  at::Tensor input_ids = at::empty({batch, width}, long_options);
  at::Tensor positions = at::empty({batch, width}, long_options);
  at::Tensor retrieve_index = at::empty({batch, width}, long_options);
  at::Tensor next_token = at::empty({batch, width}, long_options);
  at::Tensor next_sibling = at::empty({batch, width}, long_options);
  at::Tensor visibility = at::empty({batch, width, width}, parents.options().dtype(at::kBool));
  TORCH_CHECK(mask_numel >= 0, "mask_numel must be >= 0");
  at::Tensor flat_mask = at::empty({mask_numel}, parents.options().dtype(at::kBool));
  if (batch == 0) return {input_ids, positions, visibility, flat_mask, retrieve_index, next_token, next_sibling};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto launch_links = [&](auto kernel, int threads) {
    kernel<<<static_cast<unsigned>(batch), threads, 0, stream>>>(
        tokens_l.data_ptr<int64_t>(), depths_l.data_ptr<int64_t>(), parents_l.data_ptr<int64_t>(),
        nodes_l.data_ptr<int64_t>(), roots_l.data_ptr<int64_t>(), seq_l.data_ptr<int64_t>(), static_cast<int>(width),
        input_ids.data_ptr<int64_t>(), positions.data_ptr<int64_t>(), retrieve_index.data_ptr<int64_t>(),
        next_token.data_ptr<int64_t>(), next_sibling.data_ptr<int64_t>());
  };
  if (width <= 129) {
    launch_links(tree_links_kernel<128, 1>, 128);
  } else {
    static_assert(256 * 4 >= kMaxBudget, "the sort must hold every node");
    launch_links(tree_links_kernel<256, 4>, 256);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // The caller states the flat mask's size (sum over requests of N * (seq_len + N)); 0 skips the flat layout.
  const bool write_flat = mask_numel > 0;
  const dim3 grid(static_cast<unsigned>(width), static_cast<unsigned>(batch));
  tree_mask_kernel<<<grid, 128, 0, stream>>>(parents_l.data_ptr<int64_t>(), nodes_l.data_ptr<int64_t>(),
                                             seq_l.data_ptr<int64_t>(), static_cast<int>(width), write_flat,
                                             visibility.data_ptr<bool>(),
                                             write_flat ? flat_mask.data_ptr<bool>() : nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {input_ids, positions, visibility, flat_mask, retrieve_index, next_token, next_sibling};
}

std::vector<at::Tensor> greedy_accept_cuda(const at::Tensor& candidates, const at::Tensor& next_token,
                                           const at::Tensor& next_sibling, const at::Tensor& target_predict,
                                           const at::Tensor& starts, int64_t max_depth) {
  for (const auto* t : {&candidates, &next_token, &next_sibling, &target_predict, &starts}) check_cuda(*t, "walk tensor");
  TORCH_CHECK(candidates.dim() == 2, "candidates must be [B, N]");
  TORCH_CHECK(next_token.sizes() == candidates.sizes() && next_sibling.sizes() == candidates.sizes() &&
                  target_predict.sizes() == candidates.sizes(),
              "candidates, retrieve lists and target_predict must all be [B, N]");
  TORCH_CHECK(max_depth >= 0 && max_depth <= kMaxDepth, "max_depth must be in [0, ", kMaxDepth, "]");
  const int64_t batch = candidates.size(0), width = candidates.size(1);
  TORCH_CHECK(starts.numel() == batch, "starts must have B elements");
  const c10::cuda::CUDAGuard guard(candidates.device());
  const auto as_long = [](const at::Tensor& t) { return t.to(at::kLong).contiguous(); };
  const at::Tensor cand = as_long(candidates), first = as_long(next_token), sibling = as_long(next_sibling);
  const at::Tensor predict = as_long(target_predict), start = as_long(starts).reshape({batch});
  const auto long_options = candidates.options().dtype(at::kLong);
  at::Tensor accept_index = at::empty({batch, max_depth + 1}, long_options);
  at::Tensor num_accepted = at::empty({batch}, long_options);
  at::Tensor bonus = at::empty({batch}, long_options);
  at::Tensor kv_src = at::empty({batch, max_depth + 1}, long_options);
  at::Tensor kv_dst = at::empty({batch, max_depth + 1}, long_options);
  if (batch > 0) {
    constexpr int threads = 128;
    greedy_accept_kernel<<<blocks_for(batch, threads), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        cand.data_ptr<int64_t>(), first.data_ptr<int64_t>(), sibling.data_ptr<int64_t>(), predict.data_ptr<int64_t>(),
        start.data_ptr<int64_t>(), batch, static_cast<int>(width), static_cast<int>(max_depth),
        accept_index.data_ptr<int64_t>(), num_accepted.data_ptr<int64_t>(), bonus.data_ptr<int64_t>(),
        kv_src.data_ptr<int64_t>(), kv_dst.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {accept_index, num_accepted, bonus, kv_src, kv_dst};
}

}  // namespace ddtree
