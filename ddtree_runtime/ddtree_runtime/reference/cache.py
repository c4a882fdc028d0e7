"""A contiguous per-layer KV cache with crop and tree compaction."""

from __future__ import annotations

import torch

from ddtree_runtime.verify import compact_kv_


class KVCache:
    """K/V per layer as ``[kv_heads, capacity, head_dim]``; slots ``[0, length)`` are live.

    A forward pass writes its new entries at ``[length, length + T)`` of every layer through :meth:`extend`
    and then advances ``length`` once with :meth:`advance`.
    """

    def __init__(
        self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> None:
        self.num_layers = num_layers
        self.keys = [torch.zeros(kv_heads, 0, head_dim, dtype=dtype, device=device) for _unused in range(num_layers)]
        self.values = [torch.zeros(kv_heads, 0, head_dim, dtype=dtype, device=device) for _unused in range(num_layers)]
        self.length = 0

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[1])

    def _reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        new_capacity = max(needed, 2 * self.capacity, 64)
        for layer in range(self.num_layers):
            for store in (self.keys, self.values):
                old = store[layer]
                grown = torch.zeros(old.shape[0], new_capacity, old.shape[2], dtype=old.dtype, device=old.device)
                grown[:, : old.shape[1]] = old
                store[layer] = grown

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k/v [kv_heads, T, D]`` after the live slots; returns views over live + new slots."""
        end = self.length + k.shape[1]
        self._reserve(end)
        self.keys[layer][:, self.length : end] = k
        self.values[layer][:, self.length : end] = v
        return self.keys[layer][:, :end], self.values[layer][:, :end]

    def advance(self, count: int) -> None:
        self.length += count

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def compact(self, start: int, accepted: list[int]) -> None:
        """Keep the accepted tree nodes: slot ``start + j`` <- ``start + accepted[j]``, then crop."""
        with torch.inference_mode():
            self._compact_layers(start, accepted)
        self.crop(start + len(accepted))

    def _compact_layers(self, start: int, accepted: list[int]) -> None:
        for layer in range(self.num_layers):
            compact_kv_(self.keys[layer], 1, start, accepted)
            compact_kv_(self.values[layer], 1, start, accepted)

    def live(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[layer][:, : self.length], self.values[layer][:, : self.length]
