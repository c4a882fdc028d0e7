"""The tensors a DDTree round hands to SGLang's tree-verify path, and how its results map back.

Pure PyTorch (no SGLang import). The verify inputs are :class:`ddtree_runtime.ops.VerifyInputs`, the container the
PyTorch reference and the kernels build, in SGLang 0.5.23's EAGLE tree-verify layout and names:

- ``candidates [B, W]``: verify tokens per request, the root (bonus) first; here padded slots repeat the root
  token so every row indexes a real embedding (they are never linked, so never accepted);
- ``positions [B, W]``: ``seq_len + depth`` (siblings share a position); the worker hands SGLang
  ``candidates`` and ``positions`` flattened (``draft_token``, ``positions [B * W]``);
- ``custom_mask``: ``TreeMaskMode.FULL_MASK``, per request ``W x (seq_len + W)`` bools row-major, requests
  concatenated (SGLang sizes it ``sum(seq_lens) * W + W * W * B``; True = may attend);
- ``retrieve_index [B, W]``: flat row ``b * W + i`` of slot i (padded slots too: SGLang's kernels index predicts by
  it); ``retrieve_next_token`` / ``retrieve_next_sibling`` the left-child / right-sibling links within the request
  (``-1`` terminated).

``verify_tree_greedy_func`` / ``tree_speculative_sampling_target_only`` return ``accept_index [B, S]`` holding flat
rows (``-1`` padded; column 0 is the root) and ``accept_token_num [B]`` = accepted drafts (root excluded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from ddtree_runtime import ops
from ddtree_runtime.ops import VerifyInputs
from ddtree_runtime.tree import NO_NODE, DraftTreeBatch, ranked_topk


def with_sglang_padding(verify: VerifyInputs, root_tokens: torch.Tensor) -> VerifyInputs:
    """``verify`` with SGLang's padding: padded slots (``-1`` from :func:`ddtree_runtime.ops.tree_verify_inputs`)
    get the root token in ``candidates`` and their own flat row in ``retrieve_index``; nothing is read on the host."""
    batch, width = verify.candidates.shape
    roots = root_tokens.reshape(-1).to(torch.long)
    device = verify.candidates.device
    slots = torch.arange(width, device=device)
    return verify._replace(
        candidates=torch.where(verify.candidates < 0, roots[:, None].expand(-1, width), verify.candidates),
        retrieve_index=torch.arange(batch, device=device)[:, None] * width + slots[None, :],
    )


def sglang_verify_inputs(
    trees: DraftTreeBatch,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    width: int | None = None,
    *,
    seq_lens_sum: int | None = None,
) -> VerifyInputs:
    """Lay a batch of trees out for SGLang's verify, padded to ``width`` slots per request (default: the batch's).

    A fixed ``width`` (budget + 1) keeps CUDA-graph shapes constant whatever size the trees came out.
    ``seq_lens_sum`` (``sum(seq_lens)``, known on the host) sizes the flat mask without reading the device; the
    trees' tensors decide the builder (:func:`ddtree_runtime.ops.tree_verify_inputs`: the kernel for CUDA tensors
    when the extension is built, the PyTorch reference otherwise).
    """
    trees = trees.padded(trees.width if width is None else width)
    slots = trees.width
    mask_numel = None if seq_lens_sum is None else slots * seq_lens_sum + trees.batch_size * slots * slots
    roots = root_tokens.reshape(-1).to(torch.long)
    verify = ops.tree_verify_inputs(trees, roots, seq_lens.reshape(-1), mask_numel)
    return with_sglang_padding(verify, roots)


def compiled_sglang_verify_inputs(
    log_probs: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    seq_lens_sum: int,
    budget: int,
) -> VerifyInputs:
    """The same inputs as :func:`sglang_verify_inputs`, the trees built by the CUDA kernels, without a host read.

    ``log_probs`` / ``ids`` ``[B, L, K]`` are the per-depth top-k (rank order); every request gets ``budget``
    nodes and ``W = budget + 1`` slots; ``seq_lens_sum`` is ``sum(seq_lens)`` known on the host (it sizes the
    flat mask).
    """
    batch = int(log_probs.shape[0])
    budgets = torch.full((batch,), budget, dtype=torch.long, device=log_probs.device)
    trees = ops.build_tree_from_topk(log_probs, ids, budgets, max_budget=budget)
    return sglang_verify_inputs(trees, root_tokens, seq_lens, budget + 1, seq_lens_sum=seq_lens_sum)


class AcceptedPaths(NamedTuple):
    """SGLang's tree walk (``eagle_sample``) per request, in node terms, all int64:

    - ``nodes [B, S]``: node indices on the accepted path, the root (0) first, ``-1`` padded;
    - ``lengths [B]``: tau, accepted drafts + 1 (SGLang's ``accept_lens`` and commit length);
    - ``rows [B, S]``: the flat verify rows (SGLang's ``accept_index``) to gather committed tokens, hidden states
      and logprobs from; padded entries repeat the last accepted row.

    ``nodes`` and ``lengths`` are :class:`ddtree_runtime.ops.Acceptance`'s first fields, same names and types;
    ``rows`` is what a paged cache needs instead of that walk's bonus and slot copies (the worker permutes the
    request's slots, :func:`accepted_first_order`, and reads the bonus from SGLang's predicts).
    """

    nodes: torch.Tensor
    lengths: torch.Tensor
    rows: torch.Tensor


def accepted_paths(accept_index: torch.Tensor, accept_token_num: torch.Tensor, width: int) -> AcceptedPaths:
    """Convert SGLang's verify output (flat rows) into per-request node indices and gather rows."""
    batch, steps = accept_index.shape
    lengths = accept_token_num.to(torch.long) + 1
    column = torch.arange(steps, device=accept_index.device)
    valid = column[None, :] < lengths[:, None]
    request_base = torch.arange(batch, device=accept_index.device)[:, None] * width
    nodes = torch.where(valid, accept_index.to(torch.long) - request_base, torch.full_like(accept_index, NO_NODE))
    last_row = torch.gather(accept_index.to(torch.long), 1, (lengths - 1).clamp(min=0)[:, None])
    rows = torch.where(valid, accept_index.to(torch.long), last_row.expand(-1, steps))
    return AcceptedPaths(nodes=nodes.to(torch.long), lengths=lengths, rows=rows)


def accepted_first_order(paths: AcceptedPaths, width: int) -> torch.Tensor:
    """``[B, W]`` permutation of a request's verify slots: the accepted nodes in path order, then the rest ascending.

    Writing ``verify_slots[b, order[b, i]]`` to position ``prefix + i`` commits the accepted path contiguously
    while every slot stays owned by its request (a permutation: nothing is freed, nothing leaks).
    """
    batch, steps = paths.nodes.shape
    device = paths.nodes.device
    slot = torch.arange(width, device=device)
    key = torch.cat([steps + slot.expand(batch, -1), torch.zeros(batch, 1, dtype=torch.long, device=device)], dim=1)
    valid = paths.nodes >= 0
    target = torch.where(valid, paths.nodes, torch.full_like(paths.nodes, width))  # column W is a dump
    key.scatter_(1, target, torch.arange(steps, device=device).expand(batch, -1).contiguous())
    return torch.argsort(key[:, :width], dim=1, stable=True)


def committed_tokens(predicts: torch.Tensor, paths: AcceptedPaths, out_width: int) -> torch.Tensor:
    """``[B, out_width]`` tokens committed this round: the target's token at each accepted node (the last one
    is the bonus); SGLang reads the first ``lengths[b]`` of each row."""
    steps = paths.rows.shape[1]
    if out_width < steps:
        raise ValueError(f"out_width {out_width} is narrower than the {steps} accept slots")
    tokens = torch.zeros(paths.rows.shape[0], out_width, dtype=torch.long, device=predicts.device)
    tokens[:, :steps] = predicts.reshape(-1)[paths.rows].to(torch.long)
    return tokens


def merge_sharded_topk(
    shard_values: Sequence[torch.Tensor],
    shard_ids: Sequence[torch.Tensor],
    shard_log_z: Sequence[torch.Tensor],
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global float32 top-k log-probabilities and ids from vocab-parallel shards (one entry per TP rank).

    Each shard gives its local top-k logits ``[T, k_local]`` with *global* ids and its local
    ``logsumexp`` ``[T]``. The global normaliser is the logsumexp of the shard normalisers; the global top-k
    is the top-k of the union, ranked like :func:`ddtree_runtime.tree.ranked_topk` (ties to the lower id).
    Every rank runs this on the same gathered tensors, so every rank builds the same tree.
    """
    values = torch.cat([v.float() for v in shard_values], dim=-1)
    ids = torch.cat([i.to(torch.long) for i in shard_ids], dim=-1)
    log_z = torch.logsumexp(torch.stack([z.float() for z in shard_log_z], dim=-1), dim=-1, keepdim=True)
    if not 0 < k <= values.shape[-1]:
        raise ValueError(f"k must be in [1, {values.shape[-1]}], got {k}")
    # Order candidates by id first so ranked_topk's lower-index tie-break is the lower-token-id tie-break.
    order = torch.argsort(ids, dim=-1, stable=True)
    values_by_id = torch.gather(values, -1, order)
    ids_by_id = torch.gather(ids, -1, order)
    top_values, positions = ranked_topk(values_by_id, k)
    top_ids = torch.gather(ids_by_id, -1, positions)
    neg_inf = torch.full_like(top_values, float("-inf"))
    log_probs = torch.where(torch.isneginf(top_values), neg_inf, top_values - log_z)
    return log_probs, top_ids


def local_topk(logits: torch.Tensor, k: int, id_offset: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One rank's share: float32 top-k logits, their global ids and the local logsumexp of ``logits [T, V_local]``."""
    local = logits.float()
    k_local = min(k, local.shape[-1])
    values, ids = ranked_topk(local, k_local)
    return values, ids + id_offset, torch.logsumexp(local, dim=-1)


def gather_merged_topk(
    values: torch.Tensor,
    ids: torch.Tensor,
    log_z: torch.Tensor,
    k: int,
    *,
    world: int,
    all_gather: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's share (:func:`local_topk`) gathered and merged: the same global top-k on every rank.

    ``all_gather(t)`` concatenates each rank's ``t`` along dim 0 in rank order (SGLang's
    ``tp_group.all_gather(t, dim=0)``); ``world`` is the number of ranks.
    """
    if world == 1:
        return merge_sharded_topk([values], [ids], [log_z], k)
    gathered = [all_gather(t.contiguous()).view(world, *t.shape) for t in (values, ids, log_z)]
    return merge_sharded_topk(list(gathered[0]), list(gathered[1]), list(gathered[2]), k)


_DIGEST_PRIME = 1_000_003
_DIGEST_MASK = (1 << 61) - 1


def round_digest(verify: VerifyInputs) -> torch.Tensor:
    """A per-request int64 fingerprint of a round's trees (tokens, positions and links), on their device.

    Ranks that build the same trees get the same digests; the worker compares them across TP ranks when
    ``DDTREE_DEBUG_TREE_DIGEST=1``.
    """
    batch = verify.candidates.shape[0]
    fields = (verify.candidates.reshape(batch, -1), verify.positions.reshape(batch, -1),
              verify.retrieve_next_token.reshape(batch, -1), verify.retrieve_next_sibling.reshape(batch, -1))
    flat = torch.cat([f.to(torch.int64) for f in fields], dim=1)
    weights = torch.arange(1, flat.shape[1] + 1, dtype=torch.int64, device=flat.device)
    return ((flat + 7) * (weights * _DIGEST_PRIME % _DIGEST_MASK)).sum(dim=1) % _DIGEST_MASK
