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


LinearState = tuple[torch.Tensor, torch.Tensor]
"""A Gated DeltaNet layer's state: ``(conv window [K - 1, C], recurrent state [H, d_k, d_v])``."""


class HybridCache:
    """A hybrid target's cache: K/V of the attention layers, the conv and recurrent state of the DeltaNet layers.

    Recurrent state cannot be cropped like K/V, so every forward keeps each new node's DeltaNet state until the
    next commit: a chain forward commits its last node at once (prefill, decode steps) and :meth:`crop` can step
    back along it (the DFlash chain keeps ``accepted + 1`` tokens); a tree forward commits nothing until
    :meth:`compact` keeps the accepted path (the K/V of its nodes and the state of its last node).
    """

    def __init__(
        self,
        attention_layers: list[int],
        linear_states: dict[int, LinearState],
        *,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.kv_slot = {layer: slot for slot, layer in enumerate(attention_layers)}
        self.kv = KVCache(len(attention_layers), kv_heads, head_dim, dtype, device)
        self.linear = dict(linear_states)
        self._before: dict[int, LinearState] = {}
        self._staged: dict[int, LinearState] = {}
        self._parents: list[int] = []
        self._start: int | None = None
        self._awaiting_commit = False

    @property
    def length(self) -> int:
        return self.kv.length

    def extend_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv.extend(self.kv_slot[layer], k, v)

    def live(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Committed K/V ``[kv_heads, length, D]`` of attention layer ``layer`` (a model layer index)."""
        return self.kv.live(self.kv_slot[layer])

    def linear_state(self, layer: int) -> LinearState:
        """The committed state of DeltaNet layer ``layer``: what the next forward starts from."""
        if self._awaiting_commit:
            raise RuntimeError("the last forward was a tree: compact() its accepted path before the next forward")
        return self.linear[layer]

    def stage_linear(self, layer: int, windows: torch.Tensor, states: torch.Tensor) -> None:
        """Every new node's conv window ``[T, K - 1, C]`` and recurrent state ``[T, H, d_k, d_v]``."""
        self._staged[layer] = (windows, states)

    def advance(self, count: int, parents: torch.Tensor) -> None:
        """End a forward of ``count`` nodes with these ``parents`` (``-1``: follows the committed tokens)."""
        self._start = self.kv.length
        self._before = dict(self.linear)
        self._parents = parents.tolist()
        self.kv.advance(count)
        if self._parents == list(range(-1, count - 1)):
            self._keep_node(count - 1)
        else:
            self._awaiting_commit = True

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens; beyond a no-op only back along the last forward's chain prefix."""
        if length == self.kv.length and not self._awaiting_commit:
            return
        start = self._start
        if start is None or not start <= length <= self.kv.length:
            raise ValueError(f"recurrent state can only return to tokens of the last forward, not to {length}")
        kept = length - start
        if self._parents[:kept] != list(range(-1, kept - 1)):
            raise ValueError("crop keeps a chain prefix of the last forward; use compact() for a tree path")
        self.kv.crop(length)
        self._keep_node(kept - 1)
        self._start = None

    def compact(self, start: int, accepted: list[int]) -> None:
        """Keep the accepted path of the last (tree) forward: K/V compacted, the path's last node's state."""
        if start != self._start:
            raise ValueError(f"the last forward started at {self._start}, not {start}")
        parents = [-1, *accepted[:-1]]
        if not accepted or any(self._parents[node] != parent for node, parent in zip(accepted, parents, strict=True)):
            raise ValueError(f"nodes {accepted} are not a path from a root of the last forward")
        self.kv.compact(start, accepted)
        self._keep_node(accepted[-1])
        self._start = None

    def _keep_node(self, node: int) -> None:
        for layer in self.linear:
            if node < 0:
                self.linear[layer] = self._before[layer]
            else:
                windows, states = self._staged[layer]
                self.linear[layer] = (windows[node].clone(), states[node].clone())
        self._awaiting_commit = False
