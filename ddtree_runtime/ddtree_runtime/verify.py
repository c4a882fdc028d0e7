"""Tree verification: greedy and lossless sampled walks, and KV-compaction indices.

The verify pass feeds ``[root, node_1..node_n]`` with ancestor-only attention and depth positions, so the
target logits at node i are exactly ``p(. | context, path(i))``. Sample-and-match then draws one token per
node independently from that conditional (argmax when greedy) and walks from the root while the drawn token
is a child of the current node. Every committed token is a fresh target draw given its true prefix, so the
output distribution equals autoregressive sampling (the tree only decides how many draws come for free).
Draft probabilities are never used, unlike Leviathan-style rejection sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree_runtime.sampling import SamplingParams, sample_tokens
from ddtree_runtime.tree import NO_NODE, DraftTree

__all__ = [
    "VerifyResult",
    "compact_kv_",
    "follow_greedy",
    "follow_greedy_batch",
    "kv_compaction_indices",
    "kv_compaction_indices_batch",
    "verify_tree",
]


@dataclass(frozen=True)
class VerifyResult:
    """``accepted``: node indices from the root (always starts with 0); ``bonus``: the target's next token
    after the last accepted node; ``node_tokens``: the target token drawn at every node."""

    accepted: list[int]
    bonus: int
    node_tokens: torch.Tensor

    @property
    def acceptance_length(self) -> int:
        """tau of this round: accepted drafts + 1 (the bonus that the round adds)."""
        return len(self.accepted)


def follow_greedy(tree: DraftTree, target_tokens: torch.Tensor | list[int]) -> tuple[list[int], int]:
    """Walk from the root while the target's token at the current node is one of its children.

    ``target_tokens [n + 1]`` holds the target's token at every node (argmax for greedy, a per-node sample
    otherwise). Returns ``(accepted node indices starting at 0, next bonus token)``.
    """
    tokens = target_tokens.tolist() if isinstance(target_tokens, torch.Tensor) else list(target_tokens)
    if len(tokens) != tree.num_nodes + 1:
        raise ValueError(f"need {tree.num_nodes + 1} target tokens, got {len(tokens)}")
    child_maps = tree.child_maps
    accepted = [0]
    current = 0
    bonus = int(tokens[0])
    while bonus in child_maps[current]:
        current = child_maps[current][bonus]
        accepted.append(current)
        bonus = int(tokens[current])
    return accepted, bonus


def verify_tree(
    tree: DraftTree, node_logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> VerifyResult:
    """Draw the target's token at every node from ``node_logits [n + 1, V]`` and walk the tree."""
    node_tokens = sample_tokens(node_logits, params, generator)
    accepted, bonus = follow_greedy(tree, node_tokens)
    return VerifyResult(accepted=accepted, bonus=bonus, node_tokens=node_tokens)


def follow_greedy_batch(
    candidates: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    max_depth: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched walk over EAGLE-style links (the reference for a GPU verify kernel).

    Args:
        candidates: ``[B, N]`` verify tokens (root first, ``-1`` padding).
        retrieve_next_token / retrieve_next_sibling: ``[B, N]`` links (``-1`` terminated).
        target_predict: ``[B, N]`` target token at each slot.
        max_depth: deepest level to walk (L).
    Returns:
        ``(nodes, lengths, bonus)``, the first fields of :class:`ddtree_runtime.ops.Acceptance`: ``nodes
        [B, max_depth + 1]`` node indices on the accepted path (root first, ``-1`` padded), ``lengths [B]``
        (tau, root included; SGLang's ``accept_token_num`` is ``lengths - 1``) and ``bonus [B]``.
    """
    batch = candidates.shape[0]
    rows = torch.arange(batch, device=candidates.device)
    nodes = torch.full((batch, max_depth + 1), NO_NODE, dtype=torch.long, device=candidates.device)
    nodes[:, 0] = 0
    lengths = torch.ones(batch, dtype=torch.long, device=candidates.device)
    current = torch.zeros(batch, dtype=torch.long, device=candidates.device)
    walking = torch.ones(batch, dtype=torch.bool, device=candidates.device)
    for level in range(1, max_depth + 1):
        wanted = target_predict[rows, current]
        child = retrieve_next_token[rows, current]
        found = torch.full_like(current, NO_NODE)
        # Follow each sibling chain until a match; chains are at most N long.
        probe = child
        while bool(((probe >= 0) & (found < 0) & walking).any()):
            safe = probe.clamp(min=0)
            match = walking & (probe >= 0) & (found < 0) & (candidates[rows, safe] == wanted)
            found = torch.where(match, probe, found)
            probe = torch.where(probe >= 0, retrieve_next_sibling[rows, safe], probe)
        walking = walking & (found >= 0)
        current = torch.where(walking, found, current)
        nodes[:, level] = torch.where(walking, found, nodes[:, level])
        lengths += walking.to(torch.long)
        if not bool(walking.any()):
            break
    bonus = target_predict[rows, current]
    return nodes, lengths, bonus


def kv_compaction_indices(start: int, accepted: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots to move after a round: ``dst = start + j`` receives ``src = start + accepted[j]``.

    Only slots that actually move are listed (``accepted[j] != j``). Since ``accepted[j] >= j`` and the
    list is increasing, copying in increasing ``dst`` order in place never overwrites a pending source.
    After the copy the cache is cropped to ``start + len(accepted)``.
    """
    moving = [(start + node, start + j) for j, node in enumerate(accepted) if node != j]
    src = torch.tensor([s for s, _unused in moving], dtype=torch.long)
    dst = torch.tensor([d for _unused, d in moving], dtype=torch.long)
    return src, dst


def kv_compaction_indices_batch(
    starts: torch.Tensor, nodes: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched :func:`kv_compaction_indices` over :func:`follow_greedy_batch`'s ``nodes`` and ``lengths``.

    ``starts [B]`` are the per-request positions of the root (their committed lengths); returns
    ``(request, src, dst)`` flat int64 tensors listing only moving slots, ordered by request then ``dst``.
    """
    depth = torch.arange(nodes.shape[1], device=nodes.device)
    moving = (depth[None, :] < lengths[:, None]) & (nodes != depth[None, :])
    request, column = torch.nonzero(moving, as_tuple=True)
    src = starts[request] + nodes[request, column]
    dst = starts[request] + column
    return request, src, dst


def compact_kv_(cache: torch.Tensor, seq_dim: int, start: int, accepted: list[int]) -> None:
    """Apply :func:`kv_compaction_indices` to one K or V tensor in place along ``seq_dim``."""
    src, dst = kv_compaction_indices(start, accepted)
    if src.numel() == 0:
        return
    src = src.to(cache.device)
    dst = dst.to(cache.device)
    cache.index_copy_(seq_dim, dst, cache.index_select(seq_dim, src))
