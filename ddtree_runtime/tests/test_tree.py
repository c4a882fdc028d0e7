from __future__ import annotations

import itertools
import math

import pytest
import torch
from ddtree_runtime.tree import (
    NO_NODE,
    DraftTree,
    build_chain_tree,
    build_tree,
    build_tree_batch,
    build_tree_batch_from_topk,
    build_tree_from_topk,
    depth_log_probs,
    ranked_topk,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def brute_force_scores(logits: torch.Tensor) -> list[float]:
    """Every prefix's float64 score, computed with the documented fold over full-vocabulary log-probs."""
    depth_limit, vocab = logits.shape
    lp, ids = depth_log_probs(logits, vocab)
    by_token = [dict(zip(ids[d].tolist(), lp[d].double().tolist(), strict=True)) for d in range(depth_limit)]
    scores = []
    for depth in range(1, depth_limit + 1):
        for prefix in itertools.product(range(vocab), repeat=depth):
            score = 0.0
            for d, token in enumerate(prefix):
                score += by_token[d][token]
            scores.append(score)
    return scores


def prefix_tokens(tree: DraftTree, node: int) -> tuple[int, ...]:
    return tuple(tree.token_ids[i - 1].item() for i in tree.path_to(node)[1:])


def assert_valid_tree(tree: DraftTree, logits: torch.Tensor, budget: int, max_topk: int | None = None) -> None:
    depth_limit, vocab = logits.shape
    n = tree.num_nodes
    k = min(budget, vocab, max_topk or vocab)
    available = sum(k**d for d in range(1, depth_limit + 1)) if budget else 0
    assert n == min(budget, available)
    assert tree.parents[0].item() == NO_NODE
    parents = tree.parents.tolist()
    depths = [0, *tree.depths.tolist()]
    for i in range(1, n + 1):
        assert 0 <= parents[i] < i
        assert depths[i] == depths[parents[i]] + 1 <= depth_limit
    for children in tree.child_maps:
        assert len(set(children)) == len(children)
    assert sum(len(children) for children in tree.child_maps) == n
    scores = tree.log_probs.tolist()
    assert not any(math.isnan(s) for s in scores)
    assert all(a >= b for a, b in itertools.pairwise(scores))
    expected_vis = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    for i in range(n + 1):
        for j in tree.path_to(i):
            expected_vis[i, j] = True
    assert torch.equal(tree.visibility, expected_vis)
    assert torch.equal(tree.visibility.sum(dim=1), torch.tensor(depths) + 1)
    if n == 0:
        return
    _unused, ids = depth_log_probs(logits, k)
    for i in range(1, n + 1):
        assert tree.token_ids[i - 1].item() == ids[depths[i] - 1, tree.ranks[i - 1]].item()
    assert len({prefix_tokens(tree, i) for i in range(1, n + 1)}) == n


logit_values = st.one_of(
    st.floats(min_value=-8, max_value=8, allow_nan=False),
    st.sampled_from([float("-inf"), 0.0, 1.0]),  # exact ties and masked tokens
)


@st.composite
def logits_and_budget(draw: st.DrawFn, max_depth: int = 4, max_vocab: int = 5) -> tuple[torch.Tensor, int]:
    depth_limit = draw(st.integers(1, max_depth))
    vocab = draw(st.integers(1, max_vocab))
    values = draw(st.lists(logit_values, min_size=depth_limit * vocab, max_size=depth_limit * vocab))
    budget = draw(st.integers(0, 40))
    return torch.tensor(values, dtype=torch.float32).reshape(depth_limit, vocab), budget


@settings(max_examples=150, deadline=None)
@given(logits_and_budget())
def test_tree_is_valid_for_any_logits_including_ties_and_minus_inf(case):
    logits, budget = case
    tree = build_tree(logits, budget)
    assert_valid_tree(tree, logits, budget)


@settings(max_examples=60, deadline=None)
@given(logits_and_budget(max_depth=3, max_vocab=4), st.integers(1, 3))
def test_capped_topk_tree_is_valid(case, max_topk):
    logits, budget = case
    assert_valid_tree(build_tree(logits, budget, max_topk=max_topk), logits, budget, max_topk)


@pytest.mark.parametrize("seed", range(40))
def test_tree_holds_exactly_the_most_probable_prefixes(seed):
    generator = torch.Generator().manual_seed(seed)
    depth_limit = 1 + seed % 4
    vocab = 2 + seed % 4
    logits = torch.randn(depth_limit, vocab, generator=generator) * 2
    if seed % 5 == 0:
        logits[0, 0] = float("-inf")
    scores = sorted(brute_force_scores(logits), reverse=True)
    total = len(scores)
    for budget in sorted({*range(0, min(total, 24)), total // 2, total - 1, total, total + 1}):
        tree = build_tree(logits, budget)
        assert tree.log_probs.tolist() == scores[: min(budget, len(scores))]


def test_tree_scores_are_the_products_of_marginals():
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(3))
    tree = build_tree(logits, 20)
    log_q = torch.log_softmax(logits.double(), dim=-1)
    for i in range(1, tree.num_nodes + 1):
        expected = sum(log_q[d, t].item() for d, t in enumerate(prefix_tokens(tree, i)))
        assert tree.log_probs[i - 1].item() == pytest.approx(expected, abs=1e-6)


def test_budget_zero_or_no_depth_is_a_root_only_tree():
    for tree in (build_tree(torch.randn(4, 8), 0), build_tree(torch.zeros(0, 8), 5)):
        assert tree.num_nodes == 0
        assert tree.parents.tolist() == [NO_NODE]
        assert tree.visibility.tolist() == [[True]]
        assert tree.retrieve_lists().retrieve_next_token.tolist() == [NO_NODE]


def test_tiny_vocabulary_exhausts_the_heap():
    tree = build_tree(torch.randn(2, 2), 100)
    assert tree.num_nodes == 2 + 4
    assert build_tree(torch.randn(3, 1), 100).num_nodes == 3


def test_minus_inf_rows_never_produce_nan():
    logits = torch.full((3, 4), float("-inf"))
    logits[1, 2] = 0.0
    tree = build_tree(logits, 30)
    assert not torch.isnan(tree.log_probs).any()
    assert tree.num_nodes == 30
    assert torch.isneginf(tree.log_probs).all()


def test_minus_inf_tokens_come_after_every_finite_prefix():
    logits = torch.tensor([[0.0, float("-inf"), 1.0], [2.0, 0.5, float("-inf")]])
    tree = build_tree(logits, 12)
    finite = torch.isfinite(tree.log_probs)
    first_infinite = int((~finite).nonzero()[0]) if (~finite).any() else tree.num_nodes
    assert finite[:first_infinite].all() and not finite[first_infinite:].any()
    assert int(finite.sum()) == 2 + 4


def test_invalid_logits_and_budgets_are_rejected():
    with pytest.raises(ValueError, match="NaN"):
        build_tree(torch.tensor([[0.0, float("nan")]]), 2)
    with pytest.raises(ValueError, match=r"\+inf"):
        build_tree(torch.tensor([[0.0, float("inf")]]), 2)
    with pytest.raises(ValueError, match="budget"):
        build_tree(torch.zeros(2, 3), -1)
    with pytest.raises(ValueError, match=r"\[L, V\]"):
        build_tree(torch.zeros(3), 2)
    with pytest.raises(ValueError, match="max_topk"):
        build_tree(torch.zeros(2, 3), 2, max_topk=0)


def test_ties_are_broken_by_token_id_then_by_rank_path():
    tree = build_tree(torch.zeros(2, 3), 12)
    # All prefixes of a depth tie; depth-1 prefixes (score log 1/3) beat depth-2 ones (log 1/9).
    assert tree.token_ids[:3].tolist() == [0, 1, 2]
    assert tree.parents[4:].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert tree.token_ids[3:].tolist() == [0, 1, 2] * 3


def test_ranked_topk_orders_by_value_then_lower_index():
    values = torch.tensor([[1.0, 3.0, 3.0, -1.0, 3.0, float("-inf"), 2.0]])
    for k in range(1, 8):
        top, ids = ranked_topk(values, k)
        order = sorted(range(7), key=lambda i: (-values[0, i].item(), i))[:k]
        assert ids[0].tolist() == order
        assert top[0].tolist() == [values[0, i].item() for i in order]
    with pytest.raises(ValueError):
        ranked_topk(values, 0)


@pytest.mark.parametrize("seed", range(10))
def test_trees_nest_and_surrogate_acceptance_grows_with_budget(seed):
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(seed)) * 3
    previous = build_tree(logits, 0)
    for budget in range(1, 70):
        tree = build_tree(logits, budget)
        assert tree.surrogate_acceptance() >= previous.surrogate_acceptance()
        n = previous.num_nodes
        assert torch.equal(tree.token_ids[:n], previous.token_ids)
        assert torch.equal(tree.parents[: n + 1], previous.parents)
        previous = tree


@pytest.mark.parametrize("depth_limit", [1, 4, 15])
def test_top1_tree_with_budget_at_least_depth_is_the_dflash_chain(depth_limit):
    logits = torch.randn(depth_limit, 50, generator=torch.Generator().manual_seed(depth_limit))
    for budget in (depth_limit, depth_limit + 3, 64):
        tree = build_tree(logits, budget, max_topk=1)
        chain = build_chain_tree(torch.argmax(logits, dim=-1))
        assert torch.equal(tree.token_ids, chain.token_ids)
        assert torch.equal(tree.parents, chain.parents)
        assert torch.equal(tree.visibility, chain.visibility)
        assert torch.equal(tree.depths, torch.arange(1, depth_limit + 1))


def test_full_topk_tree_at_budget_equal_depth_is_not_always_a_chain():
    """The paper's caveat: B = L with top-k = B can branch (a rank-2 token beats a deep spine node)."""
    logits = torch.tensor([[2.0, 1.9, -5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    tree = build_tree(logits, 3)
    assert tree.max_depth < 3


@st.composite
def batch_case(draw: st.DrawFn) -> tuple[torch.Tensor, list[int], int | None]:
    batch = draw(st.integers(1, 4))
    depth_limit = draw(st.integers(1, 4))
    vocab = draw(st.integers(1, 6))
    values = draw(st.lists(logit_values, min_size=batch * depth_limit * vocab, max_size=batch * depth_limit * vocab))
    budgets = draw(st.lists(st.integers(0, 24), min_size=batch, max_size=batch))
    max_topk = draw(st.one_of(st.none(), st.integers(1, 4)))
    return torch.tensor(values, dtype=torch.float32).reshape(batch, depth_limit, vocab), budgets, max_topk


def assert_trees_equal(a: DraftTree, b: DraftTree) -> None:
    for name in ("token_ids", "depths", "parents", "visibility", "log_probs", "ranks"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@settings(max_examples=120, deadline=None)
@given(batch_case())
def test_batched_pytorch_path_equals_the_heap_bit_for_bit(case):
    logits, budgets, max_topk = case
    batch = build_tree_batch(logits, budgets, max_topk)
    width = max(budgets) + 1
    assert batch.parents.shape == (len(budgets), width)
    for b, budget in enumerate(budgets):
        single = build_tree(logits[b], budget, max_topk)
        assert_trees_equal(batch.tree(b), single)
        n = single.num_nodes
        assert batch.num_nodes[b].item() == n
        # Padding: sentinel -1 tokens, unlinked, self-only visibility, and no duplicated sibling.
        assert (batch.token_ids[b, n:] == NO_NODE).all()
        assert (batch.parents[b, n + 1 :] == NO_NODE).all()
        for slot in range(n + 1, width):
            assert batch.visibility[b, slot].nonzero().flatten().tolist() == [slot]


def test_batched_path_on_a_large_vocabulary_matches_the_heap():
    logits = torch.randn(3, 15, 2000, generator=torch.Generator().manual_seed(0)) * 4
    logits[1, :, 100:] = float("-inf")
    budgets = [64, 0, 200]
    batch = build_tree_batch(logits, budgets)
    for b, budget in enumerate(budgets):
        assert_trees_equal(batch.tree(b), build_tree(logits[b], budget))


def test_batch_rejects_bad_shapes_and_budgets():
    with pytest.raises(ValueError, match="B, L, V"):
        build_tree_batch(torch.zeros(2, 3), [1, 1])
    with pytest.raises(ValueError, match="budgets"):
        build_tree_batch(torch.zeros(2, 3, 4), [1])
    with pytest.raises(ValueError, match=">= 0"):
        build_tree_batch(torch.zeros(1, 3, 4), [-2])


def test_positions_masks_and_verify_ids():
    tree = build_tree(torch.tensor([[3.0, 2.0, 0.0], [1.0, 0.0, 0.0]]), 4)
    assert tree.depths.tolist() == [1, 2, 1, 2]
    assert tree.positions(10).tolist() == [10, *(10 + tree.depths).tolist()]
    assert tree.verify_input_ids(7).tolist() == [7, *tree.token_ids.tolist()]
    mask = tree.attention_mask(past_len=5)
    assert mask.shape == (5, 10)
    assert mask[:, :5].all()
    assert torch.equal(mask[:, 5:], tree.visibility)
    assert torch.equal(tree.flat_attention_mask(5), mask.reshape(-1))
    additive = tree.additive_attention_mask(5, torch.float32)
    assert (additive[mask] == 0).all()
    assert (additive[~mask] == torch.finfo(torch.float32).min).all()


def children_by_links(next_token: list[int], next_sibling: list[int], node: int) -> list[int]:
    children, child = [], next_token[node]
    while child != NO_NODE:
        children.append(child)
        child = next_sibling[child]
    return children


@settings(max_examples=60, deadline=None)
@given(batch_case())
def test_retrieve_lists_encode_the_parent_array(case):
    logits, budgets, max_topk = case
    batch = build_tree_batch(logits, budgets, max_topk)
    lists = batch.retrieve_lists()
    width = batch.width
    for b in range(len(budgets)):
        n = int(batch.num_nodes[b])
        parents = batch.parents[b].tolist()
        next_token = lists.retrieve_next_token[b].tolist()
        next_sibling = lists.retrieve_next_sibling[b].tolist()
        for node in range(n + 1):
            expected = [i for i in range(1, n + 1) if parents[i] == node]
            assert children_by_links(next_token, next_sibling, node) == expected
        assert lists.retrieve_index[b].tolist() == [b * width + i if i <= n else NO_NODE for i in range(width)]
        assert next_token[n + 1 :] == [NO_NODE] * (width - n - 1)
        assert next_sibling[n + 1 :] == [NO_NODE] * (width - n - 1)
        single = batch.tree(b).retrieve_lists()
        assert single.retrieve_next_token.tolist() == next_token[: n + 1]


def test_batch_positions_ids_and_flat_mask_layout():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1))
    batch = build_tree_batch(logits, [4, 2])
    positions = batch.positions(torch.tensor([7, 20]))
    assert positions[0].tolist() == [7, *(7 + batch.depths[0]).tolist()]
    ids = batch.verify_input_ids(torch.tensor([1, 2]))
    assert ids[1].tolist()[3:] == [NO_NODE, NO_NODE]
    flat = batch.flat_attention_mask([3, 1])
    assert flat.numel() == 5 * (3 + 5) + 5 * (1 + 5)
    first = flat[: 5 * 8].reshape(5, 8)
    assert torch.equal(first[:, 3:], batch.visibility[0])
    assert first[:, :3].all()


@settings(max_examples=60, deadline=None)
@given(batch_case())
def test_topk_entry_points_equal_the_logit_entry_points(case):
    logits, budgets, max_topk = case
    vocab = logits.shape[-1]
    k = min(max(budgets), vocab, max_topk or vocab)
    if k == 0:
        return
    log_probs, ids = depth_log_probs(logits, k)
    batch = build_tree_batch_from_topk(log_probs, ids, budgets)
    for b, budget in enumerate(budgets):
        expected = build_tree(logits[b], budget, max_topk)
        assert_trees_equal(build_tree_from_topk(log_probs[b], ids[b], budget), expected)
        assert_trees_equal(batch.tree(b), expected)


def test_topk_entry_points_validate_inputs():
    lp, ids = depth_log_probs(torch.randn(3, 5), 2)
    with pytest.raises(ValueError, match="float32"):
        build_tree_from_topk(lp.double(), ids, 2)
    with pytest.raises(ValueError, match=r"\[L, K\]"):
        build_tree_from_topk(lp, ids[:, :1], 2)
    with pytest.raises(ValueError, match="budgets"):
        build_tree_batch_from_topk(lp[None], ids[None], [1, 2])
    assert build_tree_from_topk(lp, ids, 0).num_nodes == 0
    assert build_tree_batch(torch.zeros(0, 3, 4), []).batch_size == 0
