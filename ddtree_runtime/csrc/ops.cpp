// Registers the ddtree_runtime operators (CUDA implementations) with the PyTorch dispatcher. Importing the
// ddtree_runtime._C module loads them; Python reaches them as torch.ops.ddtree_runtime.<name>.
#include <Python.h>
#include <torch/library.h>

#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace ddtree {
std::tuple<at::Tensor, at::Tensor, at::Tensor> topk_log_probs_cuda(const at::Tensor& logits, int64_t k);
std::vector<at::Tensor> build_tree_cuda(const at::Tensor& log_probs, const at::Tensor& top_ids,
                                        const at::Tensor& budgets, int64_t max_budget);
std::vector<at::Tensor> tree_verify_inputs_cuda(const at::Tensor& token_ids, const at::Tensor& depths,
                                                const at::Tensor& parents, const at::Tensor& num_nodes,
                                                const at::Tensor& root_tokens, const at::Tensor& seq_lens,
                                                int64_t mask_numel);
std::vector<at::Tensor> greedy_accept_cuda(const at::Tensor& candidates, const at::Tensor& next_token,
                                           const at::Tensor& next_sibling, const at::Tensor& target_predict,
                                           const at::Tensor& starts, int64_t max_depth);

namespace {

template <size_t... I>
auto as_tuple(const std::vector<at::Tensor>& v, std::index_sequence<I...>) {
  return std::make_tuple(v[I]...);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> build_tree(
    const at::Tensor& log_probs, const at::Tensor& top_ids, const at::Tensor& budgets, int64_t max_budget) {
  return as_tuple(build_tree_cuda(log_probs, top_ids, budgets, max_budget), std::make_index_sequence<6>{});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree_verify_inputs(
    const at::Tensor& token_ids, const at::Tensor& depths, const at::Tensor& parents, const at::Tensor& num_nodes,
    const at::Tensor& root_tokens, const at::Tensor& seq_lens, int64_t mask_numel) {
  return as_tuple(tree_verify_inputs_cuda(token_ids, depths, parents, num_nodes, root_tokens, seq_lens, mask_numel),
                  std::make_index_sequence<7>{});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> greedy_accept(
    const at::Tensor& candidates, const at::Tensor& next_token, const at::Tensor& next_sibling,
    const at::Tensor& target_predict, const at::Tensor& starts, int64_t max_depth) {
  return as_tuple(greedy_accept_cuda(candidates, next_token, next_sibling, target_predict, starts, max_depth),
                  std::make_index_sequence<5>{});
}

}  // namespace
}  // namespace ddtree

TORCH_LIBRARY(ddtree_runtime, m) {
  m.def("topk_log_probs(Tensor logits, int k) -> (Tensor log_probs, Tensor ids, Tensor invalid)");
  m.def(
      "build_tree(Tensor log_probs, Tensor top_ids, Tensor budgets, int max_budget) -> (Tensor token_ids, "
      "Tensor depths, Tensor parents, Tensor scores, Tensor ranks, Tensor num_nodes)");
  m.def(
      "tree_verify_inputs(Tensor token_ids, Tensor depths, Tensor parents, Tensor num_nodes, Tensor root_tokens, "
      "Tensor seq_lens, int mask_numel) -> (Tensor input_ids, Tensor positions, Tensor visibility, "
      "Tensor flat_mask, Tensor retrieve_index, Tensor retrieve_next_token, Tensor retrieve_next_sibling)");
  m.def(
      "greedy_accept(Tensor candidates, Tensor retrieve_next_token, Tensor retrieve_next_sibling, "
      "Tensor target_predict, Tensor starts, int max_depth) -> (Tensor accept_index, Tensor num_accepted, "
      "Tensor bonus, Tensor kv_src, Tensor kv_dst)");
}

TORCH_LIBRARY_IMPL(ddtree_runtime, CUDA, m) {
  m.impl("topk_log_probs", &ddtree::topk_log_probs_cuda);
  m.impl("build_tree", &ddtree::build_tree);
  m.impl("tree_verify_inputs", &ddtree::tree_verify_inputs);
  m.impl("greedy_accept", &ddtree::greedy_accept);
}

// A plain extension module: importing it runs the registrations above.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "ddtree_runtime CUDA operators", -1, nullptr};
  return PyModule_Create(&module);
}
