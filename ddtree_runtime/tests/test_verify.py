from __future__ import annotations

import pytest
import torch
from ddtree_runtime.sampling import SamplingParams, sample_tokens, sampling_probs
from ddtree_runtime.tree import NO_NODE, build_tree, build_tree_batch
from ddtree_runtime.verify import (
    compact_kv_,
    follow_greedy,
    follow_greedy_batch,
    kv_compaction_indices,
    kv_compaction_indices_batch,
    verify_tree,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def small_tree():
    # Depth-1 tokens ranked 2 > 0 > 1, depth-2 tokens ranked 1 > 0.
    logits = torch.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, -1.0]])
    return build_tree(logits, 5)


def test_follow_greedy_walks_matching_children_and_returns_the_bonus():
    tree = small_tree()
    maps = tree.child_maps
    first = maps[0][2]
    second = maps[first][1]
    tokens = [0] * (tree.num_nodes + 1)
    tokens[0] = 2
    tokens[first] = 1
    tokens[second] = 2
    accepted, bonus = follow_greedy(tree, torch.tensor(tokens))
    assert accepted == [0, first, second]
    assert bonus == 2


def test_follow_greedy_stops_at_the_root_when_no_child_matches():
    tree = small_tree()
    missing = next(t for t in range(10) if t not in tree.child_maps[0])
    accepted, bonus = follow_greedy(tree, [missing] + [0] * tree.num_nodes)
    assert (accepted, bonus) == ([0], missing)


def test_follow_greedy_rejects_wrong_length():
    with pytest.raises(ValueError, match="target tokens"):
        follow_greedy(small_tree(), [0, 1])


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(2, 6))
def test_walk_invariants_and_batched_walk_agree(seed, batch, vocab):
    generator = torch.Generator().manual_seed(seed)
    depth_limit = 1 + seed % 4
    logits = torch.randn(batch, depth_limit, vocab, generator=generator) * 2
    budgets = torch.randint(0, 20, (batch,), generator=generator).tolist()
    trees = build_tree_batch(logits, budgets)
    width = trees.width
    predict = torch.randint(0, vocab, (batch, width), generator=generator)
    roots = torch.randint(0, vocab, (batch,), generator=generator)
    lists = trees.retrieve_lists()
    accept_index, num_accepted, bonus = follow_greedy_batch(
        trees.verify_input_ids(roots), lists.retrieve_next_token, lists.retrieve_next_sibling, predict, depth_limit
    )
    for b in range(batch):
        tree = trees.tree(b)
        accepted, expected_bonus = follow_greedy(tree, predict[b, : tree.num_nodes + 1])
        assert accept_index[b, : len(accepted)].tolist() == accepted
        assert (accept_index[b, len(accepted) :] == NO_NODE).all()
        assert num_accepted[b].item() == len(accepted)
        assert bonus[b].item() == expected_bonus
        # Walk invariants: depths 0..tau-1 along a parent chain; the bonus is not a child of the last node.
        depths = [0, *tree.depths.tolist()]
        assert [depths[i] for i in accepted] == list(range(len(accepted)))
        assert all(tree.parents[accepted[j]].item() == accepted[j - 1] for j in range(1, len(accepted)))
        assert expected_bonus not in tree.child_maps[accepted[-1]]
        assert 1 <= len(accepted) <= 1 + tree.max_depth
    starts = torch.randint(0, 50, (batch,), generator=generator)
    request, src, dst = kv_compaction_indices_batch(starts, accept_index, num_accepted)
    for b in range(batch):
        accepted = accept_index[b, : num_accepted[b]].tolist()
        expected_src, expected_dst = kv_compaction_indices(int(starts[b]), accepted)
        assert src[request == b].tolist() == expected_src.tolist()
        assert dst[request == b].tolist() == expected_dst.tolist()


def test_verify_tree_greedy_uses_argmax_at_every_node():
    tree = small_tree()
    node_logits = torch.zeros(tree.num_nodes + 1, 3)
    node_logits[0, 2] = 5.0  # root -> token 2 (a child)
    child = tree.child_maps[0][2]
    node_logits[child, 0] = 5.0  # token 0: a child of `child`
    grandchild = tree.child_maps[child][0]
    node_logits[grandchild, 1] = 5.0
    result = verify_tree(tree, node_logits, SamplingParams(), None)
    assert result.accepted == [0, child, grandchild]
    assert result.bonus == 1
    assert result.acceptance_length == 3


def test_kv_compaction_indices_list_only_moving_slots():
    src, dst = kv_compaction_indices(10, [0, 2, 5, 6])
    assert src.tolist() == [12, 15, 16]
    assert dst.tolist() == [11, 12, 13]
    src, dst = kv_compaction_indices(4, [0, 1, 2])
    assert src.numel() == dst.numel() == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12), st.integers(0, 5))
def test_compaction_equals_gathering_the_accepted_tail(keep_mask, start):
    accepted = [0] + [i for i, keep in enumerate(keep_mask, start=1) if keep]
    cache = torch.randn(2, start + len(keep_mask) + 1, 3, dtype=torch.float64)
    tail = cache[:, start + torch.tensor(accepted)].clone()
    prefix = cache[:, :start].clone()
    compact_kv_(cache, 1, start, accepted)
    assert torch.equal(cache[:, start : start + len(accepted)], tail)
    assert torch.equal(cache[:, :start], prefix)


def test_sampling_params_validation():
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"max_new_tokens": -1}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_sampling_is_reproducible_per_seed_and_respects_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    params = SamplingParams(temperature=1.0, seed=7)
    first = [int(sample_tokens(logits, params, g)) for g in [params.make_generator()] for _unused in range(20)]
    second = [int(sample_tokens(logits, params, g)) for g in [params.make_generator()] for _unused in range(20)]
    assert first == second
    top_k = sampling_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (top_k[0, 2:] == 0).all() and top_k[0, :2].sum().item() == pytest.approx(1.0)
    top_p = sampling_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert top_p[0].nonzero().flatten().tolist() == [0]
    greedy = sample_tokens(torch.tensor([[0.0, 3.0, 3.0]]), SamplingParams(), None)
    assert greedy.item() == 1
