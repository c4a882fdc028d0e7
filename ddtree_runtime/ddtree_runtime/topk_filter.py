"""The top-K kernel's filter path (csrc/topk.cu): a PyTorch model of its steps and of its hand-over decisions.

The kernel streams each row of drafter logits once. It cuts the row into groups of ``GROUP_VECTORS`` 16-byte vectors
(64 bf16 / fp16 or 32 fp32 logits) and keeps each group's largest order-preserving key. Its threshold ``T`` is the
K-th largest group key with the low 16 bits cleared. Why every element of the row's top K is ``>= T``: K groups
have a key ``>= T``, so at least K elements are ``>= T``, so the row's K-th largest key is ``>= T``. Ties at the
K-th value are then all ``>= T`` too. The kernel lists the groups whose key is ``>= T`` (at most
``GROUP_CAPACITY``), gathers their elements ``>= T`` (at most ``CANDIDATE_CAPACITY``) and sorts them by
(value desc, token id asc). A row that overflows either buffer goes to the whole-row kernel. Rows that are not
16-byte aligned, or that have fewer than K groups or more than ``MAX_GROUPS`` (the group keys the last block of a
row holds in shared memory), never take this path.

:func:`filter_row` runs these steps on one row and says which way the kernel goes. The tests use it to check the
argument and the capacities on CPU; the GPU tests hold the kernel to :func:`ddtree_runtime.tree.ranked_topk`.
The constants mirror csrc/topk.cu, and a test reads them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "CANDIDATE_CAPACITY",
    "GROUP_CAPACITY",
    "GROUP_VECTORS",
    "MAX_GROUPS",
    "FilterOutcome",
    "filter_row",
    "group_elements",
    "order_keys",
]

GROUP_VECTORS = 8  # kGroupVectors
CANDIDATE_CAPACITY = 4096  # kFilterCapacity
GROUP_CAPACITY = 2048  # kFilterGroupCapacity
MAX_GROUPS = 8192  # kFilterMaxGroups
VECTOR_BYTES = 16

Path = Literal["filter", "whole_row", "ineligible"]


@dataclass(frozen=True)
class FilterOutcome:
    path: Path  # "filter": the filter finished the row; "whole_row": handed over; "ineligible": never tried
    threshold: int | None  # T, an order-preserving key
    groups_listed: int  # groups whose key is >= T
    candidates: int  # elements >= T
    ids: torch.Tensor | None  # the top k token ids, ranked, when path == "filter"


def group_elements(dtype: torch.dtype) -> int:
    """Logits per group for this dtype (64 for bf16 / fp16, 32 for fp32)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return GROUP_VECTORS * VECTOR_BYTES // itemsize


def order_keys(values: torch.Tensor) -> torch.Tensor:
    """common.cuh's float_to_key as int64: the float32 value's order-preserving uint32 key (-0.0 folded onto +0.0)."""
    bits = values.float().contiguous().view(torch.int32).long() & 0xFFFFFFFF
    bits = torch.where(bits == 0x80000000, torch.zeros_like(bits), bits)
    negative = (bits & 0x80000000) != 0
    return torch.where(negative, (~bits) & 0xFFFFFFFF, bits | 0x80000000)


def filter_row(row: torch.Tensor, k: int) -> FilterOutcome:
    """The filter path's steps on one row ``[V]`` of logits (bf16, fp16 or fp32), for the top ``k``."""
    vocab = row.numel()
    per_group = group_elements(row.dtype)
    groups = -(-vocab // per_group)
    if (vocab * row.element_size()) % VECTOR_BYTES != 0 or not k <= groups <= MAX_GROUPS:
        return FilterOutcome("ineligible", None, 0, 0, None)
    keys = order_keys(row)
    padded = torch.zeros(groups * per_group, dtype=torch.long)  # key 0 stands for "no element", below every key
    padded[:vocab] = keys
    group_keys = padded.view(groups, per_group).amax(dim=1)
    kth_group_key = int(torch.topk(group_keys, k).values[-1])
    threshold = kth_group_key & 0xFFFF0000
    listed = int((group_keys >= threshold).sum())
    above = keys >= threshold
    candidates = int(above.sum())
    if listed > GROUP_CAPACITY or candidates > CANDIDATE_CAPACITY:
        return FilterOutcome("whole_row", threshold, listed, candidates, None)
    ids = torch.nonzero(above).flatten()
    # (key desc, id asc): a stable sort of ascending ids by key, descending
    order = torch.sort(keys[ids], descending=True, stable=True).indices
    return FilterOutcome("filter", threshold, listed, candidates, ids[order][:k])
