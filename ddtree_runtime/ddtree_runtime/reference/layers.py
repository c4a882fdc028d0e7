"""Qwen3-style building blocks shared by the target and the DFlash drafter (pure PyTorch, batch 1).

Tensors are ``[tokens, features]`` (no batch dim); attention heads are ``[heads, tokens, head_dim]``.
Numerics follow Hugging Face's Qwen3: RMSNorm in at least float32, RoPE tables from float32 inverse
frequencies, softmax in at least float32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = torch.promote_types(x.dtype, torch.float32)
        y = x.to(compute)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class QKNormProjections(nn.Module):
    """Qwen3's attention projections: q/k/v/o without bias, RMSNorm on each query and key head."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        return x.reshape(x.shape[0], count, self.head_dim).transpose(0, 1)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(self.q_norm(self.heads(self.q_proj(x), self.num_heads)), cos, sin)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys = apply_rope(self.k_norm(self.heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        return keys, self.heads(self.v_proj(x), self.num_kv_heads)

    def output(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor | None
    ) -> torch.Tensor:
        return self.o_proj(attend(q, keys, values, allowed, self.head_dim**-0.5))


class PreNormLayer(nn.Module):
    """A decoder layer's parts around its attention: input norm, post-attention norm, gated MLP."""

    def __init__(self, attention: nn.Module, hidden_size: int, intermediate_size: int, eps: float) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = GatedMLP(hidden_size, intermediate_size)
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.post_attention_layernorm(x))


class RotaryTable:
    """Default (unscaled) RoPE: ``cos/sin [T, head_dim]`` for integer positions."""

    def __init__(self, head_dim: int, theta: float) -> None:
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.inv_freq = 1.0 / (theta**exponent)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().reshape(-1, 1).cpu() @ self.inv_freq.reshape(1, -1)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype=dtype, device=positions.device), emb.sin().to(dtype=dtype, device=positions.device)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [heads, T, D]`` rotated by per-token ``cos/sin [T, R]``: the first ``R <= D`` dimensions of each head
    (partial rotary, as in Qwen3.5/3.6), the rest passed through."""
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head, rest = x[..., :rotary], x[..., rotary:]
    return torch.cat([head * cos + rotate_half(head) * sin, rest], dim=-1)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Grouped-query attention. ``q [Hq, T, D]``, ``k/v [Hkv, S, D]``, ``allowed [T, S]`` bool or None (all).

    Returns ``[T, Hq * D]``. Disallowed scores are ``-inf`` before the softmax, so they contribute exactly 0.
    """
    groups = q.shape[0] // k.shape[0]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=0)
        v = v.repeat_interleave(groups, dim=0)
    scores = (q @ k.transpose(-1, -2)) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    compute = torch.promote_types(scores.dtype, torch.float32)
    weights = torch.softmax(scores.to(compute), dim=-1).to(q.dtype)
    out = weights @ v
    return out.transpose(0, 1).reshape(q.shape[1], -1)


def causal_allowed(query_positions: torch.Tensor, key_count: int) -> torch.Tensor:
    """``[T, S]`` causal visibility by cache index: key j visible to a query at cache index p iff j <= p."""
    keys = torch.arange(key_count, device=query_positions.device)
    return keys[None, :] <= query_positions[:, None]
