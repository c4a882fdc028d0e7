"""The CUDA kernels against the PyTorch reference, bit for bit (GPU with the built extension only).

Top-K: token ids and ranked values exactly equal to :func:`ranked_topk` (ties to the lower id); the float32
log-normaliser within 1e-5 (reduction order differs across backends). Trees, verify inputs and walks: equal in
every element when fed identical top-K arrays.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddtree_runtime.tree import DraftTreeBatch, build_tree_from_topk, depth_log_probs, ranked_topk
from test_topk_filter import filter_path_rows

from ddtree_runtime import ops

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and ops.extension_available()),
    reason="needs a CUDA GPU and the compiled ddtree_runtime._C extension (DDTREE_BUILD_CUDA=1)",
)
CUDA = torch.device("cuda")
USER_VOCAB = 248320  # Qwen3.6's vocabulary
BLACKWELL_SMEM_OPTIN = 101376  # RTX PRO 6000 Blackwell (sm_120): shared memory per block with opt-in, in bytes


def check_topk(logits: torch.Tensor, k: int) -> None:
    top = ops.topk_log_probs(logits.to(CUDA), k)
    values = logits.float()
    ref_values, ref_ids = ranked_topk(values, k)
    assert torch.equal(top.ids.cpu(), ref_ids)
    ref_lp, _unused = depth_log_probs(values, k)
    ours = top.log_probs.cpu()
    assert torch.equal(torch.isneginf(ours), torch.isneginf(ref_lp))
    finite = torch.isfinite(ref_lp)
    assert torch.allclose(ours[finite], ref_lp[finite], rtol=0, atol=1e-5)
    assert not top.invalid.any()
    # The ranked logits themselves are exact: log_prob + log_z is monotone in them.
    assert torch.equal(torch.gather(values, -1, top.ids.cpu()), ref_values)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("vocab", [1, 2, 7, 3000])
def test_topk_random_and_tied_logits(dtype, vocab):
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, 5, vocab, generator=generator) * 3
    logits[1] = torch.round(logits[1])
    logits = logits.to(dtype)
    for k in sorted({1, min(vocab, 5), min(vocab, 64), vocab if vocab <= 1024 else 1024}):
        check_topk(logits, k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_topk_minus_inf_constant_rows_and_qwen_vocab(dtype):
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(4, 3, 151936, generator=generator).to(dtype)
    logits[0, :, 1000:] = float("-inf")  # masked vocabulary
    logits[1, 0] = float("-inf")  # a whole row
    logits[1, 1] = 2.5  # a constant row: every token ties
    logits[1, 2, :1500] = 0.0  # 1500 ties below a few larger logits
    logits[1, 2, 1500:] = -1.0
    logits[1, 2, 77] = 4.0
    logits[2, :, 5] += 20
    for k in (1, 16, 1024):
        check_topk(logits, k)


def test_topk_rows_split_over_blocks_at_batch_one():
    # Few rows: each row's first pass is shared by several blocks (ties and -inf straddle their chunk borders).
    generator = torch.Generator().manual_seed(12)
    logits = torch.randn(1, 3, 151936, generator=generator) * 3
    logits[0, 0, 9000:30000] = 7.0
    logits[0, 1, :] = torch.round(logits[0, 1, :])
    logits[0, 1, 100000:] = float("-inf")
    logits[0, 2, ::7] += 20
    for dtype in (torch.bfloat16, torch.float32):
        for k in (1, 64, 1024):
            check_topk(logits.to(dtype), k)


def test_topk_vocabulary_too_long_for_the_chunked_path():
    # An odd vocabulary (rows not 16-byte aligned) leaves the filter path out. At k = 1024 a 300001-token row needs
    # chunks longer than the chunk blocks' shared memory: the whole-row kernel runs; k = 16 takes the chunked path.
    generator = torch.Generator().manual_seed(13)
    logits = torch.randn(1, 2, 300001, generator=generator)
    logits[0, 1, 250000:] = 5.0  # ties in the last chunks
    for k in (16, 1024):
        check_topk(logits.to(torch.bfloat16), k)


@pytest.mark.parametrize("vocab", [5000, 5001])
def test_topk_with_more_rows_than_multiprocessors(vocab):
    # 240 rows (batch 16 at depth 15), with ties and -inf: the filter path where the rows are 16-byte aligned and
    # hold at least k groups (5000 at k <= 64), the whole-row kernel otherwise.
    generator = torch.Generator().manual_seed(14)
    logits = torch.randn(16, 15, vocab, generator=generator) * 3
    logits[3] = torch.round(logits[3])
    logits[5, :, 2500:] = float("-inf")
    for k in (1, 64, 1024):
        check_topk(logits.to(torch.bfloat16), k)


@pytest.mark.parametrize("path", ["filter", "chunked", "whole"])
def test_topk_is_the_same_on_every_forced_path(monkeypatch, path):
    # Batch 1 at the user's vocabulary: k = 1024 takes the chunked path by default, k = 16 the filter path; each
    # forced path gives the same exact top-K (ties across chunk and group borders, a masked tail).
    monkeypatch.setenv("DDTREE_TOPK_PATH", path)
    generator = torch.Generator().manual_seed(15)
    logits = torch.randn(1, 15, USER_VOCAB, generator=generator) * 3
    logits[0, 3] = torch.round(logits[0, 3])
    logits[0, 4, 200000:] = float("-inf")
    logits[0, 5, 8000:9000] = 9.0
    for k in (16, 512, 1024):
        check_topk(logits.to(torch.bfloat16), k)


def test_an_unknown_forced_topk_path_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("DDTREE_TOPK_PATH", "fastest")
    with pytest.raises(RuntimeError, match="DDTREE_TOPK_PATH must be auto, filter, chunked or whole, not 'fastest'"):
        ops.topk_log_probs(torch.zeros(1, 1, 64, device=CUDA), 4)


def test_topk_flags_a_bad_value_in_any_part_of_a_split_row():
    logits = torch.zeros(1, 2, 151936, device=CUDA, dtype=torch.bfloat16)
    assert ops.topk_log_probs(logits, 8).invalid.tolist() == [False]
    logits[0, 1, 151935] = float("nan")
    assert ops.topk_log_probs(logits, 8).invalid.tolist() == [True]


def test_topk_flags_nan_and_positive_infinity():
    logits = torch.zeros(3, 2, 500, device=CUDA)
    logits[1, 1, 10] = float("nan")
    logits[2, 0, 0] = float("inf")
    assert ops.topk_log_probs(logits, 4).invalid.tolist() == [False, True, True]


def reference_tree_fields(lp: torch.Tensor, ids: torch.Tensor, budget: int) -> dict[str, torch.Tensor]:
    tree = build_tree_from_topk(lp, ids, budget)
    return {
        "token_ids": tree.token_ids,
        "depths": tree.depths,
        "parents": tree.parents,
        "log_probs": tree.log_probs,
        "ranks": tree.ranks,
    }


def assert_tree_equal(lp: torch.Tensor, ids: torch.Tensor, budgets: list[int], max_budget: int) -> DraftTreeBatch:
    tree = ops.build_tree_from_topk(lp.to(CUDA), ids.to(CUDA), budgets, max_budget)
    cpu = tree.to("cpu")
    for b, budget in enumerate(budgets):
        expected = reference_tree_fields(lp[b], ids[b], budget)
        n = int(cpu.num_nodes[b])
        assert n == expected["token_ids"].shape[0], b
        for name, value in expected.items():
            got = getattr(cpu, name)[b, : n + 1 if name == "parents" else n]
            assert torch.equal(got, value), (b, budget, name)
        assert (cpu.token_ids[b, n:] == -1).all() and (cpu.parents[b, n + 1 :] == -1).all()
        assert torch.isneginf(cpu.log_probs[b, n:]).all() and (cpu.depths[b, n:] == 0).all()
    return tree


def topk_arrays(
    batch: int, depth: int, vocab: int, k: int, *, seed: int, style: str
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, depth, vocab, generator=generator) * 2
    if style == "ties":
        logits = torch.round(logits)
    elif style == "minus_inf":
        logits[:, :, vocab // 3 :] = float("-inf")
    elif style == "spine":
        logits[:, :, 0] += 12
    return depth_log_probs(logits, min(k, vocab))


@pytest.mark.parametrize("style", ["random", "ties", "minus_inf", "spine"])
@pytest.mark.parametrize(("batch", "depth", "vocab", "budgets"), [
    (1, 15, 2000, [64]),
    (4, 16, 300, [0, 1, 2, 255]),
    (3, 1, 50, [10, 50, 3]),
    (2, 3, 2, [14, 5]),  # the frontier runs dry before the budget
    (32, 4, 400, list(range(0, 320, 10))),
])
def test_tree_equals_the_heap_from_identical_topk(style, batch, depth, vocab, budgets):
    lp, ids = topk_arrays(batch, depth, vocab, max(budgets) or 1, seed=batch * 100 + depth, style=style)
    assert_tree_equal(lp, ids, budgets, max(budgets))


@pytest.mark.parametrize("style", ["random", "spine", "ties"])
def test_tree_at_budget_1024(style):
    lp, ids = topk_arrays(2, 15, 5000, 1024, seed=3, style=style)
    assert_tree_equal(lp, ids, [1024, 700], 1024)


def test_tree_clamps_budgets_to_the_padded_width():
    lp, ids = topk_arrays(2, 4, 100, 8, seed=4, style="random")
    tree = ops.build_tree_from_topk(lp.to(CUDA), ids.to(CUDA), torch.tensor([50, -3], device=CUDA), 8)
    assert tree.num_nodes.tolist() == [8, 0]


def test_verify_inputs_and_walks_equal_the_reference():
    lp, ids = topk_arrays(5, 15, 4000, 300, seed=5, style="spine")
    budgets = [300, 0, 1, 64, 255]
    tree = assert_tree_equal(lp, ids, budgets, 300)
    roots = torch.tensor([1, 2, 3, 4, 5], device=CUDA)
    seq_lens = torch.tensor([0, 7, 100, 3, 1], device=CUDA)
    verify = ops.tree_verify_inputs(tree, roots, seq_lens)
    cpu_tree = tree.to("cpu")
    reference = ops._verify_reference(cpu_tree, roots.cpu(), seq_lens.cpu(), verify.custom_mask.numel())
    for name, ours, ref in zip(ops.VerifyInputs._fields, verify, reference, strict=True):
        assert torch.equal(ours.cpu(), ref), name
    generator = torch.Generator().manual_seed(6)
    for predict in (ops._first_child_tokens(verify, generator), torch.randint(0, 4000, (5, 301), device=CUDA)):
        ours = ops.greedy_accept(verify, predict, seq_lens, 15)
        cpu_verify = ops.VerifyInputs(*(t.cpu() for t in verify))
        ref = ops._accept_reference(cpu_verify, predict.cpu(), seq_lens.cpu(), 15)
        for name, a, b in zip(ops.Acceptance._fields, ours, ref, strict=True):
            assert torch.equal(a.cpu(), b), name


def random_tree_batch(budget: int, seed: int) -> DraftTreeBatch:
    """Trees of any shape up to depth 16: each node's parent drawn from the earlier nodes, so a parent's children
    are scattered over the indices (full, half and empty trees)."""
    generator = torch.Generator().manual_seed(seed)
    sizes = [budget, budget // 2, 0]
    width = budget + 1
    parents = torch.full((len(sizes), width), -1, dtype=torch.long)
    depths = torch.zeros(len(sizes), budget, dtype=torch.long)
    token_ids = torch.full((len(sizes), budget), -1, dtype=torch.long)
    log_probs = torch.full((len(sizes), budget), float("-inf"), dtype=torch.float64)
    for b, size in enumerate(sizes):
        depth_of = [0]
        for node in range(1, size + 1):
            open_nodes = [q for q in range(node) if depth_of[q] < 16]
            parent = open_nodes[int(torch.randint(0, len(open_nodes), (1,), generator=generator))]
            depth_of.append(depth_of[parent] + 1)
            parents[b, node] = parent
            depths[b, node - 1] = depth_of[-1]
            token_ids[b, node - 1] = int(torch.randint(0, 248320, (1,), generator=generator))
            log_probs[b, node - 1] = -float(node)
    ranks = torch.where(token_ids >= 0, 0, -1)
    return DraftTreeBatch(token_ids=token_ids, depths=depths, parents=parents, log_probs=log_probs, ranks=ranks,
                          num_nodes=torch.tensor(sizes, dtype=torch.long))


@pytest.mark.parametrize("budget", [1, 16, 128, 129, 1024])
def test_verify_inputs_of_arbitrary_trees_equal_the_reference(budget):
    # The links kernel sorts nodes by (parent, index) in one block (128 or 1024 slots by width): scattered siblings,
    # empty trees and the widest tree against the reference's lists, tokens, positions and masks.
    cpu_tree = random_tree_batch(budget, seed=400 + budget)
    roots = torch.tensor([7, 8, 9])
    seq_lens = torch.tensor([5, 0, 33])
    verify = ops.tree_verify_inputs(cpu_tree.to(CUDA), roots.to(CUDA), seq_lens.to(CUDA))
    reference = ops._verify_reference(cpu_tree, roots, seq_lens, verify.custom_mask.numel())
    for name, ours, ref in zip(ops.VerifyInputs._fields, verify, reference, strict=True):
        assert torch.equal(ours.cpu(), ref), name


def test_compare_with_reference_on_the_gpu():
    assert ops.compare_with_reference(CUDA, seed=1) == []


def test_a_round_is_capturable_in_a_cuda_graph():
    generator = torch.Generator().manual_seed(8)
    logits = (torch.randn(3, 15, 151936, generator=generator) * 3).to(torch.bfloat16).to(CUDA)
    budgets = torch.tensor([64, 16, 256], device=CUDA)
    roots = torch.tensor([1, 2, 3], device=CUDA)
    seq_lens = torch.tensor([10, 20, 30], device=CUDA)
    predict = torch.zeros(3, 257, dtype=torch.long, device=CUDA)
    width = 257
    mask_numel = int(((seq_lens + width) * width).sum())

    def round_() -> tuple[torch.Tensor, ...]:
        _unused, tree = ops.build_tree(logits, budgets, max_budget=256)
        verify = ops.tree_verify_inputs(tree, roots, seq_lens, mask_numel)
        accepted = ops.greedy_accept(verify, predict, seq_lens, 15)
        return (*tree.tensors().values(), *verify, *accepted)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        round_()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = round_()
    logits.copy_((torch.randn(3, 15, 151936, generator=generator) * 3).to(torch.bfloat16))
    predict.copy_(torch.randint(0, 151936, (3, 257), generator=generator))
    graph.replay()
    torch.cuda.synchronize()
    for replayed, eager in zip(captured, round_(), strict=True):
        assert torch.equal(replayed, eager)


def confident_drafter_topk(batch: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    # The benchmark's logits: one boosted token per depth over the Qwen vocabulary, bf16.
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, 15, 151936, generator=generator)
    favourite = torch.randint(0, 151936, (batch, 15, 1), generator=generator)
    logits.scatter_add_(2, favourite, torch.full((batch, 15, 1), 14.0))
    return depth_log_probs(logits.to(torch.bfloat16).float(), k)


def test_trees_of_a_confident_drafter_at_every_benchmark_budget():
    lp, ids = confident_drafter_topk(4, 1024, seed=21)
    assert_tree_equal(lp, ids, [16, 64, 256, 1024], 1024)
    for budget in (16, 64, 256):
        assert_tree_equal(lp[:, :, :budget], ids[:, :, :budget], [budget, budget - 1, 1, 0], budget)


@pytest.mark.parametrize("budget", [300, 1024])
def test_threshold_path_with_bf16_like_ties_and_dead_levels(budget):
    generator = torch.Generator().manual_seed(budget)
    logits = torch.round(torch.randn(3, 16, 3000, generator=generator) * 4) / 2
    logits[1, 9:] = float("-inf")  # a dead level: the deeper tree is ordered by rank path only
    logits[2, :, 0] += 10
    lp, ids = depth_log_probs(logits, budget)
    assert_tree_equal(lp, ids, [budget, budget, budget // 2], budget)


def test_tied_nodes_beyond_the_kept_capacity_fall_back_to_the_pop_loop():
    # Four depth-1 nodes score 0 and their 4096 children all score -1, the budget's bound: no bound can
    # separate more than the kernel's kept capacity (4096), so the sequential loop must give the same tree.
    lp = torch.full((1, 3, 1024), -1.0)
    lp[0, 0, :4] = 0.0
    ids = torch.arange(1024).repeat(1, 3, 1)
    assert_tree_equal(lp, ids, [1024], 1024)


def test_rows_the_threshold_path_cannot_order_take_the_pop_loop_per_request():
    lp, ids = topk_arrays(3, 6, 500, 128, seed=22, style="random")
    lp[1, 2] = lp[1, 2].flip(0)  # increasing: request 1 pops sequentially, requests 0 and 2 take the threshold
    lp[2, 0, :5] = 0.0  # ties at zero are still sorted rows
    assert_tree_equal(lp, ids, [128, 100, 128], 128)


@pytest.mark.parametrize("style", ["random", "ties", "minus_inf"])
def test_the_pop_loop_gives_the_heap_order_on_rows_that_are_not_sorted(style):
    # Rows that are not sorted keep every request on the pop loop, whatever its budget (the threshold path needs
    # sorted rows); rounded logits make exact score ties across the frontier's slots and lanes.
    lp, ids = topk_arrays(8, 15, 400, 256, seed=31, style=style)
    lp[:, :, :] = lp.flip(2)  # increasing rows: no request can take the threshold path
    assert_tree_equal(lp, ids, [1, 2, 33, 127, 128, 129, 200, 256], 256)


# --- the SGLang worker's round on the kernels ------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "budget"), [(0, 16), (1, 64), (2, 1), (3, 255)])
def test_worker_round_on_the_kernels_equals_its_pytorch_path_without_a_host_sync(seed, budget):
    """What DDTreeWorker hands SGLang each round, built by the kernels from the drafter logits, equals its
    PyTorch path element for element, and the build reads nothing on the host (CUDA sync debug mode errors)."""
    from ddtree_runtime.sglang.tree_inputs import (  # noqa: PLC0415
        compiled_sglang_verify_inputs,
        sglang_verify_inputs,
    )
    from ddtree_runtime.tree import build_tree_batch_from_topk  # noqa: PLC0415

    generator = torch.Generator().manual_seed(seed)
    batch, depth, vocab = 4, 15, 3000
    logits = (torch.randn(batch, depth, vocab, generator=generator) * 3).to(torch.bfloat16)
    roots = torch.randint(0, vocab, (batch,), generator=generator)
    seq_lens = torch.randint(1, 300, (batch,), generator=generator)
    k = min(budget, vocab)
    ref_lp, ref_ids = depth_log_probs(logits.float(), k)
    expected = sglang_verify_inputs(build_tree_batch_from_topk(ref_lp, ref_ids, torch.full((batch,), budget)),
                                    roots, seq_lens, width=budget + 1)
    gpu_logits, gpu_roots, gpu_lens = logits.to(CUDA), roots.to(CUDA), seq_lens.to(CUDA)
    seq_lens_sum = int(seq_lens.sum())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        top = ops.topk_log_probs(gpu_logits, k)
        got = compiled_sglang_verify_inputs(top.log_probs, top.ids, gpu_roots, gpu_lens,
                                            seq_lens_sum=seq_lens_sum, budget=budget)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(top.ids.cpu(), ref_ids)
    for field in ("candidates", "positions", "custom_mask", "retrieve_index", "retrieve_next_token",
                  "retrieve_next_sibling"):
        assert torch.equal(getattr(got, field).cpu(), getattr(expected, field)), field


def test_verify_inputs_sized_by_an_upper_bound_lay_each_request_where_the_device_lengths_say():
    """Under overlap scheduling the host may know only an upper bound of the lengths (the reserved ones): the flat
    mask is then longer, and its requests still start where SGLang's ``mask_indptr`` (a cumsum of the device
    lengths) looks for them."""
    from ddtree_runtime.sglang.tree_inputs import compiled_sglang_verify_inputs  # noqa: PLC0415

    generator = torch.Generator().manual_seed(7)
    batch, depth, vocab, budget = 3, 15, 3000, 64
    logits = (torch.randn(batch, depth, vocab, generator=generator) * 3).to(torch.bfloat16).to(CUDA)
    roots = torch.randint(0, vocab, (batch,), generator=generator).to(CUDA)
    seq_lens = torch.randint(1, 300, (batch,), generator=generator)
    top = ops.topk_log_probs(logits, budget)
    exact = compiled_sglang_verify_inputs(top.log_probs, top.ids, roots, seq_lens.to(CUDA),
                                          seq_lens_sum=int(seq_lens.sum()), budget=budget)
    bound = compiled_sglang_verify_inputs(top.log_probs, top.ids, roots, seq_lens.to(CUDA),
                                          seq_lens_sum=int(seq_lens.sum()) + 3 * 81, budget=budget)
    used = exact.custom_mask.numel()
    assert bound.custom_mask.numel() == used + (budget + 1) * 3 * 81
    assert torch.equal(bound.custom_mask[:used].cpu(), exact.custom_mask.cpu())


# --- the user's vocabulary and a smaller GPU's shared memory ----------------------------------------------------


@pytest.mark.parametrize("batch", [1, 4, 16, 48])
def test_topk_at_the_user_vocabulary(batch):
    # The filter path at every batch (one block per row at batch 48, several per row below).
    generator = torch.Generator().manual_seed(100 + batch)
    logits = torch.randn(batch, 15, USER_VOCAB, generator=generator) * 3
    logits[0, 0, 200000:] = float("-inf")
    logits[0, 1] = torch.round(logits[0, 1])  # ties across every chunk border
    logits[-1, 14, 248000:] = 9.0  # ties in the last chunk
    for k in (1, 8, 16, 64, 1024):
        check_topk(logits.to(torch.bfloat16), k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_topk_filter_path_with_ties_masks_and_leftover_rows(dtype):
    logits = filter_path_rows(USER_VOCAB).to(dtype)
    for k in (1, 2, 16, 64, 1000, 1024):
        check_topk(logits, k)


def test_topk_filter_path_with_exactly_k_groups():
    # Exactly k = 1024 groups of 64 bf16 logits (the threshold is then the smallest group maximum); 65528: still 1024
    # groups, the last one 7 vectors short; 65535: rows not 16-byte aligned, the earlier kernels run.
    generator = torch.Generator().manual_seed(301)
    for vocab in (65536, 65528, 65535):
        logits = torch.randn(2, 3, vocab, generator=generator) * 3
        logits[1] = torch.round(logits[1])
        check_topk(logits.to(torch.bfloat16), 1024)


NEGATIVE_NAN_BITS = {torch.bfloat16: (torch.int16, -64), torch.float16: (torch.int16, -512),
                     torch.float32: (torch.int32, -4194304)}  # 0xFFC0, 0xFE00, 0xFFC00000: NaN with the sign bit set


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_topk_filter_path_flags_nan_and_positive_infinity_wherever_they_are(dtype):
    # The filter path tests each vector's NaN-propagating maximum: a NaN of either sign, a NaN among -inf only (no
    # finite maximum to carry it), and +inf in the last vector of a row are all flagged; a clean request beside them
    # keeps its exact top-K.
    generator = torch.Generator().manual_seed(303)
    logits = (torch.randn(5, 15, USER_VOCAB, generator=generator) * 3).to(dtype)
    logits[1, 3, 7] = float("nan")
    logits[2, 14, USER_VOCAB - 1] = float("inf")
    int_dtype, negative_nan = NEGATIVE_NAN_BITS[dtype]
    logits[3, 0].view(int_dtype)[100] = negative_nan
    logits[4, 5] = float("-inf")
    logits[4, 5, 170000] = float("nan")
    for k in (1, 16, 1024):
        top = ops.topk_log_probs(logits.to(CUDA), k)
        assert top.invalid.tolist() == [False, True, True, True, True], k
        _values, ref_ids = ranked_topk(logits[0].float(), k)
        assert torch.equal(top.ids[0].cpu(), ref_ids), k


def test_topk_filter_path_and_its_leftover_rows_replay_in_a_cuda_graph():
    # The arrival counters and leftover flags are reset inside the graph: replays with new logits stay exact,
    # whichever rows the filter hands over.
    static = filter_path_rows(USER_VOCAB).to(torch.bfloat16).to(CUDA)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.topk_log_probs(static, 64)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.topk_log_probs(static, 64)
    generator = torch.Generator().manual_seed(302)
    for replay in range(3):
        fresh = torch.randn(2, 15, USER_VOCAB, generator=generator) * 3
        fresh[replay % 2, replay] = 2.0  # a different row goes to the whole-row kernel each time
        static.copy_(fresh.to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        ref_values, ref_ids = ranked_topk(static.float().cpu(), 64)
        assert torch.equal(captured.ids.cpu(), ref_ids)
        assert torch.equal(torch.gather(static.float().cpu(), -1, captured.ids.cpu()), ref_values)
        ref_lp, _unused = depth_log_probs(static.float().cpu(), 64)
        assert torch.allclose(captured.log_probs.cpu(), ref_lp, rtol=0, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 16, 48])
def test_trees_at_the_user_vocabulary_and_every_benchmark_budget(batch):
    lp, ids = topk_arrays(batch, 15, USER_VOCAB, 1024, seed=200 + batch, style="spine")
    budgets = [(16, 64, 256, 1024)[b % 4] for b in range(batch)]
    assert_tree_equal(lp, ids, budgets, 1024)


def test_a_malformed_shared_memory_cap_is_refused_by_name():
    script = "import torch; from ddtree_runtime import ops; ops.topk_log_probs(torch.zeros(1, 1, 64, device='cuda'), 4)"
    env = {**os.environ, "DDTREE_SMEM_LIMIT": "lots"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode != 0
    assert "DDTREE_SMEM_LIMIT must be a positive number of bytes, not 'lots'" in result.stderr


@pytest.mark.skipif("DDTREE_SMEM_LIMIT" in os.environ, reason="this run is already the capped one")
def test_every_kernel_test_passes_within_a_blackwell_gpus_shared_memory():
    """An RTX PRO 6000 Blackwell allows 99 KiB of shared memory per block, an H200 227 KiB. This file's tests run
    again with the kernels' launch plans capped at the Blackwell's figure: the top-K's chunk and merge kernels and
    the tree's kept set must then choose smaller plans or their fallbacks, with the same exact results."""
    env = {**os.environ, "DDTREE_SMEM_LIMIT": str(BLACKWELL_SMEM_OPTIN)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(Path(__file__)), "-q", "-p", "no:cacheprovider", "-k",
         "not malformed_shared_memory"],
        env=env, capture_output=True, text=True, timeout=1800, check=False, cwd=Path(__file__).parents[1],
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-2000:]
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 40, summary  # the capped run ran the kernel tests, not skipped them
