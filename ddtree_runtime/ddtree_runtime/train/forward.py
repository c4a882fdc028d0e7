"""Batched, differentiable forwards over the reference modules' own parameters.

The reference targets (:class:`Qwen3ForCausalLM`, the hybrid :class:`Qwen35ForCausalLM`) and
:class:`DFlashDraftModel` run batch 1 under ``torch.inference_mode``; training needs batches and gradients. These
functions reuse the same submodules (so a trained model saves with the reference ``save_*`` functions and loads
unchanged), use ``scaled_dot_product_attention`` and, for the hybrid's Gated DeltaNet layers, the chunked delta
rule. The tests check them against the reference forwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from ddtree_runtime.model_layout import LINEAR_ATTENTION
from ddtree_runtime.reference.dflash import DFlashDraftModel
from ddtree_runtime.reference.gated_deltanet import DeltaInputs, GatedDeltaNet, gated_delta_chunked
from ddtree_runtime.reference.layers import apply_rope
from ddtree_runtime.reference.qwen3 import Qwen3Attention
from ddtree_runtime.reference.qwen3_5 import GatedAttention, HybridLayer
from ddtree_runtime.reference.target import TargetModel

TRAIN_CHUNK = 32
"""Chunk length of the training delta rule: on CPU, 32 runs a 256-token window about twice as fast as 64."""


class RopeTable:
    """cos/sin rows for positions ``0 .. size - 1`` on one device (looked up by integer position)."""

    def __init__(self, inv_freq: torch.Tensor, size: int, device: torch.device | str) -> None:
        freqs = torch.arange(size, dtype=torch.float32)[:, None] * inv_freq[None, :].float()
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(device)
        self.sin = emb.sin().to(device)

    def rows(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


@dataclass(frozen=True)
class PairRopes:
    """RoPE tables of a target and its drafter: they differ when the target rotates only part of each head
    (Qwen3.5/3.6) or uses another base."""

    target: RopeTable
    drafter: RopeTable

    @classmethod
    def of(cls, target: TargetModel, drafter: DFlashDraftModel, size: int, device: torch.device | str) -> PairRopes:
        return cls(RopeTable(target.rotary.inv_freq, size, device), RopeTable(drafter.rotary.inv_freq, size, device))


def _split_heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """``[B, T, heads * D]`` -> ``[B, heads, T, D]``."""
    return x.unflatten(-1, (heads, head_dim)).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2).flatten(2)


@dataclass
class BatchKV:
    """Per-layer K/V ``[B, Hkv, capacity, D]`` for batched greedy generation; ``length`` slots are live.

    For a hybrid target, ``linear`` holds each Gated DeltaNet layer's ``(conv window [B, K - 1, C], recurrent
    state [B, H, d_k, d_v])`` after the live tokens (absent before the first forward).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int = 0
    linear: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @classmethod
    def empty(cls, model: TargetModel, batch: int, capacity: int, dtype: torch.dtype) -> BatchKV:
        c = model.config
        shape = (batch, c.num_key_value_heads, capacity, c.head_dim)
        device = model.device
        return cls(
            [torch.zeros(shape, dtype=dtype, device=device) for _unused in range(c.num_hidden_layers)],
            [torch.zeros(shape, dtype=dtype, device=device) for _unused in range(c.num_hidden_layers)],
        )


def _target_attention(
    attn: Qwen3Attention,
    x: torch.Tensor,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    cache: BatchKV | None,
    layer: int,
) -> torch.Tensor:
    cos, sin = cos_sin
    q = apply_rope(attn.q_norm(_split_heads(attn.q_proj(x), attn.num_heads, attn.head_dim)), cos, sin)
    k = apply_rope(attn.k_norm(_split_heads(attn.k_proj(x), attn.num_kv_heads, attn.head_dim)), cos, sin)
    v = _split_heads(attn.v_proj(x), attn.num_kv_heads, attn.head_dim)
    q, k = q.to(v.dtype), k.to(v.dtype)  # under autocast the norms return float32, the projections bf16
    return attn.o_proj(_merge_heads(_cached_attention(q, k, v, cache, layer)))


def _gated_attention(
    attn: GatedAttention,
    x: torch.Tensor,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    cache: BatchKV | None,
    layer: int,
) -> torch.Tensor:
    cos, sin = cos_sin
    query, gate = attn.queries_and_gate(x)
    keys, values = attn.keys_values(x)
    v = values.transpose(1, 2)
    q = apply_rope(query.transpose(1, 2), cos, sin).to(v.dtype)
    k = apply_rope(keys.transpose(1, 2), cos, sin).to(v.dtype)
    out = _merge_heads(_cached_attention(q, k, v, cache, layer))
    return attn.o_proj(out * torch.sigmoid(gate).to(out.dtype))


def _linear_attention(gdn: GatedDeltaNet, x: torch.Tensor, cache: BatchKV | None, layer: int) -> torch.Tensor:
    """Gated DeltaNet on ``x [B, T, hidden]``: causal conv and chunked delta rule, continuing ``cache``'s state."""
    batch = x.shape[0]
    qkv = gdn.in_proj_qkv(x)
    conv_state, recurrent = cache.linear[layer] if cache is not None and layer in cache.linear else (None, None)
    if conv_state is None:
        conv_state = qkv.new_zeros(batch, gdn.conv_kernel - 1, gdn.conv_channels)
    padded = torch.cat([conv_state.to(qkv.dtype), qkv], dim=1).transpose(1, 2)
    convolved = F.conv1d(padded, gdn.conv1d.weight.to(qkv.dtype), groups=gdn.conv_channels).transpose(1, 2)
    inputs = gdn.delta_inputs(F.silu(convolved), x)
    if recurrent is None:
        recurrent = inputs.v.new_zeros(batch, gdn.value_heads, gdn.key_dim, gdn.value_dim)
    heads_first = DeltaInputs(*(t.transpose(1, 2).contiguous() for t in (
        inputs.q, inputs.k, inputs.v, inputs.log_decay, inputs.beta)))
    core, final = gated_delta_chunked(heads_first, recurrent, chunk_size=TRAIN_CHUNK)
    if cache is not None:
        cache.linear[layer] = (padded[:, :, padded.shape[2] - conv_state.shape[1] :].transpose(1, 2), final)
    return gdn.output(core.transpose(1, 2), x)


def _cached_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: BatchKV | None, layer: int
) -> torch.Tensor:
    """Causal attention of ``q/k/v [B, H, T, D]``; with ``cache`` a prefill writes it, later calls append."""
    if cache is None or cache.length == 0:
        if cache is not None:
            cache.keys[layer][:, :, : k.shape[2]] = k
            cache.values[layer][:, :, : k.shape[2]] = v
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        if q.shape[2] != 1:
            raise ValueError("after the prefill, cached generation takes one token per step")
        end = cache.length + 1
        cache.keys[layer][:, :, cache.length : end] = k
        cache.values[layer][:, :, cache.length : end] = v
        keys, values = cache.keys[layer][:, :, :end], cache.values[layer][:, :, :end]
        out = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
    return out


def _mix(layer: torch.nn.Module, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor],
         cache: BatchKV | None, index: int) -> torch.Tensor:
    """One decoder layer's token mixer on its normed input, whichever kind it is."""
    if isinstance(layer, HybridLayer):
        if layer.kind == LINEAR_ATTENTION:
            return _linear_attention(layer.linear_attn, x, cache, index)
        return _gated_attention(layer.self_attn, x, cos_sin, cache, index)
    return _target_attention(layer.self_attn, x, cos_sin, cache, index)


def target_forward(
    model: TargetModel,
    input_ids: torch.Tensor,
    rope: RopeTable,
    *,
    capture_layers: Sequence[int] = (),
    cache: BatchKV | None = None,
    with_logits: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Causal forward of ``input_ids [B, T]`` -> (logits ``[B, T, V]``, features ``[B, T, n * H]``).

    Features follow the reference: decoder-layer outputs, the last layer's entry final-normed. With
    ``cache``, the call appends to it (prefill when empty, then one token per call).
    """
    start = 0 if cache is None else cache.length
    positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    x = model.model.embed_tokens(input_ids)
    cos_sin = rope.rows(positions, x.dtype)
    last = model.config.num_hidden_layers - 1
    captured: dict[int, torch.Tensor] = {}
    for index, layer in enumerate(model.model.layers):
        x = x + _mix(layer, layer.input_layernorm(x), cos_sin, cache, index)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if index in capture_layers and index != last:
            captured[index] = x
    x = model.model.norm(x)
    if last in capture_layers:
        captured[last] = x
    if cache is not None:
        cache.length += input_ids.shape[1]
    features = torch.cat([captured[i] for i in capture_layers], dim=-1) if capture_layers else None
    return (model.lm_head(x) if with_logits else None), features


@torch.no_grad()
def greedy_continue(
    model: TargetModel, prompts: torch.Tensor, new_tokens: int, rope: RopeTable, dtype: torch.dtype
) -> torch.Tensor:
    """Greedy continuations ``[B, P + new_tokens]`` of equal-length prompts ``[B, P]`` (KV cached)."""
    cache = BatchKV.empty(model, prompts.shape[0], prompts.shape[1] + new_tokens, dtype)
    logits, _unused = target_forward(model, prompts, rope, cache=cache)
    assert logits is not None
    pieces = [prompts]
    token = logits[:, -1].argmax(-1, keepdim=True)
    for step in range(new_tokens):
        pieces.append(token)
        if step + 1 < new_tokens:
            logits, _unused = target_forward(model, token, rope, cache=cache)
            assert logits is not None
            token = logits[:, -1].argmax(-1, keepdim=True)
    return torch.cat(pieces, dim=1)


def block_visibility(anchors: torch.Tensor, context_length: int, block_size: int, *, causal: bool = False,
                     window: int | None = None) -> torch.Tensor:
    """Bool ``[B, 1, A * S, T + A * S]``: block j sees context positions ``< anchors[j]`` and its own S slots.

    ``causal`` and ``window`` are one drafter layer's rules (``DFlashAttention.visibility`` at inference, where a
    key's index is its position): a causal layer's slot sees only its block's earlier slots, and a windowed one only
    keys less than ``window`` positions away."""
    batch, count = anchors.shape
    device = anchors.device
    query = torch.arange(count * block_size, device=device)
    block_of_query, slot = query // block_size, query % block_size
    context = torch.arange(context_length, device=device)
    query_position = anchors[:, block_of_query] + slot  # [B, A * S]
    sees_context = context[None, None, :] < anchors[:, block_of_query, None]
    sees_block = block_of_query[:, None] == block_of_query[None, :]
    if causal:
        sees_block &= slot[None, :] <= slot[:, None]
    if window is not None:
        sees_context &= query_position[:, :, None] - context[None, None, :] < window
        distance = slot[:, None] - slot[None, :]
        sees_block &= (distance < window) & (causal | (-distance < window))
    sees_block = sees_block[None].expand(batch, -1, -1)
    return torch.cat([sees_context, sees_block], dim=-1)[:, None]


def drafter_block_logits(
    drafter: DFlashDraftModel,
    target: TargetModel,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    anchors: torch.Tensor,
    *,
    rope: RopeTable,
) -> torch.Tensor:
    """DFlash training forward: one block per anchor, all blocks of a sequence in one pass (``rope``: the
    drafter's table).

    ``features [B, T, n * H]`` are the target features of ``input_ids [B, T]``; ``anchors [B, A]`` are block
    start positions (the anchor token is the block's clean slot 0, the other slots hold the mask token).
    Block j attends to the fused context features of positions ``< anchors[j]`` and bidirectionally to its
    own slots, exactly what the drafter sees at inference. Returns logits ``[B, A, S - 1, V]`` for slots
    1 .. S-1 (slot k predicts the token at ``anchor + k``).
    """
    config = drafter.config
    size = config.block_size
    batch, count = anchors.shape
    block_ids = torch.full((batch, count, size), config.mask_token_id, dtype=torch.long, device=input_ids.device)
    block_ids[:, :, 0] = input_ids.gather(1, anchors)
    block = target.model.embed_tokens(block_ids.flatten(1)) * config.input_embedding_scale
    context = drafter.hidden_norm(drafter.fc(features))
    block_positions = (anchors[:, :, None] + torch.arange(size, device=anchors.device)).flatten(1)
    context_positions = torch.arange(features.shape[1], device=features.device)
    q_cos, q_sin = rope.rows(block_positions, block.dtype)
    q_rope = (q_cos[:, None], q_sin[:, None])
    c_cos, c_sin = rope.rows(context_positions, block.dtype)
    k_cos = torch.cat([c_cos.expand(batch, -1, -1), q_cos], dim=1)[:, None]
    k_sin = torch.cat([c_sin.expand(batch, -1, -1), q_sin], dim=1)[:, None]
    for layer in drafter.layers:
        attn = layer.self_attn
        # each layer's own rules: a sliding-window layer is causal and windowed (trained as full attention, the
        # first sliding drafter accepted far less when decoding than its teacher-forced figure said)
        allowed = block_visibility(anchors, features.shape[1], size, causal=attn.is_causal, window=attn.window)
        normed = layer.input_layernorm(block)
        q = apply_rope(attn.q_norm(_split_heads(attn.q_proj(normed), attn.num_heads, attn.head_dim)), *q_rope)
        both = torch.cat([context, normed], dim=1)
        k = apply_rope(attn.k_norm(_split_heads(attn.k_proj(both), attn.num_kv_heads, attn.head_dim)), k_cos, k_sin)
        v = _split_heads(attn.v_proj(both), attn.num_kv_heads, attn.head_dim)
        q, k = q.to(v.dtype), k.to(v.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
        block = block + attn.o_proj(_merge_heads(out))
        block = block + layer.mlp(layer.post_attention_layernorm(block))
    hidden = drafter.norm(block).unflatten(1, (count, size))[:, :, 1:]
    return drafter.compute_logits(hidden, target.lm_head)
