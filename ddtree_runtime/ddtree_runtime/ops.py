"""GPU operators for one DDTree round, with the PyTorch reference as fallback.

The compiled extension (``ddtree_runtime._C``, built from ``csrc/`` when ``DDTREE_BUILD_CUDA=1``) registers
``torch.ops.ddtree_runtime.*``:

1. ``topk_log_probs``: fused per-depth top-K + float32 log-normaliser from drafter logits ``[B, L, V]``
   (bf16/fp16/fp32), ranked by logit descending with ties to the lower token id;
2. ``build_tree``: best-first trees from those arrays with per-request budgets, bit-identical to
   :func:`ddtree_runtime.tree.build_tree_batch_from_topk` (float64 left-fold scores, rank-path tie order);
3. ``tree_verify_inputs``: verify tokens, positions, dense ancestor masks, SGLang's flat FULL_MASK and the
   EAGLE-style retrieve lists;
4. ``greedy_accept``: the acceptance walk over the retrieve lists and the KV-compaction slot pairs.

The operators return tuples of tensors; the wrappers below name them with the containers every path shares:
:class:`ddtree_runtime.tree.DraftTreeBatch` for trees (the kernel's ``scores`` are its ``log_probs``),
:class:`VerifyInputs` (the kernel's ``input_ids`` / ``flat_mask`` are its ``candidates`` / ``custom_mask``) and
:class:`Acceptance` (the kernel's ``accept_index`` / ``num_accepted`` are its ``nodes`` / ``lengths``).

All outputs have fixed shapes (``max_budget`` / ``max_depth`` padding with ``-1``, never a real token id), no
operator reads a device value on the host, so a round can be captured in a CUDA graph. The wrappers below
use the kernels for CUDA tensors when the extension is loaded and the PyTorch path otherwise (saying once
that the extension is missing). Wrappers that must size an output from device data (``max_budget`` or
``mask_numel`` left as ``None``) read it on the host: pass them to stay synchronisation-free.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from ddtree_runtime import tree as _tree  # the PyTorch path, by module: ops names only what reaches the kernels
from ddtree_runtime.sglang.config import MAX_BUDGET  # the one limit: the plugin's settings refuse larger budgets
from ddtree_runtime.tree import NO_NODE, DraftTreeBatch, depth_log_probs
from ddtree_runtime.verify import follow_greedy_batch

__all__ = [
    "MAX_BUDGET",
    "MAX_DEPTH",
    "Acceptance",
    "TopK",
    "VerifyInputs",
    "build_tree",
    "build_tree_from_topk",
    "compare_with_reference",
    "extension_available",
    "extension_error",
    "greedy_accept",
    "moving_kv_pairs",
    "topk_log_probs",
    "tree_verify_inputs",
]

MAX_DEPTH = 16
"""Deepest tree the kernels support."""
LOGIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class TopK(NamedTuple):
    """``log_probs [B, L, K]`` float32, ``ids [B, L, K]`` int64, ``invalid [B]`` (NaN or +inf in the logits)."""

    log_probs: torch.Tensor
    ids: torch.Tensor
    invalid: torch.Tensor


class VerifyInputs(NamedTuple):
    """What one tree-verify forward reads for a padded tree batch, ``W = N`` slots per request (the root first):
    the one container of the PyTorch reference and the kernels (:func:`tree_verify_inputs`) and of the SGLang
    worker (:func:`ddtree_runtime.sglang.tree_inputs.sglang_verify_inputs`). The names are SGLang's EAGLE
    tree-verify names, since the data is what SGLang reads:

    - ``candidates [B, W]`` int64: the verify tokens (flattened, SGLang's ``draft_token``);
    - ``positions [B, W]`` int64: ``seq_len + depth`` (siblings share a position; SGLang reads them flattened);
    - ``visibility [B, W, W]`` bool: ancestor-or-self, the tree part of the mask (padded slots see themselves);
    - ``custom_mask``: SGLang's ``TreeMaskMode.FULL_MASK``, per request ``W x (seq_len + W)`` bools row-major,
      requests concatenated (True = may attend); empty when not asked for;
    - ``retrieve_index [B, W]``: slot i's row ``b * W + i`` in the flat batch; ``retrieve_next_token`` /
      ``retrieve_next_sibling [B, W]``: first child / next sibling (left-child, right-sibling, ``-1`` terminated).

    Padded slots are never linked. :func:`tree_verify_inputs` leaves ``-1`` in their ``candidates`` and
    ``retrieve_index``; SGLang's padding (:func:`ddtree_runtime.sglang.tree_inputs.with_sglang_padding`) puts
    the root token and the slot's own row there.
    """

    candidates: torch.Tensor
    positions: torch.Tensor
    visibility: torch.Tensor
    custom_mask: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor

    @property
    def width(self) -> int:
        """Verify slots per request, root included."""
        return int(self.candidates.shape[1])


class Acceptance(NamedTuple):
    """The greedy walk of :func:`greedy_accept` (kernel and PyTorch reference) and the slot copies that commit
    it to a contiguous KV cache, all int64:

    - ``nodes [B, D + 1]``: node indices on the accepted path, the root (0) first, ``-1`` padded;
    - ``lengths [B]``: tau, accepted drafts + 1 (the valid prefix of ``nodes``; SGLang's ``accept_lens``, its
      ``accept_token_num + 1``);
    - ``bonus [B]``: the target's token after the last accepted node;
    - ``kv_src`` / ``kv_dst [B, D + 1]``: cache slot ``kv_dst`` receives ``kv_src`` for every accepted node
      (``-1`` padded; pairs with ``src == dst`` are no-ops kept for fixed shapes).

    ``nodes`` and ``lengths`` are :class:`ddtree_runtime.sglang.tree_inputs.AcceptedPaths`' first fields, same
    names and types. The rest differ because the SGLang worker commits differently: SGLang's own walk gives the
    bonus among its predicts, and the paged cache's slots are permuted, not copied, so the worker needs the
    flat verify rows to gather from (``AcceptedPaths.rows``) instead of slot pairs.
    """

    nodes: torch.Tensor
    lengths: torch.Tensor
    bonus: torch.Tensor
    kv_src: torch.Tensor
    kv_dst: torch.Tensor


def _load_extension() -> str | None:
    """Import the compiled operators; returns why they are unavailable, or None."""
    try:
        importlib.import_module("ddtree_runtime._C")
    except ImportError as error:
        return f"ddtree_runtime._C is not built ({error})"
    except OSError as error:  # a build for another torch/CUDA
        return f"ddtree_runtime._C failed to load ({error})"
    return None


_EXTENSION_ERROR = _load_extension()
_fallback_announced = False


def extension_available() -> bool:
    """True when the compiled CUDA operators are loaded."""
    return _EXTENSION_ERROR is None


def extension_error() -> str | None:
    """Why the extension is unavailable (None when it is loaded)."""
    return _EXTENSION_ERROR


def _use_kernels(tensor: torch.Tensor) -> bool:
    if tensor.is_cuda and extension_available():
        return True
    _announce_fallback()
    return False


def _announce_fallback() -> None:
    global _fallback_announced  # noqa: PLW0603 - one notice per process
    if _fallback_announced or extension_available():
        return
    _fallback_announced = True
    warnings.warn(f"{_EXTENSION_ERROR}; using the PyTorch path", RuntimeWarning, stacklevel=3)


# --- top-K -------------------------------------------------------------------------------------------------


def topk_log_probs(logits: torch.Tensor, k: int) -> TopK:
    """Per-depth top-``k`` float32 log-probabilities and token ids of ``logits [B, L, V]``.

    Semantics of :func:`ddtree_runtime.tree.depth_log_probs`; rows holding NaN or ``+inf`` are flagged in
    ``invalid`` (their other outputs are unspecified) instead of raising, so nothing is read on the host.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, L, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in LOGIT_DTYPES:
        raise ValueError(f"logits must be bfloat16, float16 or float32, got {logits.dtype}")
    if not 1 <= k <= min(logits.shape[2], MAX_BUDGET):
        raise ValueError(f"k must be in [1, min(V, {MAX_BUDGET})], got {k}")
    if _use_kernels(logits):
        return TopK(*torch.ops.ddtree_runtime.topk_log_probs(logits, k))
    return _topk_reference(logits, k)


def _topk_reference(logits: torch.Tensor, k: int) -> TopK:
    values = logits.float()
    bad = torch.isnan(values) | torch.isposinf(values)
    invalid = bad.flatten(1).any(dim=1)
    clean = torch.where(bad, torch.full_like(values, float("-inf")), values)
    log_probs, ids = depth_log_probs(clean, k)
    return TopK(log_probs, ids, invalid)


# --- tree construction -------------------------------------------------------------------------------------


def _budget_tensor(budgets: Sequence[int] | torch.Tensor, batch: int, max_budget: int | None,
                   device: torch.device) -> tuple[torch.Tensor, int]:
    if isinstance(budgets, torch.Tensor):
        budget_t = budgets.to(device=device, dtype=torch.long).reshape(-1)
        if max_budget is None:
            max_budget = int(budget_t.max()) if budget_t.numel() else 0  # host read: pass max_budget to avoid
    else:
        values = [int(b) for b in budgets]
        if any(b < 0 for b in values):
            raise ValueError("budgets must be >= 0")
        if max_budget is None:
            max_budget = max(values, default=0)
        if any(b > max_budget for b in values):
            raise ValueError(f"budgets must be <= max_budget ({max_budget})")
        budget_t = torch.tensor(values, dtype=torch.long, device=device)
    if budget_t.shape[0] != batch:
        raise ValueError(f"need {batch} budgets, got {budget_t.shape[0]}")
    if not 0 <= max_budget <= MAX_BUDGET:
        raise ValueError(f"max_budget must be in [0, {MAX_BUDGET}], got {max_budget}")
    return budget_t, max_budget


def build_tree_from_topk(
    log_probs: torch.Tensor,
    ids: torch.Tensor,
    budgets: Sequence[int] | torch.Tensor,
    max_budget: int | None = None,
) -> DraftTreeBatch:
    """Best-first trees from ``[B, L, K]`` arrays in rank order (``k_b = min(budget_b, K)``), padded to
    ``max_budget``. Tensor budgets outside ``[0, max_budget]`` are clamped (checking would read the device).

    No NaN. The kernel's parallel path (budgets >= 96) needs what :func:`topk_log_probs` produces: rows
    nonincreasing in rank and ``<= 0``; a request whose rows are not takes the sequential path in the same
    launch, with the same result.
    """
    if log_probs.dim() != 3 or log_probs.shape != ids.shape:
        raise ValueError("log_probs and ids must both be [B, L, K]")
    if log_probs.dtype != torch.float32:
        raise ValueError("log_probs must be float32")
    if log_probs.shape[1] > MAX_DEPTH or log_probs.shape[2] > MAX_BUDGET:
        raise ValueError(f"depth must be <= {MAX_DEPTH} and K <= {MAX_BUDGET}")
    budget_t, max_budget = _budget_tensor(budgets, log_probs.shape[0], max_budget, log_probs.device)
    if _use_kernels(log_probs):
        token_ids, depths, parents, scores, ranks, num_nodes = torch.ops.ddtree_runtime.build_tree(
            log_probs, ids.long(), budget_t, max_budget)
        return DraftTreeBatch(token_ids=token_ids, depths=depths, parents=parents, log_probs=scores, ranks=ranks,
                              num_nodes=num_nodes)
    return _tree_reference(log_probs, ids, budget_t.clamp(0, max_budget), max_budget)


def _tree_reference(log_probs: torch.Tensor, ids: torch.Tensor, budgets: torch.Tensor,
                    max_budget: int) -> DraftTreeBatch:
    return _tree.build_tree_batch_from_topk(log_probs, ids.long(), budgets).padded(max_budget + 1)


def build_tree(
    logits: torch.Tensor,
    budgets: Sequence[int] | torch.Tensor,
    max_budget: int | None = None,
    max_topk: int | None = None,
) -> tuple[TopK, DraftTreeBatch]:
    """Top-K (``K = min(max_budget, V, max_topk)``) then best-first trees from drafter ``logits [B, L, V]``."""
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, L, V], got shape {tuple(logits.shape)}")
    batch, depth, vocab = logits.shape
    if depth > MAX_DEPTH:
        raise ValueError(f"depth must be <= {MAX_DEPTH}, got {depth}")
    budget_t, max_budget = _budget_tensor(budgets, batch, max_budget, logits.device)
    if max_topk is not None and max_topk < 1:
        raise ValueError(f"max_topk must be >= 1, got {max_topk}")
    k = min(max_budget, vocab, max_topk if max_topk is not None else max_budget)
    if k == 0 or depth == 0:
        empty = torch.zeros(batch, depth, 0, device=logits.device)
        top = TopK(empty, empty.long(), torch.zeros(batch, dtype=torch.bool, device=logits.device))
    else:
        top = topk_log_probs(logits, k)
    return top, build_tree_from_topk(top.log_probs, top.ids, budget_t, max_budget)


# --- verify inputs -----------------------------------------------------------------------------------------


def tree_verify_inputs(
    tree: DraftTreeBatch,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    mask_numel: int | None = None,
) -> VerifyInputs:
    """Verify-pass inputs for padded trees; ``seq_lens [B]`` are the committed lengths (root positions).

    ``mask_numel`` is the size of the flat ``custom_mask``, ``sum_b N * (seq_len_b + N)`` (SGLang knows it on
    the host); 0 skips the flat mask, None computes it (a host read).
    """
    width = tree.parents.shape[1]
    batch = tree.parents.shape[0]
    if root_tokens.numel() != batch or seq_lens.numel() != batch:
        raise ValueError("root_tokens and seq_lens must have one entry per request")
    if mask_numel is None:
        mask_numel = int(((seq_lens.long() + width) * width).sum()) if batch else 0
    if _use_kernels(tree.parents):
        input_ids, positions, visibility, flat_mask, retrieve_index, next_token, next_sibling = (
            torch.ops.ddtree_runtime.tree_verify_inputs(
                tree.token_ids, tree.depths, tree.parents, tree.num_nodes, root_tokens, seq_lens, mask_numel))
        return VerifyInputs(candidates=input_ids, positions=positions, visibility=visibility, custom_mask=flat_mask,
                            retrieve_index=retrieve_index, retrieve_next_token=next_token,
                            retrieve_next_sibling=next_sibling)
    return _verify_reference(tree, root_tokens, seq_lens, mask_numel)


def _verify_reference(batch: DraftTreeBatch, root_tokens: torch.Tensor, seq_lens: torch.Tensor,
                      mask_numel: int) -> VerifyInputs:
    lists = batch.retrieve_lists()
    lengths = seq_lens.long().reshape(-1)
    if mask_numel > 0:
        flat = batch.flat_attention_mask(lengths.tolist())
        if flat.numel() != mask_numel:
            raise ValueError(f"mask_numel is {mask_numel} but the flat mask has {flat.numel()} elements")
    else:
        flat = torch.zeros(0, dtype=torch.bool, device=batch.parents.device)
    return VerifyInputs(
        candidates=batch.verify_input_ids(root_tokens.long()),
        positions=batch.positions(lengths),
        visibility=batch.visibility,
        custom_mask=flat,
        retrieve_index=lists.retrieve_index,
        retrieve_next_token=lists.retrieve_next_token,
        retrieve_next_sibling=lists.retrieve_next_sibling,
    )


# --- acceptance --------------------------------------------------------------------------------------------


def greedy_accept(
    verify: VerifyInputs, target_predict: torch.Tensor, starts: torch.Tensor, max_depth: int
) -> Acceptance:
    """Walk each tree with the target's token per slot (``target_predict [B, N]``); ``starts [B]`` are the
    cache positions of the roots. ``max_depth`` is the drafter depth L."""
    if not 0 <= max_depth <= MAX_DEPTH:
        raise ValueError(f"max_depth must be in [0, {MAX_DEPTH}], got {max_depth}")
    if target_predict.shape != verify.candidates.shape:
        raise ValueError("target_predict must be [B, N] like the verify tokens")
    if _use_kernels(verify.candidates):
        accept_index, num_accepted, bonus, kv_src, kv_dst = torch.ops.ddtree_runtime.greedy_accept(
            verify.candidates, verify.retrieve_next_token, verify.retrieve_next_sibling, target_predict, starts,
            max_depth)
        return Acceptance(nodes=accept_index, lengths=num_accepted, bonus=bonus, kv_src=kv_src, kv_dst=kv_dst)
    return _accept_reference(verify, target_predict, starts, max_depth)


def _accept_reference(verify: VerifyInputs, target_predict: torch.Tensor, starts: torch.Tensor,
                      max_depth: int) -> Acceptance:
    nodes, lengths, bonus = follow_greedy_batch(
        verify.candidates, verify.retrieve_next_token, verify.retrieve_next_sibling, target_predict.long(), max_depth)
    column = torch.arange(max_depth + 1, device=nodes.device)
    live = column[None, :] < lengths[:, None]
    base = starts.long().reshape(-1, 1)
    none = torch.full_like(nodes, NO_NODE)
    return Acceptance(
        nodes=nodes,
        lengths=lengths,
        bonus=bonus,
        kv_src=torch.where(live, base + nodes, none),
        kv_dst=torch.where(live, base + column[None, :], none),
    )


def moving_kv_pairs(acceptance: Acceptance) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(request, src, dst)`` of the slots that actually move, as
    :func:`ddtree_runtime.verify.kv_compaction_indices_batch` lists them (variable size: a host read)."""
    moving = (acceptance.kv_src >= 0) & (acceptance.kv_src != acceptance.kv_dst)
    request, column = torch.nonzero(moving, as_tuple=True)
    return request, acceptance.kv_src[request, column], acceptance.kv_dst[request, column]


# --- self-comparison ---------------------------------------------------------------------------------------


def _differences(name: str, ours: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> list[str]:
    problems = []
    for field, a in ours.items():
        b = reference[field]
        if a.shape != b.shape or not torch.equal(a.cpu(), b.cpu()):
            problems.append(f"{name}.{field} differs from the reference")
    return problems


def compare_with_reference(device: torch.device, seed: int = 0) -> list[str]:
    """Run every operator on a random case (ties, ``-inf``, a zero budget) through the wrappers on ``device``
    and through the PyTorch reference; returns the differences found (empty when bit-identical)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 15, 3000, generator=generator) * 3
    logits[1, :, 1500:] = float("-inf")
    logits[2] = torch.round(logits[2])  # many exact ties
    logits = logits.to(torch.bfloat16).to(device)
    budgets = [64, 0, 200, 17]
    top, tree = build_tree(logits, budgets, max_budget=200)
    ref_top = _topk_reference(logits, 200)
    problems = _differences("topk", {"ids": top.ids, "invalid": top.invalid},
                            {"ids": ref_top.ids, "invalid": ref_top.invalid})
    if not torch.allclose(top.log_probs.cpu(), ref_top.log_probs.cpu(), rtol=0, atol=1e-5):
        problems.append("topk.log_probs differ from the reference by more than 1e-5")
    # Scores must be bit-identical from identical top-K arrays (logsumexp may differ by an ulp).
    ref_tree = _tree_reference(top.log_probs, top.ids, torch.tensor(budgets, device=device), 200)
    problems += _differences("tree", tree.tensors(), ref_tree.tensors())
    roots = torch.randint(0, 3000, (4,), generator=generator).to(device)
    seq_lens = torch.tensor([5, 0, 17, 3], device=device)
    verify = tree_verify_inputs(tree, roots, seq_lens)
    problems += _differences("verify", verify._asdict(),
                             _verify_reference(ref_tree, roots, seq_lens, verify.custom_mask.numel())._asdict())
    predict = _first_child_tokens(verify, generator)
    ours = greedy_accept(verify, predict, seq_lens, 15)
    problems += _differences("accept", ours._asdict(), _accept_reference(verify, predict, seq_lens, 15)._asdict())
    return problems


def _first_child_tokens(verify: VerifyInputs, generator: torch.Generator) -> torch.Tensor:
    """Target tokens that follow each slot's first child (deep walks), random where a slot has none."""
    first = verify.retrieve_next_token.cpu()
    tokens = verify.candidates.cpu()
    random = torch.randint(0, 3000, tokens.shape, generator=generator)
    child_token = torch.gather(tokens, 1, first.clamp(min=0))
    return torch.where(first >= 0, child_token, random).to(verify.candidates.device)


def _register_fakes() -> None:
    """Shape functions so that torch.compile can trace through the operators."""

    @torch.library.register_fake("ddtree_runtime::topk_log_probs")
    def fake_topk_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, depth = logits.shape[0], logits.shape[1]
        return (logits.new_empty(b, depth, k, dtype=torch.float32), logits.new_empty(b, depth, k, dtype=torch.long),
                logits.new_empty(b, dtype=torch.bool))

    @torch.library.register_fake("ddtree_runtime::build_tree")
    def fake_build_tree(log_probs: torch.Tensor, top_ids: torch.Tensor, budgets: torch.Tensor,
                        max_budget: int) -> tuple[torch.Tensor, ...]:
        b = log_probs.shape[0]
        flat = log_probs.new_empty(b, max_budget, dtype=torch.long)
        return (flat, flat.clone(), log_probs.new_empty(b, max_budget + 1, dtype=torch.long),
                log_probs.new_empty(b, max_budget, dtype=torch.float64), flat.clone(),
                log_probs.new_empty(b, dtype=torch.long))

    @torch.library.register_fake("ddtree_runtime::tree_verify_inputs")
    def fake_tree_verify_inputs(  # noqa: PLR0917 - the operator schema is positional
        token_ids: torch.Tensor, depths: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor,
        root_tokens: torch.Tensor, seq_lens: torch.Tensor, mask_numel: int
    ) -> tuple[torch.Tensor, ...]:
        b, n = parents.shape
        square = parents.new_empty(b, n, dtype=torch.long)
        return (square, square.clone(), parents.new_empty(b, n, n, dtype=torch.bool),
                parents.new_empty(mask_numel, dtype=torch.bool), square.clone(), square.clone(), square.clone())

    @torch.library.register_fake("ddtree_runtime::greedy_accept")
    def fake_greedy_accept(  # noqa: PLR0917 - the operator schema is positional
        candidates: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor,
        target_predict: torch.Tensor, starts: torch.Tensor, max_depth: int
    ) -> tuple[torch.Tensor, ...]:
        b = candidates.shape[0]
        path = candidates.new_empty(b, max_depth + 1, dtype=torch.long)
        single = candidates.new_empty(b, dtype=torch.long)
        return path, single, single.clone(), path.clone(), path.clone()


if extension_available():
    _register_fakes()
