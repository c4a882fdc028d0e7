"""Threshold construction of DDTree trees: a numpy model of the CUDA tree kernel's parallel path.

The best-first tree of :mod:`ddtree_runtime.tree` is the first ``min(B, #prefixes)`` prefixes of the lattice
(ranks ``< k``, depths ``<= L``) in the total order (float64 score descending, rank path ascending). When
every depth's log-prob row is nonincreasing in rank and ``<= 0``, a prefix's heap generators (its parent and
its previous sibling) precede it in that order (float64 addition rounds monotonically), so best-first popping
is sorting. Then for any score key ``beta`` that is at most the B-th largest key of *some* B prefixes, every
tree node has a key ``>= beta``, and so do its ancestors: the tree can be grown level by level, keeping only
children whose key is ``>= beta``, and read off by sorting what was kept.

The kernel, and this model step for step, does exactly that:

1. **Eligibility.** ``k = min(max(B, 1), K)``; the rows ``lp[d, :k]`` must be NaN-free, start ``<= 0`` and be
   nonincreasing. Otherwise (or when ``budget < min_budget``, by default THRESHOLD_MIN_BUDGET as in the
   kernel) the sequential pop loop runs.
2. **Growth.** For depth d, each kept depth-(d-1) node e gets the children ranks ``0 .. c_e - 1`` where
   ``c_e = #{r < k : key(score(e) + lp[d - 1][r]) >= beta}`` (a binary search: the keys fall with r).
   ``beta`` starts at 0, below every key, and is only raised when the kept set would outgrow ``capacity``:
   first to the B-th largest key of the kept set, then, if still too many, to the B-th largest key of the
   kept set plus the would-be children. If that still does not fit, the sequential loop runs instead.
3. **Selection** (:func:`select_bound`): a most-significant-digit radix select over 8-bit digits of the 64-bit
   order-preserving keys that stops as soon as a digit bin closes the count exactly.
4. **Read-off.** If more than B kept nodes have key ``>= beta``, beta is selected once more; the survivors are
   ranked by (key desc, rank path asc) and the first B become nodes 1..B in that order. A node's parent
   always ranks before it, so parents map to smaller node numbers.

:func:`build_tree_threshold` returns the same fields as :func:`~ddtree_runtime.tree.build_tree_from_topk` and
says which path produced them, so tests can check both the result and the kernel's path decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ddtree_runtime.tree import NO_NODE, build_tree_from_topk

__all__ = [
    "CAPACITY",
    "SELECT_PASSES",
    "THRESHOLD_MIN_BUDGET",
    "ThresholdTree",
    "build_tree_threshold",
    "key_scores",
    "rows_allow_threshold",
    "score_keys",
    "select_bound",
]

CAPACITY = 4096
"""Kept-node capacity of the kernel's shared memory on sm_90 (the kernel may get less on smaller GPUs)."""
THRESHOLD_MIN_BUDGET = 96
"""Budgets below this take the sequential loop in the kernel, where it measured faster (the kernel's constant)."""
SELECT_PASSES = 3
"""Radix digits a selection looks at (8 bits each); the bound is then within a 24-bit key prefix of exact."""
VIRTUAL_LIMIT = 8 * CAPACITY
"""At most this many would-be children are enumerated for a selection; more than that falls back."""

_SIGN = np.uint64(1 << 63)
_DIGIT_BITS = 8
_KEY_BITS = 64
_RANK_BITS = 10
_LEVELS_PER_WORD = 6
_PATH_WORDS = 3


@dataclass(frozen=True)
class ThresholdTree:
    """One tree: node ``i + 1``'s fields at index i (``parents`` includes the root at 0), named as
    :class:`~ddtree_runtime.tree.DraftTree`'s (``log_probs`` are the float64 prefix scores)."""

    token_ids: np.ndarray
    depths: np.ndarray
    parents: np.ndarray
    log_probs: np.ndarray
    ranks: np.ndarray
    method: str
    """``"threshold"``, ``"sequential"`` (the pop loop) or ``"empty"`` (budget or depth 0)."""
    selections: int = 0
    kept_peak: int = 0

    @property
    def num_nodes(self) -> int:
        return int(self.token_ids.shape[0])


def score_keys(scores: np.ndarray) -> np.ndarray:
    """Order-preserving uint64 keys of float64 scores (larger score, larger key; -0.0 folds onto +0.0)."""
    bits = np.ascontiguousarray(scores, dtype=np.float64).view(np.uint64).copy()
    bits[bits == _SIGN] = 0
    negative = (bits & _SIGN) != 0
    return np.where(negative, ~bits, bits | _SIGN)


def key_scores(keys: np.ndarray) -> np.ndarray:
    keys = np.asarray(keys, dtype=np.uint64)
    bits = np.where((keys & _SIGN) != 0, keys & ~_SIGN, ~keys)
    return bits.view(np.float64)


def rows_allow_threshold(lp: np.ndarray) -> bool:
    """True when every row is NaN-free, starts ``<= 0`` and never increases (NaN fails every ``<=``)."""
    starts_ok = bool(np.all(lp[:, 0] <= 0))
    return starts_ok and bool(np.all(lp[:, 1:] <= lp[:, :-1]))


def select_bound(keys: np.ndarray, rank: int) -> int | None:
    """A bound with at least ``rank`` keys ``>= bound``, at most the ``rank``-th largest key (None: too few keys).

    Radix select on 8-bit digits from the most significant, at most ``SELECT_PASSES`` passes. The digit bin that
    holds the ``rank``-th largest key is followed; the result is the smallest key in the last bin followed. That
    is the ``rank``-th largest key exactly when the bin closes the count (every key in it is among the ``rank``
    largest), and otherwise a key within that bin's 24-bit prefix of it.
    """
    if rank < 1 or keys.shape[0] < rank:
        return None
    remaining = rank
    candidates = keys
    bound = 0
    for shift in range(_KEY_BITS - _DIGIT_BITS, _KEY_BITS - _DIGIT_BITS * (SELECT_PASSES + 1), -_DIGIT_BITS):
        digits = ((candidates >> np.uint64(shift)) & np.uint64(0xFF)).astype(np.int64)
        hist = np.bincount(digits, minlength=256)
        above = 0
        chosen = 255
        while above + hist[chosen] < remaining:
            above += int(hist[chosen])
            chosen -= 1
        candidates = candidates[digits == chosen]
        bound = int(candidates.min())
        if above + int(hist[chosen]) == remaining:
            break
        remaining -= above
    return bound


def _child_counts(parent_scores: np.ndarray, row: np.ndarray, beta: int) -> np.ndarray:
    """Per parent, how many leading ranks of ``row`` give a child key ``>= beta`` (binary search over r)."""
    low = np.zeros(parent_scores.shape[0], dtype=np.int64)
    high = np.full(parent_scores.shape[0], row.shape[0], dtype=np.int64)
    while bool(np.any(low < high)):
        active = low < high
        mid = (low + high) // 2
        keys = score_keys(parent_scores + row[np.minimum(mid, row.shape[0] - 1)])
        passes = keys >= np.uint64(beta)
        low = np.where(active & passes, mid + 1, low)
        high = np.where(active & ~passes, mid, high)
    return low


def _level_bits(depth: int, rank: np.ndarray) -> np.ndarray:
    """Rank-path words holding only ``rank`` at level ``depth - 1`` (10 bits, most significant level first)."""
    level = depth - 1
    words = np.zeros((rank.shape[0], _PATH_WORDS), dtype=np.uint64)
    shift = (_LEVELS_PER_WORD - 1 - level % _LEVELS_PER_WORD) * _RANK_BITS
    words[:, level // _LEVELS_PER_WORD] = rank.astype(np.uint64) << np.uint64(shift)
    return words


class _KeptSet:
    """The kernel's shared-memory arrays: key, parent (kept index, -1 = root), depth, rank and rank path."""

    def __init__(self, capacity: int) -> None:
        self.keys = np.zeros(capacity, dtype=np.uint64)
        self.parent = np.full(capacity, -1, dtype=np.int64)
        self.depth = np.zeros(capacity, dtype=np.int64)
        self.rank = np.zeros(capacity, dtype=np.int64)
        self.path = np.zeros((capacity, _PATH_WORDS), dtype=np.uint64)
        self.size = 0

    def scores(self, index: np.ndarray) -> np.ndarray:
        return key_scores(self.keys[index])

    def live_keys(self, beta: int) -> np.ndarray:
        keys = self.keys[: self.size]
        return keys[keys >= np.uint64(beta)]

    def compact(self, beta: int) -> np.ndarray:
        """Drop nodes with key ``< beta`` in place, keeping order; returns each old index's new index (-1 = gone).

        A dropped node's descendants are dropped too (their keys are no larger), so parents stay valid.
        """
        live = self.keys[: self.size] >= np.uint64(beta)
        new_index = np.where(live, np.cumsum(live) - 1, -1)
        kept = np.flatnonzero(live)
        parent = self.parent[kept]
        self.parent[: kept.shape[0]] = np.where(parent >= 0, new_index[np.maximum(parent, 0)], -1)
        for array in (self.keys, self.depth, self.rank, self.path):
            array[: kept.shape[0]] = array[kept]
        self.size = int(kept.shape[0])
        return new_index

    def append_children(self, parents: np.ndarray, parent_scores: np.ndarray, counts: np.ndarray, row: np.ndarray,
                        depth: int) -> None:
        total = int(counts.sum())
        owner = np.repeat(np.arange(parents.shape[0]), counts)
        child_rank = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        begin, end = self.size, self.size + total
        self.keys[begin:end] = score_keys(parent_scores[owner] + row[child_rank])
        self.parent[begin:end] = parents[owner]
        self.depth[begin:end] = depth
        self.rank[begin:end] = child_rank
        parent_path = np.where((parents[owner] >= 0)[:, None], self.path[np.maximum(parents[owner], 0)], 0)
        self.path[begin:end] = parent_path | _level_bits(depth, child_rank)
        self.size = end


def _virtual_children_keys(parent_scores: np.ndarray, counts: np.ndarray, row: np.ndarray) -> np.ndarray:
    owner = np.repeat(np.arange(parent_scores.shape[0]), counts)
    child_rank = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return score_keys(parent_scores[owner] + row[child_rank])


@dataclass
class _Growth:
    beta: int = 0
    selections: int = 0
    overflow: bool = False


def _raise_bound(growth: _Growth, kept: _KeptSet, candidates: np.ndarray, budget: int) -> None:
    """Select a new bound from ``candidates`` and compact the kept set to it."""
    bound = select_bound(candidates, budget)
    growth.selections += 1
    if bound is not None and bound > growth.beta:
        growth.beta = bound
        kept.compact(bound)


def _grow(kept: _KeptSet, lp: np.ndarray, budget: int, capacity: int) -> _Growth:
    growth = _Growth()
    parents = np.array([-1], dtype=np.int64)
    parent_scores = np.zeros(1, dtype=np.float64)
    for depth in range(1, lp.shape[0] + 1):
        row = lp[depth - 1]
        counts = _child_counts(parent_scores, row, growth.beta)
        for use_children in (False, True):
            if kept.size + int(counts.sum()) <= capacity:
                break
            if use_children and int(counts.sum()) > VIRTUAL_LIMIT:
                break
            pool = kept.live_keys(growth.beta)
            if use_children:
                pool = np.concatenate([pool, _virtual_children_keys(parent_scores, counts, row)])
            _raise_bound(growth, kept, pool, budget)
            if depth > 1:  # the previous level's survivors are the tail of the compacted set
                parents = np.flatnonzero(kept.depth[: kept.size] == depth - 1)
                parent_scores = kept.scores(parents)
            counts = _child_counts(parent_scores, row, growth.beta)
        if kept.size + int(counts.sum()) > capacity:
            growth.overflow = True
            return growth
        if int(counts.sum()) == 0:
            break
        begin = kept.size
        kept.append_children(parents, parent_scores, counts, row, depth)
        parents = np.arange(begin, kept.size, dtype=np.int64)
        parent_scores = kept.scores(parents)
    return growth


def _empty_tree(method: str) -> ThresholdTree:
    empty = np.zeros(0, dtype=np.int64)
    return ThresholdTree(empty, empty, np.full(1, NO_NODE, dtype=np.int64), np.zeros(0), empty, method)


def _sequential(lp: np.ndarray, ids: np.ndarray, budget: int) -> ThresholdTree:
    tree = build_tree_from_topk(torch.from_numpy(lp), torch.from_numpy(ids), budget)
    return ThresholdTree(tree.token_ids.numpy(), tree.depths.numpy(), tree.parents.numpy(), tree.log_probs.numpy(),
                         tree.ranks.numpy(), "sequential")


def _read_off(kept: _KeptSet, growth: _Growth, ids: np.ndarray, budget: int) -> ThresholdTree:
    if kept.live_keys(growth.beta).shape[0] > budget:
        _raise_bound(growth, kept, kept.live_keys(growth.beta), budget)
    live = np.flatnonzero(kept.keys[: kept.size] >= np.uint64(growth.beta))
    # Rank path ascending is (word 0, word 1, word 2, depth) ascending: levels past the depth hold rank 0.
    order = np.lexsort((kept.depth[live], kept.path[live, 2], kept.path[live, 1], kept.path[live, 0],
                        ~kept.keys[live]))
    chosen = live[order[:budget]]
    node_of = np.full(kept.size, -1, dtype=np.int64)
    node_of[chosen] = np.arange(1, chosen.shape[0] + 1)
    parent_elements = kept.parent[chosen]
    parents = np.where(parent_elements >= 0, node_of[np.maximum(parent_elements, 0)], 0)
    depths = kept.depth[chosen]
    ranks = kept.rank[chosen]
    return ThresholdTree(
        token_ids=ids[depths - 1, ranks].astype(np.int64),
        depths=depths,
        parents=np.concatenate([[NO_NODE], parents]).astype(np.int64),
        log_probs=key_scores(kept.keys[chosen]),
        ranks=ranks,
        method="threshold",
        selections=growth.selections,
        kept_peak=kept.size,
    )


def build_tree_threshold(
    top_log_probs: np.ndarray | torch.Tensor,
    top_ids: np.ndarray | torch.Tensor,
    budget: int,
    capacity: int = CAPACITY,
    min_budget: int = THRESHOLD_MIN_BUDGET,
) -> ThresholdTree:
    """The kernel's tree for one request from ``[L, K]`` float32 log-probs and ids, with its path decision.

    ``capacity`` and ``min_budget`` are the kernel's choices; tests lower ``min_budget`` to run the threshold
    algorithm on small budgets too.
    """
    lp = np.asarray(top_log_probs, dtype=np.float32)
    ids = np.asarray(top_ids, dtype=np.int64)
    if lp.ndim != 2 or lp.shape != ids.shape:
        raise ValueError("top_log_probs and top_ids must both be [L, K]")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    depth_limit, width = lp.shape
    if budget == 0 or depth_limit == 0 or width == 0:
        return _empty_tree("empty")
    k = min(budget, width)
    if budget < min_budget or not rows_allow_threshold(lp[:, :k]):
        return _sequential(lp, ids, budget)
    kept = _KeptSet(capacity)
    growth = _grow(kept, lp[:, :k].astype(np.float64), budget, capacity)
    if growth.overflow:
        return _sequential(lp, ids, budget)
    return _read_off(kept, growth, ids, budget)
