"""The top-K kernel's filter path on CPU: its threshold keeps every top-K element, its buffers hold what a drafter
produces, and the rows it hands over are the ones the whole-row kernel must take (model: ddtree_runtime.topk_filter;
the kernel itself is held to the same reference on a GPU in test_ops_cuda.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from ddtree_runtime.tree import ranked_topk

from ddtree_runtime import topk_filter

USER_VOCAB = 248320  # Qwen3.6's vocabulary
QWEN3_VOCAB = 151936
TOPK_SOURCE = Path(__file__).parents[1] / "csrc" / "topk.cu"


def filter_path_rows(vocab: int) -> torch.Tensor:
    """``[2, 15, V]`` float32 rows that probe the filter path's threshold and its hand-over to the whole-row kernel
    (row [0, i] below; row 1 is half masked)."""
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(2, 15, vocab, generator=generator) * 3
    inf = float("inf")
    logits[0, 0] = 1.0  # a constant row: every group's largest key is the threshold -> whole-row kernel
    logits[0, 1, ::64] = 50.0  # one winner in every group: the group maxima all tie
    logits[0, 2, 1000:3048] = 30.0  # 2048 tied winners crowded into 32 groups
    logits[0, 3] = torch.round(logits[0, 3])  # bf16-like ties everywhere
    logits[0, 4, 5000:] = -inf  # a mostly masked vocabulary
    logits[0, 5] = -inf
    logits[0, 5, 7] = 0.0  # one finite logit
    logits[0, 6, -1] = 100.0  # the last token of the row wins
    logits[0, 7, :64] = 40.0  # the first group wins whole
    logits[0, 8, 63::64] = 20.0  # one winner at the end of every group (a group's last lane)
    logits[0, 9, vocab // 2 - 3 : vocab // 2 + 3] = 25.0  # winners straddling the middle of the row
    logits[1, :, 1::2] = -inf  # every other token masked
    return logits


def drafter_rows(vocab: int, rows: int, seed: int) -> torch.Tensor:
    """The benchmark's drafter logits: N(0, 1) with one boosted token per row."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator)
    favourite = torch.randint(0, vocab, (rows, 1), generator=generator)
    return logits.scatter_add_(1, favourite, torch.full((rows, 1), 14.0))


def kernel_constant(name: str) -> int:
    match = re.search(rf"constexpr int {name} = (\d+);", TOPK_SOURCE.read_text())
    assert match, f"{name} not found in {TOPK_SOURCE}"
    return int(match.group(1))


def test_the_model_uses_the_kernels_constants():
    assert kernel_constant("kGroupVectors") == topk_filter.GROUP_VECTORS
    assert kernel_constant("kFilterCapacity") == topk_filter.CANDIDATE_CAPACITY
    assert kernel_constant("kFilterGroupCapacity") == topk_filter.GROUP_CAPACITY
    assert kernel_constant("kFilterMaxGroups") == topk_filter.MAX_GROUPS


def test_order_keys_order_floats_as_torch_compares_them():
    values = torch.tensor([float("-inf"), -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, float("inf")])
    keys = topk_filter.order_keys(values)
    assert keys[3] == keys[4]  # -0.0 == 0.0
    distinct = torch.cat([keys[:4], keys[5:]])
    assert torch.equal(distinct, torch.sort(distinct).values) and distinct.unique().numel() == distinct.numel()
    assert int(keys.min()) > 0  # key 0 is below every real value: the kernel's "no element"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_what_the_filter_finishes_equals_the_reference_and_the_rest_is_handed_over(dtype):
    logits = filter_path_rows(USER_VOCAB).to(dtype)
    taken = {"filter": 0, "whole_row": 0}
    for k in (1, 2, 16, 64, 1000, 1024):
        _values, ref_ids = ranked_topk(logits.float(), k)
        for b in range(logits.shape[0]):
            for d in range(logits.shape[1]):
                outcome = topk_filter.filter_row(logits[b, d], k)
                assert outcome.path != "ineligible"
                assert outcome.candidates >= k and outcome.groups_listed >= k  # the threshold argument
                taken[outcome.path] += 1
                if outcome.path == "filter":
                    assert torch.equal(outcome.ids, ref_ids[b, d]), (b, d, k)
    assert taken["filter"] > 0 and taken["whole_row"] > 0, taken
    # The rows built to overflow do, at every k: a constant row, and a winner in every group.
    for k in (1, 1024):
        assert topk_filter.filter_row(logits[0, 0], k).path == "whole_row"
        assert topk_filter.filter_row(logits[0, 1], k).path == "whole_row"


@pytest.mark.parametrize("vocab", [USER_VOCAB, QWEN3_VOCAB])
def test_drafter_logits_take_the_filter_path_at_every_benchmark_budget(vocab):
    # The fast path is the common one: bf16 drafter rows stay inside both buffers with room to spare.
    rows = drafter_rows(vocab, 4, seed=vocab).to(torch.bfloat16)
    for k in (16, 64, 256, 1024):
        _values, ref_ids = ranked_topk(rows.float(), k)
        for r in range(rows.shape[0]):
            outcome = topk_filter.filter_row(rows[r], k)
            assert outcome.path == "filter", (k, outcome.groups_listed, outcome.candidates)
            assert outcome.candidates <= topk_filter.CANDIDATE_CAPACITY // 2, (k, outcome.candidates)
            assert torch.equal(outcome.ids, ref_ids[r])


def test_rows_the_filter_cannot_take_are_left_to_the_earlier_kernels():
    # Rows not 16-byte aligned, and rows with fewer groups than k.
    assert topk_filter.filter_row(torch.zeros(65535, dtype=torch.bfloat16), 16).path == "ineligible"
    assert topk_filter.filter_row(torch.zeros(65528, dtype=torch.bfloat16), 1024).path != "ineligible"  # 1024 groups
    assert topk_filter.filter_row(torch.zeros(65472, dtype=torch.bfloat16), 1024).path == "ineligible"  # 1023
    # More groups than the last block holds: a float32 row of 8193 groups.
    assert topk_filter.filter_row(torch.zeros(8192 * 32, dtype=torch.float32), 16).path != "ineligible"
    assert topk_filter.filter_row(torch.zeros(8193 * 32, dtype=torch.float32), 16).path == "ineligible"
    assert topk_filter.group_elements(torch.float32) == 32 and topk_filter.group_elements(torch.bfloat16) == 64
