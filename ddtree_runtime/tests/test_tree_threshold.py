"""The threshold model of the CUDA tree kernel against the heap (build_tree_from_topk), element for element."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from ddtree_runtime.tree import build_tree_from_topk, depth_log_probs
from ddtree_runtime.tree_threshold import (
    CAPACITY,
    THRESHOLD_MIN_BUDGET,
    ThresholdTree,
    build_tree_threshold,
    key_scores,
    rows_allow_threshold,
    score_keys,
    select_bound,
)

STYLES = ("random", "ties", "minus_inf", "spine", "flat", "dead_level")


def make_topk(depth: int, vocab: int, k: int, style: str, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    logits = torch.randn(depth, vocab, generator=generator) * 2
    if style == "ties":
        logits = torch.round(logits)
    elif style == "minus_inf":
        logits[:, max(1, vocab // 3):] = float("-inf")
    elif style == "spine":
        logits[:, 0] += 12
    elif style == "flat":  # bf16-like coarse logits: long runs of exactly tied log-probs
        logits = torch.round(logits * 2) / 2
    elif style == "dead_level":  # every deeper node is -inf: the frontier is otherwise dry
        logits[depth // 2:] = float("-inf")
    return depth_log_probs(logits, min(k, vocab))


def assert_same_tree(ours: ThresholdTree, lp: torch.Tensor, ids: torch.Tensor, budget: int) -> None:
    expected = build_tree_from_topk(lp, ids, budget)
    assert ours.num_nodes == expected.num_nodes, ours.method
    assert np.array_equal(ours.token_ids, expected.token_ids.numpy()), ours.method
    assert np.array_equal(ours.depths, expected.depths.numpy()), ours.method
    assert np.array_equal(ours.parents, expected.parents.numpy()), ours.method
    assert np.array_equal(ours.ranks, expected.ranks.numpy()), ours.method
    # Scores bit for bit (-inf included): compare the order-preserving keys.
    assert np.array_equal(score_keys(ours.log_probs), score_keys(expected.log_probs.numpy())), ours.method


def run_random_cases(count: int, seed: int, max_budget: int) -> collections.Counter[str]:
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    methods: collections.Counter[str] = collections.Counter()
    for case in range(count):
        style = STYLES[case % len(STYLES)]
        depth = int(rng.integers(1, 17))
        vocab = int(rng.choice([1, 2, 3, 7, 40, 300, 2000]))
        budget = int(rng.integers(0, max_budget + 1))
        width = int(rng.integers(1, max(budget, 1) + 1)) if rng.random() < 0.3 else max(budget, 1)
        lp, ids = make_topk(depth, vocab, width, style, generator)
        tree = build_tree_threshold(lp.numpy(), ids.numpy(), budget, min_budget=1)
        assert_same_tree(tree, lp, ids, budget)
        methods[tree.method] += 1
    return methods


def test_thousands_of_small_random_trees_equal_the_heap():
    methods = run_random_cases(3000, seed=1, max_budget=80)
    assert methods["threshold"] > 2000, methods
    assert methods["empty"] > 0, methods


def test_large_budgets_equal_the_heap():
    methods = run_random_cases(300, seed=2, max_budget=1024)
    assert methods["threshold"] > 200, methods


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("budget", [1, 16, 64, 256, 1024])
def test_benchmark_shapes_take_the_threshold_path(style, budget):
    generator = torch.Generator().manual_seed(budget)
    lp, ids = make_topk(15, 5000, budget, style, generator)
    tree = build_tree_threshold(lp.numpy(), ids.numpy(), budget, min_budget=1)
    assert_same_tree(tree, lp, ids, budget)
    if style != "dead_level":  # ~2^7 finite nodes, then -inf everywhere: too many ties to keep
        assert tree.method == "threshold"


def test_a_confident_drafter_at_the_benchmark_vocabulary():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(15, 151936, generator=generator)
    favourite = torch.randint(0, 151936, (15, 1), generator=generator)
    logits.scatter_add_(1, favourite, torch.full((15, 1), 14.0))
    lp, ids = depth_log_probs(logits.to(torch.bfloat16).float(), 1024)
    for budget in (16, 64, 256, 1024):
        tree = build_tree_threshold(lp[:, :budget].numpy(), ids[:, :budget].numpy(), budget, min_budget=1)
        assert tree.method == "threshold"
        assert tree.selections <= 4
        assert_same_tree(tree, lp[:, :budget], ids[:, :budget], budget)


def test_a_lattice_smaller_than_the_budget_is_taken_whole():
    generator = torch.Generator().manual_seed(4)
    lp, ids = make_topk(3, 2, 2, "random", generator)
    tree = build_tree_threshold(lp.numpy(), ids.numpy(), 100, min_budget=1)
    assert tree.method == "threshold" and tree.num_nodes == 2 + 4 + 8
    assert_same_tree(tree, lp, ids, 100)


def test_minus_inf_levels_are_ordered_by_rank_path():
    lp = torch.tensor([[-0.5, -1.0, -2.0], [float("-inf")] * 3, [float("-inf")] * 3])
    ids = torch.arange(9).reshape(3, 3)
    for budget in (3, 5, 9, 30):
        tree = build_tree_threshold(lp.numpy(), ids.numpy(), budget, min_budget=1)
        assert_same_tree(tree, lp, ids, budget)


def test_overflowing_the_capacity_falls_back_to_the_sequential_loop():
    generator = torch.Generator().manual_seed(5)
    lp, ids = make_topk(6, 40, 40, "ties", generator)
    tree = build_tree_threshold(lp.numpy(), ids.numpy(), 40, capacity=40, min_budget=1)
    assert tree.method == "sequential"
    assert_same_tree(tree, lp, ids, 40)
    roomy = build_tree_threshold(lp.numpy(), ids.numpy(), 40, capacity=CAPACITY, min_budget=1)
    assert roomy.method == "threshold"
    assert_same_tree(roomy, lp, ids, 40)


def test_exact_ties_at_the_bound_beyond_the_capacity_fall_back():
    # 63 depth-1 nodes and 64 depth-2 nodes all score -1, the budget's bound: no bound separates them.
    lp = torch.full((3, 64), -1.0)
    lp[0, 0] = 0.0
    ids = torch.arange(64).repeat(3, 1)
    tree = build_tree_threshold(lp.numpy(), ids.numpy(), 64, capacity=100, min_budget=1)
    assert tree.method == "sequential"
    assert_same_tree(tree, lp, ids, 64)
    assert build_tree_threshold(lp.numpy(), ids.numpy(), 64, capacity=128, min_budget=1).method == "threshold"


@pytest.mark.parametrize("bad", ["increasing", "positive", "nan"])
def test_rows_the_threshold_path_cannot_order_take_the_sequential_loop(bad):
    lp = torch.tensor([[-0.1, -0.7, -2.0], [-0.3, -0.4, -5.0]])
    if bad == "increasing":
        lp[1, 2] = -0.2
    elif bad == "positive":
        lp[0, 0] = 0.5
    else:
        lp[1, 1] = float("nan")
    ids = torch.arange(6).reshape(2, 3)
    assert not rows_allow_threshold(lp.numpy())
    tree = build_tree_threshold(lp.numpy(), ids.numpy(), 5, min_budget=1)
    assert tree.method == "sequential"
    if bad != "nan":  # NaN has no defined order; only the path decision matters
        assert_same_tree(tree, lp, ids, 5)


def test_only_the_first_k_columns_are_checked_and_used():
    lp = torch.tensor([[-0.1, -0.2, 5.0], [-0.3, -0.4, float("nan")]])
    ids = torch.arange(6).reshape(2, 3)
    tree = build_tree_threshold(lp.numpy(), ids.numpy(), 2, min_budget=1)
    assert tree.method == "threshold"
    assert_same_tree(tree, lp, ids, 2)


def test_budgets_below_the_kernel_cutover_take_the_sequential_loop():
    generator = torch.Generator().manual_seed(6)
    lp, ids = make_topk(15, 5000, 256, "spine", generator)
    for budget, method in ((THRESHOLD_MIN_BUDGET - 1, "sequential"), (THRESHOLD_MIN_BUDGET, "threshold")):
        tree = build_tree_threshold(lp[:, :budget].numpy(), ids[:, :budget].numpy(), budget)
        assert tree.method == method
        assert_same_tree(tree, lp[:, :budget], ids[:, :budget], budget)


def test_root_only_trees_and_argument_errors():
    lp, ids = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long)
    assert build_tree_threshold(lp.numpy(), ids.numpy(), 0).method == "empty"
    assert build_tree_threshold(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64), 5).num_nodes == 0
    assert build_tree_threshold(lp.numpy(), ids.numpy(), 0).parents.tolist() == [-1]
    with pytest.raises(ValueError, match="budget"):
        build_tree_threshold(lp.numpy(), ids.numpy(), -1)
    with pytest.raises(ValueError, match=r"\[L, K\]"):
        build_tree_threshold(lp.numpy(), ids[:, :2].numpy(), 3)


def test_score_keys_preserve_the_order_and_round_trip():
    scores = np.array([float("-inf"), -1e300, -2.5, -1e-300, -0.0, 0.0, 1e-300, 3.0, float("inf")])
    keys = score_keys(scores)
    assert np.all(keys[1:-1] >= keys[:-2])
    assert keys[4] == keys[5]  # -0.0 folds onto +0.0
    assert np.all(np.diff(keys.astype(object))[[0, 1, 2, 3, 5, 6, 7]] > 0)
    assert np.array_equal(key_scores(keys), np.where(scores == 0, 0.0, scores))
    assert (keys > 0).all()  # key 0 lies below every score: the initial "keep everything" bound


@pytest.mark.parametrize("seed", range(20))
def test_select_bound_is_a_tight_lower_bound_of_the_ranked_key(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 3000))
    scores = -np.abs(rng.standard_normal(size)) * 10
    if seed % 3 == 0:
        scores = np.round(scores)  # ties
    if seed % 4 == 0:
        scores[: size // 4] = float("-inf")
    keys = score_keys(scores)
    descending = np.sort(keys)[::-1]
    for rank in sorted({1, size, max(1, size // 2), int(rng.integers(1, size + 1))}):
        bound = select_bound(keys, rank)
        assert bound is not None
        exact = int(descending[rank - 1])
        assert bound <= exact
        assert int((keys >= np.uint64(bound)).sum()) >= rank
        # Within the 24-bit key prefix of the exact key, and a key that is present.
        assert bound >> 40 == exact >> 40
        assert bound in set(keys.tolist())
    assert select_bound(keys, size + 1) is None
    assert select_bound(keys, 0) is None


def test_select_bound_is_exact_when_a_bin_closes_the_count():
    keys = score_keys(np.array([-1.0, -2.0, -3.0, -4.0]))
    assert [select_bound(keys, r) for r in (1, 2, 3, 4)] == [int(k) for k in keys]
