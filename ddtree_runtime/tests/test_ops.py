"""ddtree_runtime.ops on any machine: the PyTorch fallback, argument checks and the build switch.

The kernels themselves are compared with the reference in test_ops_cuda.py (GPU only).
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import setuptools
import torch
from ddtree_runtime.tree import build_tree, build_tree_batch, depth_log_probs
from ddtree_runtime.verify import follow_greedy, kv_compaction_indices, kv_compaction_indices_batch

from ddtree_runtime import ops

SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"


@pytest.fixture
def cpu_fallback(monkeypatch):
    """Force the fallback path and let it announce itself again."""
    monkeypatch.setattr(ops, "_EXTENSION_ERROR", "test: no extension")
    monkeypatch.setattr(ops, "_fallback_announced", False)


def random_logits(batch: int, depth: int, vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, depth, vocab, generator=generator) * 3
    if batch > 1:
        logits[1] = torch.round(logits[1])  # exact ties
    return logits


def test_extension_availability_matches_the_build():
    built = importlib.util.find_spec("ddtree_runtime._C") is not None
    assert ops.extension_available() == built
    if not built:
        assert "ddtree_runtime._C" in (ops.extension_error() or "")


def test_fallback_is_announced_once(cpu_fallback):
    logits = random_logits(2, 3, 50, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ops.topk_log_probs(logits, 4)
        ops.build_tree(logits, [4, 2])
    notices = [w for w in caught if "PyTorch path" in str(w.message)]
    assert len(notices) == 1
    assert "test: no extension" in str(notices[0].message)


def test_topk_fallback_equals_depth_log_probs_and_flags_bad_rows(cpu_fallback):
    logits = random_logits(3, 4, 100, seed=1)
    clean = logits.clone()
    logits[1, 2, 7] = float("nan")
    logits[2, 0, 3] = float("inf")
    top = ops.topk_log_probs(logits, 10)
    assert top.invalid.tolist() == [False, True, True]
    expected_lp, expected_ids = depth_log_probs(clean[:1], 10)
    assert torch.equal(top.log_probs[0], expected_lp[0]) and torch.equal(top.ids[0], expected_ids[0])
    assert top.log_probs.dtype == torch.float32 and top.ids.dtype == torch.long


def test_build_tree_fallback_pads_to_max_budget(cpu_fallback):
    logits = random_logits(3, 5, 64, seed=2)
    budgets = [7, 0, 20]
    top, tree = ops.build_tree(logits, budgets, max_budget=32)
    reference = build_tree_batch(logits, budgets)  # width max(budgets) = 20
    assert tree.token_ids.shape == (3, 32) and tree.parents.shape == (3, 33)
    assert torch.equal(tree.num_nodes, reference.num_nodes)
    assert torch.equal(tree.token_ids[:, :20], reference.token_ids)
    assert torch.equal(tree.parents[:, :21], reference.parents)
    assert torch.equal(tree.log_probs[:, :20], reference.log_probs)
    assert torch.equal(tree.depths[:, :20], reference.depths) and torch.equal(tree.ranks[:, :20], reference.ranks)
    assert (tree.token_ids[:, 20:] == -1).all() and (tree.parents[:, 21:] == -1).all()
    assert (tree.depths[:, 20:] == 0).all() and torch.isneginf(tree.log_probs[:, 20:]).all()
    assert top.log_probs.shape == (3, 5, 32)


def test_build_tree_with_zero_budget_or_capped_topk(cpu_fallback):
    logits = random_logits(2, 4, 30, seed=3)
    _unused, empty = ops.build_tree(logits, [0, 0])
    assert empty.token_ids.shape == (2, 0) and empty.num_nodes.tolist() == [0, 0]
    _unused, chain = ops.build_tree(logits, [6, 3], max_topk=1)
    for b, budget in enumerate([6, 3]):
        expected = build_tree(logits[b], budget, max_topk=1)
        n = int(chain.num_nodes[b])
        assert torch.equal(chain.token_ids[b, :n], expected.token_ids)
        assert chain.depths[b, :n].tolist() == list(range(1, min(budget, 4) + 1))


def test_verify_inputs_fallback_matches_per_tree_layout(cpu_fallback):
    logits = random_logits(3, 4, 40, seed=4)
    budgets = [9, 0, 12]
    _unused, tree = ops.build_tree(logits, budgets)
    roots = torch.tensor([5, 6, 7])
    seq_lens = torch.tensor([3, 0, 11])
    verify = ops.tree_verify_inputs(tree, roots, seq_lens)
    width = tree.parents.shape[1]
    offset = 0
    for b in range(3):
        single = build_tree(logits[b], budgets[b])
        n = single.num_nodes
        assert verify.candidates[b, : n + 1].tolist() == single.verify_input_ids(int(roots[b])).tolist()
        assert (verify.candidates[b, n + 1 :] == -1).all()
        assert verify.positions[b, : n + 1].tolist() == single.positions(int(seq_lens[b])).tolist()
        assert torch.equal(verify.visibility[b, : n + 1, : n + 1], single.visibility)
        block = verify.custom_mask[offset : offset + width * (int(seq_lens[b]) + width)]
        block = block.reshape(width, int(seq_lens[b]) + width)
        assert torch.equal(block[: n + 1, : int(seq_lens[b]) + n + 1], single.attention_mask(int(seq_lens[b])))
        offset += block.numel()
        lists = single.retrieve_lists()
        assert verify.retrieve_next_token[b, : n + 1].tolist() == lists.retrieve_next_token.tolist()
        assert verify.retrieve_next_sibling[b, : n + 1].tolist() == lists.retrieve_next_sibling.tolist()
    assert offset == verify.custom_mask.numel()
    no_flat = ops.tree_verify_inputs(tree, roots, seq_lens, mask_numel=0)
    assert no_flat.custom_mask.numel() == 0 and torch.equal(no_flat.visibility, verify.visibility)


def test_verify_inputs_fallback_rejects_a_wrong_mask_size(cpu_fallback):
    _unused, tree = ops.build_tree(random_logits(1, 3, 20, seed=5), [4])
    with pytest.raises(ValueError, match="mask_numel"):
        ops.tree_verify_inputs(tree, torch.tensor([1]), torch.tensor([2]), mask_numel=7)


def test_greedy_accept_fallback_matches_follow_greedy(cpu_fallback):
    logits = random_logits(3, 6, 30, seed=6)
    logits[:, :, 3] += 30  # a confident spine, so walks go deep
    budgets = [20, 5, 0]
    _unused, tree = ops.build_tree(logits, budgets)
    starts = torch.tensor([10, 0, 4])
    verify = ops.tree_verify_inputs(tree, torch.tensor([1, 2, 3]), starts, mask_numel=0)
    predict = torch.full_like(verify.candidates, 3)
    result = ops.greedy_accept(verify, predict, starts, max_depth=6)
    for b in range(3):
        single = build_tree(logits[b], budgets[b])
        accepted, bonus = follow_greedy(single, predict[b, : single.num_nodes + 1])
        assert result.nodes[b, : len(accepted)].tolist() == accepted
        assert (result.nodes[b, len(accepted) :] == -1).all()
        assert int(result.lengths[b]) == len(accepted) and int(result.bonus[b]) == bonus
        src, dst = kv_compaction_indices(int(starts[b]), accepted)
        live = result.kv_src[b] >= 0
        pairs = [(s, d) for s, d in zip(result.kv_src[b][live].tolist(), result.kv_dst[b][live].tolist(), strict=True)
                 if s != d]
        assert pairs == list(zip(src.tolist(), dst.tolist(), strict=True))
    assert int(result.lengths[0]) > 2
    expected = kv_compaction_indices_batch(starts, result.nodes, result.lengths)
    for ours, ref in zip(ops.moving_kv_pairs(result), expected, strict=True):
        assert torch.equal(ours, ref)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ops.topk_log_probs(torch.zeros(1, 2, 8, dtype=torch.float64), 2), "bfloat16"),
        (lambda: ops.topk_log_probs(torch.zeros(2, 8), 2), r"\[B, L, V\]"),
        (lambda: ops.topk_log_probs(torch.zeros(1, 2, 8), 9), "k must be"),
        (lambda: ops.topk_log_probs(torch.zeros(1, 2, 8), 0), "k must be"),
        (lambda: ops.build_tree(torch.zeros(1, 17, 8), [2]), "depth"),
        (lambda: ops.build_tree(torch.zeros(1, 2, 8), [2000]), "max_budget"),
        (lambda: ops.build_tree(torch.zeros(1, 2, 8), [5], max_budget=4), "<= max_budget"),
        (lambda: ops.build_tree(torch.zeros(1, 2, 8), [-1]), ">= 0"),
        (lambda: ops.build_tree(torch.zeros(2, 2, 8), [1]), "need 2 budgets"),
        (lambda: ops.build_tree(torch.zeros(1, 2, 8), [2], max_topk=0), "max_topk"),
        (lambda: ops.build_tree_from_topk(torch.zeros(1, 2, 3, dtype=torch.float64), torch.zeros(1, 2, 3), [1]),
         "float32"),
        (lambda: ops.build_tree_from_topk(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), [1]), r"\[B, L, K\]"),
    ],
)
def test_invalid_arguments_are_rejected(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_greedy_accept_rejects_bad_depth_and_shapes(cpu_fallback):
    _unused, tree = ops.build_tree(random_logits(1, 3, 20, seed=7), [4])
    verify = ops.tree_verify_inputs(tree, torch.tensor([1]), torch.tensor([0]), mask_numel=0)
    with pytest.raises(ValueError, match="max_depth"):
        ops.greedy_accept(verify, torch.zeros_like(verify.candidates), torch.tensor([0]), max_depth=17)
    with pytest.raises(ValueError, match="target_predict"):
        ops.greedy_accept(verify, torch.zeros(1, 2, dtype=torch.long), torch.tensor([0]), max_depth=3)


def test_compare_with_reference_finds_no_difference_on_the_fallback(cpu_fallback):
    assert ops.compare_with_reference(torch.device("cpu")) == []


def load_setup_options(monkeypatch, value: str | None) -> dict:
    if value is None:
        monkeypatch.delenv("DDTREE_BUILD_CUDA", raising=False)
    else:
        monkeypatch.setenv("DDTREE_BUILD_CUDA", value)
    recorded: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: recorded.update(kwargs))
    monkeypatch.delitem(sys.modules, "torch.utils.cpp_extension", raising=False)
    spec = importlib.util.spec_from_file_location("ddtree_setup_under_test", SETUP_PY)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return recorded


@pytest.mark.parametrize("value", [None, "0", "", "yes"])
def test_setup_builds_pure_python_unless_asked_for_cuda(monkeypatch, value):
    assert load_setup_options(monkeypatch, value) == {}
    assert "torch.utils.cpp_extension" not in sys.modules
