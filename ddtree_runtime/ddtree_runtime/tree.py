"""DDTree draft trees: best-first construction over per-depth drafter marginals.

Exact semantics (shared by :func:`build_tree`, :func:`build_tree_batch` and any accelerated port, which must
reproduce them bit for bit):

1. **Log-probabilities.** ``draft_logits[..., d, :]`` (depth ``d + 1`` below the root) are cast to float32.
   ``log_z = logsumexp(logits)`` in float32 and ``lp = top_logit - log_z`` in float32. A top logit of ``-inf``
   gives ``lp = -inf`` (also when the whole row is ``-inf``); NaN or ``+inf`` logits are rejected.
2. **Per-depth top-k.** ``K = min(budget, V, max_topk)``. Tokens are ranked by logit descending, ties broken by
   the lower token id (see :func:`ranked_topk`); rank ``r`` is 0-based. Float32 ``logsumexp`` is not
   bit-reproducible across backends (reduction order), so cross-implementation parity is defined from
   identical top-k arrays: :func:`build_tree_from_topk` / :func:`build_tree_batch_from_topk` run only the
   search below.
3. **Prefix scores.** ``logw(u)`` of a prefix ``u = (u_1..u_d)`` is the float64 left fold
   ``((0.0 + lp_1) + lp_2) + ... + lp_d`` of the float32 values widened to float64. A sibling's score is
   computed from its parent's score (never ``logw - lp[r] + lp[r + 1]``), so ``-inf`` never produces NaN.
4. **Best-first order.** Nodes are popped by ``logw`` descending; equal scores are ordered by the prefix's
   rank tuple, lexicographically ascending (a prefix precedes its extensions). This order is total, so the
   tree is unique. Popping a node pushes its next sibling (rank + 1, if below K) and its first child (rank 0
   at the next depth, if the depth is below L). At most ``budget`` nodes are popped; fewer when the heap
   runs dry (tiny vocabularies).
5. **Numbering.** The root (the bonus token, not counted in the budget) is node 0; node ``i >= 1`` is the
   i-th pop, so ``parents[i] < i`` and scores are nonincreasing in ``i``. Siblings are distinct tokens
   because they are distinct ranks of one distribution.

The result holds exactly the ``min(budget, #prefixes)`` most probable prefixes under the factorised drafter
distribution ``Q(u) = prod_d q_d(u_d)`` (Ringel & Romano, Prop. 2-3), restricted to the top-K tokens per depth.
``budget = 0`` (or ``L = 0``) gives a root-only tree: plain autoregressive decoding.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from functools import cached_property

import numpy as np
import torch

__all__ = [
    "DraftTree",
    "DraftTreeBatch",
    "RetrieveLists",
    "build_chain_tree",
    "build_tree",
    "build_tree_batch",
    "build_tree_batch_from_topk",
    "build_tree_from_topk",
    "depth_log_probs",
    "parents_from_visibility",
    "ranked_topk",
    "retrieve_lists_from_parents",
    "visibility_from_parents",
]

NO_NODE = -1
"""Sentinel for "no node" / "no token" in parents, retrieve lists and padded token ids (never a real id)."""


@dataclass(frozen=True)
class RetrieveLists:
    """SGLang/EAGLE-style tree links (left-child / right-sibling), all int64 with ``-1`` terminators.

    For a single tree of ``n + 1`` nodes (root = 0): ``retrieve_index[i]`` is node i's row in the flattened
    verify batch (``i`` for one tree, ``b * (N) + i`` in a batch of width N), ``retrieve_next_token[i]`` is
    i's first child (its most probable child, i.e. the lowest node index), ``retrieve_next_sibling[i]`` is the
    next child of i's parent in increasing node index. Padded slots are ``-1`` everywhere.
    """

    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor


def ranked_topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim, sorted by value descending with ties broken by the lower index.

    ``torch.topk`` leaves the order of equal values unspecified (and which of them survive a cut), which would
    make trees depend on the backend. This selects the k largest by ``(value desc, index asc)``.
    """
    vocab = values.shape[-1]
    if not 0 < k <= vocab:
        raise ValueError(f"k must be in [1, {vocab}], got {k}")
    if k == vocab:
        order = torch.sort(values, dim=-1, descending=True, stable=True)
        return order.values, order.indices
    top_values, top_ids = torch.topk(values, k, dim=-1)
    threshold = top_values[..., -1:]
    if bool(((values >= threshold).sum(dim=-1) == k).all()):
        # The selected set is unambiguous; only the order of equal values inside it needs fixing.
        ids_ascending, perm = torch.sort(top_ids, dim=-1)
        order = torch.sort(torch.gather(top_values, -1, perm), dim=-1, descending=True, stable=True)
        return order.values, torch.gather(ids_ascending, -1, order.indices)
    above = values > threshold
    at_threshold = values == threshold
    missing = k - above.sum(dim=-1, keepdim=True)
    selected = above | (at_threshold & (torch.cumsum(at_threshold, dim=-1) <= missing))
    flat = selected.reshape(-1, vocab)
    ids = torch.nonzero(flat)[:, 1].reshape(*values.shape[:-1], k)  # ascending ids within each row
    picked = torch.gather(values, -1, ids)
    order = torch.sort(picked, dim=-1, descending=True, stable=True)
    return order.values, torch.gather(ids, -1, order.indices)


def depth_log_probs(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 top-k log-probabilities and token ids per depth: ``([..., L, k] float32, [..., L, k] int64)``."""
    logits = draft_logits.float()
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        raise ValueError("draft logits contain NaN or +inf")
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    top_logits, ids = ranked_topk(logits, k)
    neg_inf = torch.full_like(top_logits, float("-inf"))
    log_probs = torch.where(torch.isneginf(top_logits), neg_inf, top_logits - log_z)
    return log_probs, ids


def visibility_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self matrix ``[..., N, N]`` from ``parents [..., N]`` (``-1`` = root or padding).

    Row i is True at i and at every ancestor of i. A padded node (parent -1 at i > 0) sees only itself.
    """
    size = parents.shape[-1]
    batch_shape = parents.shape[:-1]
    flat_parents = parents.reshape(-1, size)
    vis = torch.zeros(flat_parents.shape[0], size, size, dtype=torch.bool, device=parents.device)
    rows = torch.arange(flat_parents.shape[0], device=parents.device)
    for i in range(size):
        parent = flat_parents[:, i]
        has_parent = parent >= 0
        if i > 0 and bool(has_parent.any()):
            inherited = vis[rows, parent.clamp(min=0), :i] & has_parent[:, None]
            vis[:, i, :i] = inherited
        vis[:, i, i] = True
    return vis.reshape(*batch_shape, size, size)


def parents_from_visibility(visibility: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`visibility_from_parents` for one forest: ``parents [N]`` from ``visibility [N, N]``.

    A node's parent is its highest-index visible earlier node (ancestors precede their descendants). Raises
    ``ValueError`` when the matrix is not exactly the ancestor-or-self matrix of a forest in that order, e.g. a
    node that sees a sibling: such a mask cannot be run through recurrent state, which follows one path.
    """
    size = visibility.shape[-1]
    if tuple(visibility.shape) != (size, size):
        raise ValueError(f"visibility must be square, got {list(visibility.shape)}")
    earlier = torch.tril(visibility, diagonal=-1)
    index = torch.arange(size, device=visibility.device)
    highest = torch.where(earlier, index[None, :], torch.full_like(earlier, NO_NODE, dtype=torch.long))
    parents = highest.max(dim=-1).values if size else torch.zeros(0, dtype=torch.long, device=visibility.device)
    if not torch.equal(visibility_from_parents(parents), visibility.bool()):
        raise ValueError("the mask is not an ancestor-or-self (tree) mask with parents before their children")
    return parents


def _visibility_rows(parents: list[int]) -> np.ndarray:
    """Ancestor-or-self matrix of one tree whose parents precede their children (numpy, row copies)."""
    size = len(parents)
    vis = np.zeros((size, size), dtype=np.bool_)
    vis[0, 0] = True
    for i in range(1, size):
        vis[i, :i] = vis[parents[i], :i]
        vis[i, i] = True
    return vis


def retrieve_lists_from_parents(parents: torch.Tensor, num_nodes: torch.Tensor) -> RetrieveLists:
    """EAGLE-style links for a batch: ``parents [B, N]``, ``num_nodes [B]`` = valid non-root nodes per tree."""
    batch, width = parents.shape
    device = parents.device
    first_child = torch.full((batch, width), NO_NODE, dtype=torch.long, device=device)
    next_sibling = torch.full((batch, width), NO_NODE, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)
    # Walking nodes from last to first leaves each parent's first child = its lowest-index child and chains
    # siblings in increasing index order.
    for i in range(width - 1, 0, -1):
        parent = parents[:, i]
        valid = (parent >= 0) & (i <= num_nodes)
        safe_parent = parent.clamp(min=0)
        current_first = first_child[rows, safe_parent]
        next_sibling[:, i] = torch.where(valid, current_first, next_sibling[:, i])
        first_child[rows, safe_parent] = torch.where(valid, torch.full_like(current_first, i), current_first)
    slot = torch.arange(width, device=device)
    valid_slot = slot[None, :] <= num_nodes[:, None]
    index = torch.where(valid_slot, rows[:, None] * width + slot[None, :], torch.full_like(first_child, NO_NODE))
    return RetrieveLists(index, first_child, next_sibling)


@dataclass(frozen=True)
class DraftTree:
    """One verified-in-one-pass draft tree. Node 0 is the root (the bonus token); nodes 1..n are drafts.

    Attributes:
        token_ids: int64 ``[n]``, the draft token of node ``i + 1``.
        depths: int64 ``[n]``, depth of node ``i + 1`` (1..L).
        parents: int64 ``[n + 1]``, ``parents[0] == -1`` and ``parents[i] < i``.
        visibility: bool ``[n + 1, n + 1]``, ``visibility[i, j]`` iff j is i or an ancestor of i.
        log_probs: float64 ``[n]``, ``log Q`` of node ``i + 1``'s prefix (the heap score).
        ranks: int64 ``[n]``, rank of node ``i + 1``'s token in its depth's top-k.
    """

    token_ids: torch.Tensor
    depths: torch.Tensor
    parents: torch.Tensor
    visibility: torch.Tensor
    log_probs: torch.Tensor
    ranks: torch.Tensor

    @property
    def num_nodes(self) -> int:
        """Number of drafted (non-root) nodes n."""
        return int(self.token_ids.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depths.max()) if self.num_nodes else 0

    @cached_property
    def child_maps(self) -> list[dict[int, int]]:
        """``child_maps[i][token] = child node index``; keys are distinct because siblings are."""
        maps: list[dict[int, int]] = [{} for _unused in range(self.num_nodes + 1)]
        for node, (parent, token) in enumerate(zip(self.parents[1:].tolist(), self.token_ids.tolist(), strict=True)):
            maps[parent][token] = node + 1
        return maps

    def verify_input_ids(self, root_token: int) -> torch.Tensor:
        """``[n + 1]`` verify tokens: the root followed by the drafts in node order."""
        root = torch.tensor([root_token], dtype=torch.long, device=self.token_ids.device)
        return torch.cat([root, self.token_ids])

    def positions(self, start: int) -> torch.Tensor:
        """``[n + 1]`` position ids: ``start`` for the root, ``start + depth`` for node i (siblings share)."""
        zero = torch.zeros(1, dtype=torch.long, device=self.depths.device)
        return start + torch.cat([zero, self.depths])

    def attention_mask(self, past_len: int) -> torch.Tensor:
        """Bool ``[n + 1, past_len + n + 1]``: every node sees the whole past and its ancestors-or-self."""
        past = torch.ones(self.num_nodes + 1, past_len, dtype=torch.bool, device=self.visibility.device)
        return torch.cat([past, self.visibility], dim=1)

    def additive_attention_mask(self, past_len: int, dtype: torch.dtype) -> torch.Tensor:
        """Float mask for SDPA-style kernels: 0 where visible, ``finfo(dtype).min`` elsewhere."""
        allowed = self.attention_mask(past_len)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return mask.masked_fill(~allowed, torch.finfo(dtype).min)

    def flat_attention_mask(self, seq_len: int) -> torch.Tensor:
        """SGLang ``TreeMaskMode.FULL_MASK`` layout for this request: ``attention_mask(seq_len)`` row-major.

        ``seq_len`` is the committed prefix length (the root is the first verify token, at position seq_len).
        """
        return self.attention_mask(seq_len).reshape(-1)

    def retrieve_lists(self) -> RetrieveLists:
        lists = retrieve_lists_from_parents(self.parents[None], torch.tensor([self.num_nodes]))
        return RetrieveLists(lists.retrieve_index[0], lists.retrieve_next_token[0], lists.retrieve_next_sibling[0])

    def surrogate_acceptance(self) -> float:
        """``E_Q[accepted drafts] = sum_u Q(u)`` (Prop. 1); expected tau under Q is this + 1."""
        return float(torch.exp(self.log_probs).sum()) if self.num_nodes else 0.0

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive."""
        path = [node]
        parents = self.parents.tolist()
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        return path[::-1]


class _StageClock:
    def __init__(self, timings: dict[str, float] | None) -> None:
        self.timings = timings
        self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        if self.timings is None:
            return
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - self.last
        self.last = now


def _root_only_tree(device: torch.device) -> DraftTree:
    empty_long = torch.zeros(0, dtype=torch.long, device=device)
    return DraftTree(
        token_ids=empty_long,
        depths=empty_long.clone(),
        parents=torch.full((1,), NO_NODE, dtype=torch.long, device=device),
        visibility=torch.ones(1, 1, dtype=torch.bool, device=device),
        log_probs=torch.zeros(0, dtype=torch.float64, device=device),
        ranks=empty_long.clone(),
    )


def _topk_size(budget: int, vocab: int, max_topk: int | None) -> int:
    k = min(budget, vocab)
    if max_topk is not None:
        if max_topk < 1:
            raise ValueError(f"max_topk must be >= 1, got {max_topk}")
        k = min(k, max_topk)
    return k


def build_tree(
    draft_logits: torch.Tensor,
    budget: int,
    max_topk: int | None = None,
    timings: dict[str, float] | None = None,
) -> DraftTree:
    """Best-first DDTree over ``draft_logits [L, V]`` with at most ``budget`` non-root nodes.

    ``max_topk`` optionally caps the per-depth top-k (``max_topk = 1`` gives the DFlash argmax chain).
    See the module docstring for the exact ordering and arithmetic. Runs the heap on the CPU in Python.
    ``timings``, when given, receives seconds spent in ``topk`` (log-softmax top-k and the host copy),
    ``heap`` and ``visibility``.
    """
    clock = _StageClock(timings)
    if draft_logits.dim() != 2:
        raise ValueError(f"draft_logits must be [L, V], got shape {tuple(draft_logits.shape)}")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    depth_limit, vocab = draft_logits.shape
    device = draft_logits.device
    if budget == 0 or depth_limit == 0:
        return _root_only_tree(device)
    k = _topk_size(budget, vocab, max_topk)
    log_probs, ids = depth_log_probs(draft_logits, k)
    return _search_heap(log_probs, ids, budget, device, clock)


def build_tree_from_topk(top_log_probs: torch.Tensor, top_ids: torch.Tensor, budget: int) -> DraftTree:
    """The heap search alone, from precomputed ``[L, K]`` float32 log-probs and token ids in rank order.

    Uses ``k = min(budget, K)`` ranks per depth. Float32 ``logsumexp`` is not bit-reproducible across
    backends (reduction order differs), so parity tests between implementations (e.g. a CUDA kernel and this
    reference) should feed both the same top-k arrays through this entry point.
    """
    if top_log_probs.dim() != 2 or top_log_probs.shape != top_ids.shape:
        raise ValueError("top_log_probs and top_ids must both be [L, K]")
    if top_log_probs.dtype != torch.float32:
        raise ValueError("top_log_probs must be float32")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    device = top_log_probs.device
    if budget == 0 or top_log_probs.shape[0] == 0 or top_log_probs.shape[1] == 0:
        return _root_only_tree(device)
    k = min(budget, top_log_probs.shape[1])
    return _search_heap(top_log_probs[:, :k], top_ids[:, :k], budget, device, _StageClock(None))


def _search_heap(
    log_probs: torch.Tensor, ids: torch.Tensor, budget: int, device: torch.device, clock: _StageClock
) -> DraftTree:
    depth_limit, k = log_probs.shape
    lp = log_probs.double().cpu().tolist()
    tok = ids.cpu().tolist()
    clock.lap("topk")

    node_logw = [0.0]
    parents = [NO_NODE]
    tokens: list[int] = []
    depths: list[int] = []
    ranks: list[int] = []
    # (-logw, rank tuple, parent node, depth, rank); the rank tuple makes the order total.
    heap: list[tuple[float, tuple[int, ...], int, int, int]] = [(-(0.0 + lp[0][0]), (0,), 0, 1, 0)]
    while heap and len(tokens) < budget:
        neg_logw, rank_path, parent, depth, rank = heapq.heappop(heap)
        logw = -neg_logw
        node = len(tokens) + 1
        node_logw.append(logw)
        parents.append(parent)
        tokens.append(tok[depth - 1][rank])
        depths.append(depth)
        ranks.append(rank)
        if rank + 1 < k:
            sibling_logw = node_logw[parent] + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling_logw, (*rank_path[:-1], rank + 1), parent, depth, rank + 1))
        if depth < depth_limit:
            child_logw = logw + lp[depth][0]
            heapq.heappush(heap, (-child_logw, (*rank_path, 0), node, depth + 1, 0))
    clock.lap("heap")
    visibility = torch.from_numpy(_visibility_rows(parents)).to(device)
    clock.lap("visibility")
    return DraftTree(
        token_ids=torch.tensor(tokens, dtype=torch.long, device=device),
        depths=torch.tensor(depths, dtype=torch.long, device=device),
        parents=torch.tensor(parents, dtype=torch.long, device=device),
        visibility=visibility,
        log_probs=torch.tensor(node_logw[1:], dtype=torch.float64, device=device),
        ranks=torch.tensor(ranks, dtype=torch.long, device=device),
    )


def build_chain_tree(draft_tokens: Sequence[int] | torch.Tensor) -> DraftTree:
    """A linear tree (DFlash block) from explicit draft tokens; ``log_probs`` are zeros (unscored)."""
    tokens = torch.as_tensor(draft_tokens, dtype=torch.long).reshape(-1)
    n = int(tokens.shape[0])
    parents = torch.arange(-1, n, dtype=torch.long)
    return DraftTree(
        token_ids=tokens,
        depths=torch.arange(1, n + 1, dtype=torch.long),
        parents=parents,
        visibility=visibility_from_parents(parents),
        log_probs=torch.zeros(n, dtype=torch.float64),
        ranks=torch.zeros(n, dtype=torch.long),
    )


@dataclass(frozen=True)
class DraftTreeBatch:
    """Fixed-shape batch of trees, padded to ``Bmax`` nodes (``N = Bmax + 1`` slots): the one tree container of
    the PyTorch path (:func:`build_tree_batch`, :func:`build_tree_batch_from_topk`), the CUDA kernels
    (:func:`ddtree_runtime.ops.build_tree_from_topk` returns it) and the SGLang worker. Field names are those
    of :class:`DraftTree`, the single unpadded tree.

    ``token_ids [B, Bmax]`` int64 and ``ranks`` are ``-1`` in padding; ``depths [B, Bmax]`` int64 are 0 in
    padding; ``parents [B, N]`` int64 are ``-1`` at the root and in padding; ``log_probs [B, Bmax]`` float64
    (the heap scores) are ``-inf`` in padding (use ``num_nodes [B]`` int64 to tell padding from a real
    zero-probability node). Padded slots are never linked from any node, so a walk can never reach them.

    ``visibility [B, N, N]`` (ancestor-or-self; rows of padded slots see only themselves, so a fixed-shape
    verify never attends to an empty row) is derived from ``parents`` on first use and kept: the kernels
    do not build it with the tree, and deriving it reads the device (the verify inputs carry their own).
    """

    token_ids: torch.Tensor
    depths: torch.Tensor
    parents: torch.Tensor
    log_probs: torch.Tensor
    ranks: torch.Tensor
    num_nodes: torch.Tensor

    @cached_property
    def visibility(self) -> torch.Tensor:
        """``[B, N, N]`` bool, :func:`visibility_from_parents` of ``parents`` (computed once, a host read)."""
        return visibility_from_parents(self.parents)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The stored fields by name, in declaration order (``visibility`` is derived, not stored)."""
        return {field.name: getattr(self, field.name) for field in dataclass_fields(self)}

    def to(self, device: torch.device | str) -> DraftTreeBatch:
        """The same trees with every stored tensor on ``device``."""
        return DraftTreeBatch(**{name: tensor.to(device) for name, tensor in self.tensors().items()})

    @property
    def batch_size(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def width(self) -> int:
        """Verify slots per request, root included (``Bmax + 1``)."""
        return int(self.parents.shape[1])

    def padded(self, width: int) -> DraftTreeBatch:
        """The same trees with ``width`` slots per request (root included), padded as above."""
        current = self.width
        if width < current:
            raise ValueError(f"cannot pad trees of width {current} down to {width}")
        if width == current:
            return self
        extra = width - current

        def pad(tensor: torch.Tensor, value: float) -> torch.Tensor:
            return torch.nn.functional.pad(tensor, (0, extra), value=value)

        return DraftTreeBatch(
            token_ids=pad(self.token_ids, NO_NODE),
            depths=pad(self.depths, 0),
            parents=pad(self.parents, NO_NODE),
            log_probs=pad(self.log_probs, float("-inf")),
            ranks=pad(self.ranks, NO_NODE),
            num_nodes=self.num_nodes,
        )

    def tree(self, index: int) -> DraftTree:
        """The unpadded tree of request ``index``."""
        n = int(self.num_nodes[index])
        return DraftTree(
            token_ids=self.token_ids[index, :n].clone(),
            depths=self.depths[index, :n].clone(),
            parents=self.parents[index, : n + 1].clone(),
            visibility=self.visibility[index, : n + 1, : n + 1].clone(),
            log_probs=self.log_probs[index, :n].clone(),
            ranks=self.ranks[index, :n].clone(),
        )

    def positions(self, starts: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` position ids ``starts[b] + depth`` (padding gets the root's position)."""
        zero = torch.zeros(self.batch_size, 1, dtype=torch.long, device=self.depths.device)
        return starts.reshape(-1, 1) + torch.cat([zero, self.depths], dim=1)

    def verify_input_ids(self, root_tokens: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` verify tokens (padding stays ``-1``: map it to any embedding row before use)."""
        return torch.cat([root_tokens.reshape(-1, 1).to(torch.long), self.token_ids], dim=1)

    def flat_attention_mask(self, seq_lens: Sequence[int]) -> torch.Tensor:
        """SGLang FULL_MASK: per request ``N x (seq_len + N)`` bools, flattened and concatenated."""
        parts = []
        for b, seq_len in enumerate(seq_lens):
            past = torch.ones(self.width, int(seq_len), dtype=torch.bool, device=self.visibility.device)
            parts.append(torch.cat([past, self.visibility[b]], dim=1).reshape(-1))
        return torch.cat(parts)

    def retrieve_lists(self) -> RetrieveLists:
        return retrieve_lists_from_parents(self.parents, self.num_nodes)


def _lexicographic_min(candidates: torch.Tensor, rank_paths: torch.Tensor) -> torch.Tensor:
    """Narrow ``candidates [B, F]`` to the entry with the smallest rank path (``-1``-padded, ``[B, F, L]``)."""
    sentinel = torch.iinfo(torch.long).max
    for level in range(rank_paths.shape[-1]):
        if not bool((candidates.sum(dim=-1) > 1).any()):
            break
        level_ranks = torch.where(candidates, rank_paths[..., level], torch.full_like(rank_paths[..., level], sentinel))
        candidates = candidates & (level_ranks == level_ranks.min(dim=-1, keepdim=True).values)
    return candidates


class _Frontier:
    """Fixed-slot best-first frontier for :func:`build_tree_batch` (``1 + 2 * Bmax`` slots per request)."""

    def __init__(self, batch: int, slots: int, depth_limit: int, device: torch.device) -> None:
        self.active = torch.zeros((batch, slots), dtype=torch.bool, device=device)
        self.logw = torch.full((batch, slots), float("-inf"), dtype=torch.float64, device=device)
        self.paths = torch.full((batch, slots, depth_limit), NO_NODE, dtype=torch.long, device=device)
        self.parent = torch.zeros((batch, slots), dtype=torch.long, device=device)
        self.depth = torch.ones((batch, slots), dtype=torch.long, device=device)
        self.rank = torch.zeros((batch, slots), dtype=torch.long, device=device)

    def best_slot(self) -> torch.Tensor:
        """Per request, the active slot with the highest score, ties to the smallest rank path."""
        masked = torch.where(self.active, self.logw, torch.full_like(self.logw, float("-inf")))
        best = masked.max(dim=-1, keepdim=True).values
        candidates = _lexicographic_min(self.active & (masked == best), self.paths)
        return candidates.to(torch.uint8).argmax(dim=-1)

    def write(
        self,
        slot: int,
        push: torch.Tensor,
        *,
        logw: torch.Tensor,
        path: torch.Tensor,
        parent: torch.Tensor,
        depth: torch.Tensor,
        rank: torch.Tensor,
    ) -> None:
        self.active[:, slot] = push
        self.logw[:, slot] = logw
        self.paths[:, slot] = path
        self.parent[:, slot] = parent
        self.depth[:, slot] = depth
        self.rank[:, slot] = rank


@dataclass
class _BatchNodes:
    """Growing node arrays of :func:`build_tree_batch`."""

    token_ids: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    parents: torch.Tensor
    logw: torch.Tensor
    num_nodes: torch.Tensor

    @classmethod
    def empty(cls, batch: int, max_budget: int, device: torch.device) -> _BatchNodes:
        logw = torch.full((batch, max_budget + 1), float("-inf"), dtype=torch.float64, device=device)
        logw[:, 0] = 0.0
        return cls(
            token_ids=torch.full((batch, max_budget), NO_NODE, dtype=torch.long, device=device),
            depths=torch.zeros((batch, max_budget), dtype=torch.long, device=device),
            ranks=torch.full((batch, max_budget), NO_NODE, dtype=torch.long, device=device),
            parents=torch.full((batch, max_budget + 1), NO_NODE, dtype=torch.long, device=device),
            logw=logw,
            num_nodes=torch.zeros(batch, dtype=torch.long, device=device),
        )

    def record(
        self, step: int, live: torch.Tensor, token: torch.Tensor, fields: tuple[torch.Tensor, ...]
    ) -> None:
        logw, parent, depth, rank = fields
        node = step + 1
        self.token_ids[:, step] = torch.where(live, token, self.token_ids[:, step])
        self.depths[:, step] = torch.where(live, depth, self.depths[:, step])
        self.ranks[:, step] = torch.where(live, rank, self.ranks[:, step])
        self.parents[:, node] = torch.where(live, parent, self.parents[:, node])
        self.logw[:, node] = torch.where(live, logw, self.logw[:, node])
        self.num_nodes += live.to(torch.long)

    def finish(self) -> DraftTreeBatch:
        return DraftTreeBatch(
            token_ids=self.token_ids,
            depths=self.depths,
            parents=self.parents,
            log_probs=self.logw[:, 1:],
            ranks=self.ranks,
            num_nodes=self.num_nodes,
        )


def build_tree_batch(
    draft_logits: torch.Tensor, budgets: Sequence[int] | torch.Tensor, max_topk: int | None = None
) -> DraftTreeBatch:
    """Batched best-first trees in pure PyTorch (no Python heap), the reference for accelerated kernels.

    ``draft_logits [B, L, V]``; ``budgets [B]`` per-request node budgets (0 allowed). Produces, for every
    request, exactly the tree :func:`build_tree` produces (same tokens, order, parents and float64 scores).

    The frontier is a fixed array of ``1 + 2 * Bmax`` slots: pop t writes its sibling to slot ``1 + 2t`` and
    its child to slot ``2 + 2t``. Each step selects, per request, the active slot with the largest score and,
    among equal scores, the lexicographically smallest rank path.
    """
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must be [B, L, V], got shape {tuple(draft_logits.shape)}")
    batch, depth_limit, vocab = draft_logits.shape
    device = draft_logits.device
    budget_t = torch.as_tensor(budgets, dtype=torch.long, device=device).reshape(-1)
    if budget_t.shape[0] != batch:
        raise ValueError(f"need {batch} budgets, got {budget_t.shape[0]}")
    if bool((budget_t < 0).any()):
        raise ValueError("budgets must be >= 0")
    if batch == 0 or depth_limit == 0 or int(budget_t.max()) == 0:
        return _BatchNodes.empty(batch, 0, device).finish()
    log_probs, top_ids = depth_log_probs(draft_logits, _topk_size(int(budget_t.max()), vocab, max_topk))
    return _search_batch(log_probs, top_ids, budget_t)


def build_tree_batch_from_topk(
    top_log_probs: torch.Tensor, top_ids: torch.Tensor, budgets: Sequence[int] | torch.Tensor
) -> DraftTreeBatch:
    """Batched search from precomputed ``[B, L, K]`` float32 log-probs and ids (``k_b = min(budget_b, K)``)."""
    if top_log_probs.dim() != 3 or top_log_probs.shape != top_ids.shape:
        raise ValueError("top_log_probs and top_ids must both be [B, L, K]")
    if top_log_probs.dtype != torch.float32:
        raise ValueError("top_log_probs must be float32")
    budget_t = torch.as_tensor(budgets, dtype=torch.long, device=top_log_probs.device).reshape(-1)
    if budget_t.shape[0] != top_log_probs.shape[0]:
        raise ValueError(f"need {top_log_probs.shape[0]} budgets, got {budget_t.shape[0]}")
    if bool((budget_t < 0).any()):
        raise ValueError("budgets must be >= 0")
    return _search_batch(top_log_probs, top_ids, budget_t)


def _search_batch(log_probs: torch.Tensor, top_ids: torch.Tensor, budget_t: torch.Tensor) -> DraftTreeBatch:
    batch, depth_limit, k_max = log_probs.shape
    device = log_probs.device
    max_budget = int(budget_t.max()) if batch and depth_limit and k_max else 0
    nodes = _BatchNodes.empty(batch, max_budget, device)
    if max_budget == 0:
        return nodes.finish()
    k_per_request = budget_t.clamp(min=1, max=k_max)
    lp = log_probs.double()
    rows = torch.arange(batch, device=device)
    frontier = _Frontier(batch, 1 + 2 * max_budget, depth_limit, device)
    root_path = torch.full((batch, depth_limit), NO_NODE, dtype=torch.long, device=device)
    root_path[:, 0] = 0
    zeros = torch.zeros(batch, dtype=torch.long, device=device)
    frontier.write(0, budget_t > 0, logw=0.0 + lp[:, 0, 0], path=root_path, parent=zeros, depth=zeros + 1, rank=zeros)

    for step in range(max_budget):
        live = (budget_t > step) & frontier.active.any(dim=-1)
        if not bool(live.any()):
            break
        slot = frontier.best_slot()
        logw, parent = frontier.logw[rows, slot], frontier.parent[rows, slot]
        depth, rank, path = frontier.depth[rows, slot], frontier.rank[rows, slot], frontier.paths[rows, slot]
        nodes.record(step, live, top_ids[rows, depth - 1, rank], (logw, parent, depth, rank))
        frontier.active[rows, slot] &= ~live

        next_rank = rank + 1
        sibling_path = path.clone()
        sibling_path[rows, depth - 1] = next_rank
        sibling_logw = nodes.logw[rows, parent] + lp[rows, depth - 1, next_rank.clamp(max=k_max - 1)]
        push_sibling = live & (next_rank < k_per_request)
        frontier.write(
            1 + 2 * step, push_sibling, logw=sibling_logw, path=sibling_path, parent=parent, depth=depth, rank=next_rank
        )

        child_level = depth.clamp(max=depth_limit - 1)
        child_path = path.clone()
        child_path[rows, child_level] = 0
        child_logw = logw + lp[rows, child_level, 0]
        push_child = live & (depth < depth_limit)
        child_parent = zeros + step + 1
        frontier.write(
            2 + 2 * step, push_child, logw=child_logw, path=child_path, parent=child_parent, depth=depth + 1, rank=zeros
        )

    return nodes.finish()
