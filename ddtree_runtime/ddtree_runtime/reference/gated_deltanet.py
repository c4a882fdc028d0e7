"""Gated DeltaNet (the linear-attention layer of Qwen3.5/3.6) in plain PyTorch, over a chain or a draft tree.

Per value head, with the state ``S`` a ``[d_k, d_v]`` matrix, one token does (the gated delta rule)::

    S <- exp(g) * S                      g = -exp(A_log) * softplus(a + dt_bias) <= 0   (decay)
    S <- S + k (beta * (v - S^T k))^T    beta = sigmoid(b)                               (delta update)
    o  = S^T q

with ``q`` and ``k`` L2-normalised and ``q`` scaled by ``d_k ** -0.5``. Before that, ``[q, k, v]`` pass a short
causal depthwise convolution (kernel ``K``, SiLU), whose state is the previous ``K - 1`` inputs. The output is
RMS-normalised per head, gated by ``silu(z)`` and projected back.

A draft tree runs through the same recurrence: each node starts from its parent's state (the committed state
for the root) and advances it by its own token, so siblings never see each other; the convolution window of a
node is the last ``K - 1`` inputs along its own path. Every node's state is returned so that a commit can keep
exactly the accepted path's. A chain is the tree whose parents are ``i - 1``.

:func:`gated_delta_chunked` computes the chain recurrence in chunks for batched training: within a chunk of
cumulative log decays ``G``, the updates ``delta_s = beta_s (v_s - (a_s S_{s-1})^T k_s)`` solve the unit
lower-triangular system ``delta_s + beta_s sum_{r<s} exp(G_s - G_r) (k_s . k_r) delta_r = beta_s (v_s - exp(G_s)
S_0^T k_s)``, from which outputs and the chunk's final state follow in matrix products.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

L2_EPS = 1e-6


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The recurrence runs in at least float32 (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def node_depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node of a forest whose parents precede their children (a node with parent -1 is 0)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths


@dataclass(frozen=True)
class DeltaInputs:
    """Per-token inputs of the gated delta rule, head-major or token-major as each function states.

    ``q/k``: L2-normalised keys and queries (q scaled by ``d_k ** -0.5``), ``v``: values, ``log_decay``: ``g <= 0``,
    ``beta``: the update strength in (0, 1).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    log_decay: torch.Tensor
    beta: torch.Tensor


Nodes = torch.Tensor | slice
"""Node indices: a tensor, or a slice where they are consecutive (a chain), which indexes without a copy."""


@dataclass(frozen=True)
class PathLayout:
    """Where each node's path runs, computed once per forward for every DeltaNet layer.

    ``levels[d]`` are the nodes at depth d (independent of each other given their parents) and
    ``level_parents[d]`` their parents (None at depth 0: the committed state). ``window_index [T, K]`` indexes
    ``cat(previous K - 1 inputs, node inputs)``, oldest first: node i's convolution window along its own path.
    """

    levels: list[Nodes]
    level_parents: list[Nodes | None]
    window_index: torch.Tensor

    @classmethod
    def of(cls, parents: torch.Tensor, taps: int) -> PathLayout:
        parent_list = [int(p) for p in parents.tolist()]
        count = len(parent_list)
        if parent_list == list(range(-1, count - 1)):
            levels: list[Nodes] = [slice(i, i + 1) for i in range(count)]
            level_parents: list[Nodes | None] = [None] + [slice(i, i + 1) for i in range(count - 1)]
        else:
            depths = torch.tensor(node_depths(parent_list), dtype=torch.long)
            levels = [torch.nonzero(depths == d).flatten().to(parents.device) for d in range(int(depths.max()) + 1)]
            level_parents = [None] + [parents[nodes] for nodes in levels[1:]]
        return cls(levels, level_parents, _window_index(parents, parent_list, taps))


def _window_index(parents: torch.Tensor, parent_list: list[int], taps: int) -> torch.Tensor:
    """Newest-first ancestors of each node (itself first), continuing into the previous inputs past its root;
    returned oldest first."""
    history = taps - 1
    depth = torch.tensor(node_depths(parent_list), dtype=torch.long, device=parents.device)
    node = torch.arange(len(parent_list), device=parents.device)
    index = torch.empty(len(parent_list), taps, dtype=torch.long, device=parents.device)
    for back in range(taps):
        on_path = back <= depth
        index[:, back] = torch.where(on_path, history + node, history - (back - depth))
        node = torch.where(on_path & (node >= 0), parents[node.clamp(min=0)], node)
    return index.flip(-1)


def tree_causal_conv(
    x: torch.Tensor, weight: torch.Tensor, history: torch.Tensor, layout: PathLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution along each node's path.

    ``x [T, C]`` node inputs, ``weight [C, K]`` (oldest tap first, as ``nn.Conv1d`` stores it), ``history
    [K - 1, C]`` the inputs before the roots (oldest first). Returns the pre-activation outputs ``[T, C]`` and
    every node's window after it ``[T, K - 1, C]`` (oldest first): the convolution state to keep if the node is
    the last one committed.
    """
    windows = torch.cat([history.to(x.dtype), x], dim=0)[layout.window_index]  # [T, K, C]
    out = (windows * weight.t().to(x.dtype)[None]).sum(dim=1)
    return out, windows[:, 1:]


def gated_delta_tree(
    inputs: DeltaInputs, initial_state: torch.Tensor, layout: PathLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a forest of nodes, one vectorised step per depth.

    Token-major ``inputs``: ``q/k [T, H, d_k]``, ``v [T, H, d_v]``, ``log_decay/beta [T, H]``; ``initial_state
    [H, d_k, d_v]`` is the state before every root. Returns outputs ``[T, H, d_v]`` and every node's state
    ``[T, H, d_k, d_v]``.
    """
    q, k, v = inputs.q, inputs.k, inputs.v
    states = initial_state.new_empty(q.shape[0], *initial_state.shape)
    out = v.new_empty(v.shape)
    for nodes, parents in zip(layout.levels, layout.level_parents, strict=True):
        previous = initial_state[None] if parents is None else states[parents]
        state = previous * inputs.log_decay[nodes].exp()[:, :, None, None]
        keys = k[nodes][:, :, None, :]
        remembered = (keys @ state)[:, :, 0]
        delta = inputs.beta[nodes][:, :, None] * (v[nodes] - remembered)
        state = state + keys.transpose(-1, -2) * delta[:, :, None, :]
        states[nodes] = state
        out[nodes] = (q[nodes][:, :, None, :] @ state)[:, :, 0]
    return out, states


def gated_delta_chunked(
    inputs: DeltaInputs, initial_state: torch.Tensor, chunk_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule along a chain, in chunks (differentiable, batched over leading dims).

    Head-major ``inputs``: ``q/k [..., T, d_k]``, ``v [..., T, d_v]``, ``log_decay/beta [..., T]``;
    ``initial_state [..., d_k, d_v]``. Returns outputs ``[..., T, d_v]`` and the final state ``[..., d_k, d_v]``.
    """
    state = initial_state
    outputs = []
    for begin in range(0, inputs.q.shape[-2], chunk_size):
        chunk = slice(begin, begin + chunk_size)
        out, state = _delta_chunk(
            DeltaInputs(inputs.q[..., chunk, :], inputs.k[..., chunk, :], inputs.v[..., chunk, :],
                        inputs.log_decay[..., chunk], inputs.beta[..., chunk]),
            state,
        )
        outputs.append(out)
    return torch.cat(outputs, dim=-2) if outputs else inputs.v, state


def _delta_chunk(inputs: DeltaInputs, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v, beta = inputs.q, inputs.k, inputs.v, inputs.beta
    size = q.shape[-2]
    cumulative = inputs.log_decay.cumsum(dim=-1)
    later_or_same = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    gap = (cumulative[..., :, None] - cumulative[..., None, :]).masked_fill(~later_or_same, float("-inf"))
    pair_decay = gap.exp()  # exp(G_t - G_s) for s <= t, else 0
    from_start = cumulative.exp()[..., None]
    system = (beta[..., :, None] * pair_decay * (k @ k.transpose(-1, -2))).tril(-1)
    system = system + torch.eye(size, dtype=q.dtype, device=q.device)
    rhs = beta[..., None] * (v - from_start * (k @ state))
    deltas = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    out = from_start * (q @ state) + (pair_decay * (q @ k.transpose(-1, -2))) @ deltas
    to_end = (cumulative[..., -1:] - cumulative).exp()[..., None]
    final = cumulative[..., -1].exp()[..., None, None] * state + (k * to_end).transpose(-1, -2) @ deltas
    return out, final


class GatedRMSNorm(nn.Module):
    """RMSNorm over each value head, then ``* silu(gate)`` (transformers' ``Qwen3_5RMSNormGated``)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        compute = compute_dtype(x.dtype)
        y = x.to(compute)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight * y.to(x.dtype)
        return (y * F.silu(gate.to(compute))).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """One Gated DeltaNet token mixer with transformers' parameter names (``linear_attn.*``).

    The helpers work on any leading dims (``[T, ...]`` in the reference engine, ``[B, T, ...]`` in training).
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        key_heads: int,
        value_heads: int,
        key_dim: int,
        value_dim: int,
        conv_kernel: int,
        eps: float,
    ) -> None:
        super().__init__()
        if value_heads % key_heads:
            raise ValueError(f"linear_num_value_heads {value_heads} must be a multiple of linear_num_key_heads")
        self.key_heads, self.value_heads = key_heads, value_heads
        self.key_dim, self.value_dim = key_dim, value_dim
        self.conv_kernel = conv_kernel
        self.conv_channels = 2 * key_heads * key_dim + value_heads * value_dim
        self.in_proj_qkv = nn.Linear(hidden_size, self.conv_channels, bias=False)
        self.in_proj_z = nn.Linear(hidden_size, value_heads * value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden_size, value_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden_size, value_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_channels, self.conv_channels, conv_kernel, groups=self.conv_channels,
                                bias=False, padding=conv_kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(value_heads))
        self.A_log = nn.Parameter(torch.zeros(value_heads))
        self.norm = GatedRMSNorm(value_dim, eps)
        self.out_proj = nn.Linear(value_heads * value_dim, hidden_size, bias=False)

    @property
    def conv_weight(self) -> torch.Tensor:
        """``[C, K]``, oldest tap first."""
        return self.conv1d.weight[:, 0, :]

    def delta_inputs(self, mixed: torch.Tensor, x: torch.Tensor) -> DeltaInputs:
        """Token-major :class:`DeltaInputs` (``[..., Hv, d]``, key heads shared by consecutive value heads, in the
        recurrence's dtype) from the convolved ``mixed [..., C]`` and the (normed) layer input ``x``."""
        q, k, v = self._split_heads(mixed)
        log_decay, beta = self._gates(x)
        return DeltaInputs(q, k, v, log_decay, beta)

    def _split_heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = self.key_heads * self.key_dim
        q, k, v = torch.split(mixed.to(compute_dtype(mixed.dtype)), [width, width, self.value_heads * self.value_dim],
                              dim=-1)
        share = self.value_heads // self.key_heads
        q = l2_normalize(q.unflatten(-1, (self.key_heads, self.key_dim))).repeat_interleave(share, dim=-2)
        k = l2_normalize(k.unflatten(-1, (self.key_heads, self.key_dim))).repeat_interleave(share, dim=-2)
        return q * self.key_dim**-0.5, k, v.unflatten(-1, (self.value_heads, self.value_dim))

    def _gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        compute = compute_dtype(x.dtype)
        beta = torch.sigmoid(self.in_proj_b(x)).to(compute)
        log_decay = -self.A_log.to(compute).exp() * F.softplus(self.in_proj_a(x).to(compute) + self.dt_bias)
        return log_decay, beta

    def output(self, core: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Gated norm of the recurrence output ``[..., Hv, d_v]`` with ``z`` from ``x``, then ``out_proj``."""
        gate = self.in_proj_z(x).unflatten(-1, (self.value_heads, self.value_dim))
        return self.out_proj(self.norm(core.to(x.dtype), gate).flatten(-2))

    def new_state(self, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero ``(conv window [K - 1, C], recurrent state [Hv, d_k, d_v])`` of an empty sequence."""
        conv = torch.zeros(self.conv_kernel - 1, self.conv_channels, dtype=dtype, device=device)
        recurrent = torch.zeros(self.value_heads, self.key_dim, self.value_dim, dtype=compute_dtype(dtype),
                                device=device)
        return conv, recurrent

    def forward(
        self, x: torch.Tensor, conv_state: torch.Tensor, recurrent_state: torch.Tensor, layout: PathLayout
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Nodes ``x [T, hidden]`` after the committed ``(conv_state, recurrent_state)`` along their paths.

        Returns the layer output ``[T, hidden]`` and every node's conv window ``[T, K - 1, C]`` and recurrent
        state ``[T, Hv, d_k, d_v]``.
        """
        convolved, windows = tree_causal_conv(self.in_proj_qkv(x), self.conv_weight, conv_state, layout)
        core, states = gated_delta_tree(self.delta_inputs(F.silu(convolved), x), recurrent_state, layout)
        return self.output(core, x), windows, states
