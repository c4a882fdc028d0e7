"""The tensors a DDTree round hands to SGLang's tree-verify path, and how its results map back.

Pure PyTorch (no SGLang import). Layouts follow SGLang 0.5.23's EAGLE tree verify:

- ``candidates [B, W]``: verify tokens per request, the root (bonus) first; padded slots repeat the root
  token so every row indexes a real embedding (they are never linked, so never accepted).
- ``positions [B * W]``: ``seq_len + depth`` (siblings share a position).
- ``custom_mask``: ``TreeMaskMode.FULL_MASK``, per request ``W x (seq_len + W)`` bools row-major, requests
  concatenated (SGLang sizes it ``sum(seq_lens) * W + W * W * B``; True = may attend).
- ``retrieve_index [B, W]``: flat row ``b * W + i`` of slot i; ``retrieve_next_token`` / ``retrieve_next_sibling``
  the left-child / right-sibling links within the request (``-1`` terminated).

``verify_tree_greedy_func`` / ``tree_speculative_sampling_target_only`` return ``accept_index [B, S]`` holding flat
rows (``-1`` padded; column 0 is the root) and ``accept_token_num [B]`` = accepted drafts (root excluded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ddtree_runtime import ops
from ddtree_runtime.tree import NO_NODE, DraftTreeBatch, ranked_topk


@dataclass(frozen=True)
class TreeVerifyTensors:
    candidates: torch.Tensor
    positions: torch.Tensor
    custom_mask: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor

    @property
    def width(self) -> int:
        return int(self.candidates.shape[1])


def tree_verify_tensors(
    trees: DraftTreeBatch, root_tokens: torch.Tensor, seq_lens: torch.Tensor, width: int | None = None
) -> TreeVerifyTensors:
    """Lay a batch of trees out for SGLang's verify, padded to ``width`` slots per request (default: the batch's).

    A fixed ``width`` (budget + 1) keeps CUDA-graph shapes constant whatever size the trees came out.
    """
    trees = trees.padded(trees.width if width is None else width)
    batch, slots = trees.batch_size, trees.width
    roots = root_tokens.reshape(-1).to(torch.long)
    candidates = trees.verify_input_ids(roots)
    candidates = torch.where(candidates < 0, roots[:, None].expand(-1, slots), candidates)
    starts = seq_lens.reshape(-1).to(torch.long)
    positions = trees.positions(starts).reshape(-1)
    mask = trees.flat_attention_mask([int(s) for s in starts.tolist()])
    links = trees.retrieve_lists()
    if batch:
        # Padded slots keep their own row in retrieve_index: SGLang kernels index predicts by it.
        slot = torch.arange(slots, device=candidates.device)
        links_index = torch.arange(batch, device=candidates.device)[:, None] * slots + slot[None, :]
    else:
        links_index = links.retrieve_index
    return TreeVerifyTensors(
        candidates=candidates,
        positions=positions,
        custom_mask=mask,
        retrieve_index=links_index,
        retrieve_next_token=links.retrieve_next_token,
        retrieve_next_sibling=links.retrieve_next_sibling,
    )


def compiled_verify_tensors(
    log_probs: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    seq_lens_sum: int,
    budget: int,
) -> TreeVerifyTensors:
    """The same tensors as :func:`tree_verify_tensors`, built by the CUDA kernels without a host read.

    ``log_probs`` / ``ids`` ``[B, L, K]`` are the per-depth top-k (rank order); every request gets ``budget``
    nodes and ``W = budget + 1`` slots; ``seq_lens_sum`` is ``sum(seq_lens)`` known on the host (it sizes the
    flat mask).
    """
    batch = int(log_probs.shape[0])
    width = budget + 1
    budgets = torch.full((batch,), budget, dtype=torch.long, device=log_probs.device)
    tree = ops.build_tree_from_topk(log_probs, ids, budgets, max_budget=budget)
    roots = root_tokens.reshape(-1).to(torch.long)
    verify = ops.tree_verify_inputs(tree, roots, seq_lens.reshape(-1), mask_numel=width * seq_lens_sum
                                    + batch * width * width)
    slots = torch.arange(width, device=log_probs.device)
    return TreeVerifyTensors(
        candidates=torch.where(verify.input_ids < 0, roots[:, None].expand(-1, width), verify.input_ids),
        positions=verify.positions.reshape(-1),
        custom_mask=verify.flat_mask,
        retrieve_index=torch.arange(batch, device=log_probs.device)[:, None] * width + slots[None, :],
        retrieve_next_token=verify.retrieve_next_token,
        retrieve_next_sibling=verify.retrieve_next_sibling,
    )


@dataclass(frozen=True)
class AcceptedPaths:
    """Per request: ``nodes [B, S]`` accepted node indices (root first, ``-1`` padded), ``lengths [B]`` = tau
    (accepted drafts + 1, SGLang's commit length), ``rows [B, S]`` the flat verify rows to gather committed
    hidden states / KV slots from (padded entries repeat the last accepted row)."""

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


def round_digest(tensors: TreeVerifyTensors) -> torch.Tensor:
    """A per-request int64 fingerprint of a round's trees (tokens, positions and links), on the tensors' device.

    Ranks that build the same trees get the same digests; the worker compares them across TP ranks when
    ``DDTREE_DEBUG_TREE_DIGEST=1``.
    """
    batch = tensors.candidates.shape[0]
    fields = (tensors.candidates.reshape(batch, -1), tensors.positions.reshape(batch, -1),
              tensors.retrieve_next_token.reshape(batch, -1), tensors.retrieve_next_sibling.reshape(batch, -1))
    flat = torch.cat([f.to(torch.int64) for f in fields], dim=1)
    weights = torch.arange(1, flat.shape[1] + 1, dtype=torch.int64, device=flat.device)
    return ((flat + 7) * (weights * _DIGEST_PRIME % _DIGEST_MASK)).sum(dim=1) % _DIGEST_MASK
