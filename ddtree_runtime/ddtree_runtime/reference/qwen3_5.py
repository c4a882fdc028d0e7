"""The Qwen3.5/3.6 text model (Gated DeltaNet + gated full attention) in plain PyTorch, batch 1.

Architecture, as transformers' ``Qwen3_5TextModel`` computes it (the tests compare logits with
``Qwen3_5ForConditionalGeneration``): decoder layers of two kinds by ``layer_types`` (or every
``full_attention_interval``-th layer full attention), each ``x + mixer(norm(x))`` then ``x + mlp(norm(x))``.

- ``linear_attention``: Gated DeltaNet (:mod:`ddtree_runtime.reference.gated_deltanet`).
- ``full_attention``: GQA whose ``q_proj`` also yields a per-channel output gate (``out * sigmoid(gate)``
  before ``o_proj``), RMSNorm on each query and key head, and RoPE on the first ``partial_rotary_factor`` of
  each head's dimensions.
- Every RMSNorm outside the DeltaNet is zero-centred: it scales by ``1 + weight``.

Checkpoints: the multimodal layout (``Qwen3_5ForConditionalGeneration``: settings under ``text_config``, text
weights under ``model.language_model.``, the vision tower under ``model.visual.``, which is ignored here) and the
text-only one (``Qwen3_5ForCausalLM``: weights under ``model.``). Multi-token-prediction weights (``mtp.*``) are
ignored as transformers ignores them.

Tree verification: ``attention_mask`` must be an ancestor-or-self tree mask over the new tokens (the whole
committed past visible). Attention layers use it as given; DeltaNet layers read each node's parent from it
and advance the parent's state by the node's own token. :class:`HybridCache` keeps every node's state until the
decoder commits the accepted path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddtree_runtime.model_layout import FULL_ATTENTION, LINEAR_ATTENTION, hybrid_layer_types, text_settings
from ddtree_runtime.reference.cache import HybridCache
from ddtree_runtime.reference.checkpoint import fill_random_, load_safetensors_dir, load_state_exactly, save_safetensors
from ddtree_runtime.reference.gated_deltanet import GatedDeltaNet, PathLayout, compute_dtype
from ddtree_runtime.reference.layers import GatedMLP, RotaryTable, apply_rope, attend, causal_allowed
from ddtree_runtime.reference.qwen3 import TargetOutput, rope_theta_from
from ddtree_runtime.tree import parents_from_visibility

TEXT_PREFIX = "model.language_model."
"""Where ``Qwen3_5ForConditionalGeneration`` keeps the text model's weights."""
IGNORED_PREFIXES = ("model.visual.", "mtp.")
MULTIMODAL_ARCHITECTURE = "Qwen3_5ForConditionalGeneration"


def _eos_ids(value: Any) -> list[int]:
    return [] if value is None else ([value] if isinstance(value, int) else [int(v) for v in value])


@dataclass(frozen=True)
class Qwen35TextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: list[str]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    eos_token_id: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError("layer_types must have one entry per layer")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} gives an unusable rotary width")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == FULL_ATTENTION]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == LINEAR_ATTENTION]

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> Qwen35TextConfig:
        """From a checkpoint's ``config.json`` (the ``text_config`` of a multimodal one, or a flat text config)."""
        text = text_settings(config)
        if text.get("attention_bias"):
            raise ValueError("Qwen3.5 targets with attention_bias are not supported")
        if text.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {text.get('hidden_act')!r} (only silu)")
        if text.get("attn_output_gate") is False:
            raise ValueError("Qwen3.5 targets without the attention output gate are not supported")
        heads = int(text["num_attention_heads"])
        rope = text.get("rope_parameters") or {}
        tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        return cls(
            vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text["intermediate_size"]),
            num_hidden_layers=int(text["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(text.get("num_key_value_heads", heads)),
            head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
            layer_types=hybrid_layer_types(text),
            linear_num_key_heads=int(text["linear_num_key_heads"]),
            linear_num_value_heads=int(text["linear_num_value_heads"]),
            linear_key_head_dim=int(text["linear_key_head_dim"]),
            linear_value_head_dim=int(text["linear_value_head_dim"]),
            linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta_from(text),
            partial_rotary_factor=float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))),
            max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(tied),
            eos_token_id=_eos_ids(text.get("eos_token_id", config.get("eos_token_id"))),
        )

    def text_dict(self) -> dict[str, Any]:
        """The ``text_config`` transformers writes for ``Qwen3_5TextConfig`` (``full_attention_interval`` only when
        the layer types follow one)."""
        interval = _interval_of(self.layer_types)
        return {
            "model_type": "qwen3_5_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            **({} if interval is None else {"full_attention_interval": interval}),
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "eos_token_id": self.eos_token_id[0] if len(self.eos_token_id) == 1 else self.eos_token_id or None,
        }


def _interval_of(layer_types: Sequence[str]) -> int | None:
    """The ``full_attention_interval`` that reproduces ``layer_types``, or None when none does."""
    for interval in range(1, len(layer_types) + 1):
        if hybrid_layer_types({"num_hidden_layers": len(layer_types), "full_attention_interval": interval}) == list(
            layer_types
        ):
            return interval
    return None


class OffsetRMSNorm(nn.Module):
    """Zero-centred RMSNorm: ``norm(x) * (1 + weight)`` in at least float32, then cast back."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = compute_dtype(x.dtype)
        y = x.to(compute)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.to(compute))).to(x.dtype)


class GatedAttention(nn.Module):
    """Qwen3.5's full attention: q/gate from one projection, per-head q/k norms, partial RoPE, output gate."""

    def __init__(self, config: Qwen35TextConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim * 2, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        self.q_norm = OffsetRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, config.rms_norm_eps)

    def queries_and_gate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [..., T, hidden]`` -> normed queries ``[..., T, Hq, D]`` and the gate ``[..., T, Hq * D]``."""
        both = self.q_proj(x).unflatten(-1, (self.num_heads, 2 * self.head_dim))
        query, gate = both.chunk(2, dim=-1)
        return self.q_norm(query), gate.flatten(-2)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [..., T, hidden]`` -> normed keys and values ``[..., T, Hkv, D]`` (before RoPE)."""
        keys = self.k_norm(self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)))
        return keys, self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: HybridCache,
        layer: int,
        allowed: torch.Tensor,
    ) -> torch.Tensor:
        cos, sin = cos_sin
        query, gate = self.queries_and_gate(x)
        keys, values = self.keys_values(x)
        q = apply_rope(query.transpose(0, 1), cos, sin)
        k = apply_rope(keys.transpose(0, 1), cos, sin)
        all_keys, all_values = cache.extend_kv(layer, k, values.transpose(0, 1))
        out = attend(q, all_keys, all_values, allowed, self.head_dim**-0.5)
        return self.o_proj(out * torch.sigmoid(gate))


@dataclass(frozen=True)
class NodeLayout:
    """How one forward's new tokens relate: the attention mask ``[T, past + T]``, each node's parent (-1: after
    the committed tokens) and the paths the DeltaNet layers follow."""

    allowed: torch.Tensor
    parents: torch.Tensor
    paths: PathLayout


class HybridLayer(nn.Module):
    def __init__(self, config: Qwen35TextConfig, layer: int) -> None:
        super().__init__()
        self.kind = config.layer_types[layer]
        if self.kind == LINEAR_ATTENTION:
            self.linear_attn = GatedDeltaNet(
                config.hidden_size, key_heads=config.linear_num_key_heads, value_heads=config.linear_num_value_heads,
                key_dim=config.linear_key_head_dim, value_dim=config.linear_value_head_dim,
                conv_kernel=config.linear_conv_kernel_dim, eps=config.rms_norm_eps,
            )
        else:
            self.self_attn = GatedAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: HybridCache,
        layer: int,
        nodes: NodeLayout,
    ) -> torch.Tensor:
        normed = self.input_layernorm(x)
        if self.kind == LINEAR_ATTENTION:
            conv, recurrent = cache.linear_state(layer)
            mixed, windows, states = self.linear_attn(normed, conv, recurrent, nodes.paths)
            cache.stage_linear(layer, windows, states)
        else:
            mixed = self.self_attn(normed, cos_sin, cache, layer, nodes.allowed)
        x = x + mixed
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen35Inner(nn.Module):
    def __init__(self, config: Qwen35TextConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HybridLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)


def chain_parents(count: int, device: torch.device) -> torch.Tensor:
    return torch.arange(count, device=device) - 1


class Qwen35ForCausalLM(nn.Module):
    """Batch-1 Qwen3.5/3.6 text model with a :class:`HybridCache` and tree verification.

    ``wrapper`` holds the multimodal checkpoint's settings outside ``text_config`` (architectures, the vision
    config, the vision token ids) so that a saved model keeps its original shape; empty for a text-only one.
    """

    def __init__(self, config: Qwen35TextConfig, wrapper: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.config = config
        self.wrapper = dict(wrapper or {})
        self.model = Qwen35Inner(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryTable(config.rotary_dim, config.rope_theta)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def new_cache(self) -> HybridCache:
        c = self.config
        states = {}
        for index in c.linear_layers:
            layer = self.model.layers[index]
            assert isinstance(layer, HybridLayer)
            states[index] = layer.linear_attn.new_state(self.dtype, self.device)
        return HybridCache(c.attention_layers, states, kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                           dtype=self.dtype, device=self.device)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def _node_layout(self, attention_mask: torch.Tensor | None, past: int, count: int) -> NodeLayout:
        device = self.device
        if attention_mask is None:
            allowed = causal_allowed(torch.arange(past, past + count, device=device), past + count)
            parents = chain_parents(count, device)
        elif tuple(attention_mask.shape) != (count, past + count):
            raise ValueError(f"attention_mask must be {[count, past + count]}, got {list(attention_mask.shape)}")
        elif not bool(attention_mask[:, :past].all()):
            raise ValueError("a hybrid target's verify mask must show every committed token to every node")
        else:
            allowed, parents = attention_mask, parents_from_visibility(attention_mask[:, past:])
        return NodeLayout(allowed, parents, PathLayout.of(parents, self.config.linear_conv_kernel_dim))

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: HybridCache,
        *,
        attention_mask: torch.Tensor | None = None,
        capture_layers: Sequence[int] = (),
        last_logits_only: bool = False,
    ) -> TargetOutput:
        """Run ``input_ids [T]`` at ``positions [T]`` after the cache's committed tokens.

        ``attention_mask`` is bool ``[T, cache.length + T]`` and must be a tree mask (None: a causal chain).
        ``capture_layers`` follow Hugging Face's ``hidden_states[layer + 1]`` (the last layer's entry is the
        final-normed state), as for the dense target.
        """
        past = cache.length
        count = input_ids.shape[0]
        nodes = self._node_layout(attention_mask, past, count)
        cos_sin = self.rotary.cos_sin(positions, self.dtype)
        x = self.embed(input_ids)
        captured: dict[int, torch.Tensor] = {}
        last = self.config.num_hidden_layers - 1
        for index, layer in enumerate(self.model.layers):
            x = layer(x, cos_sin, cache, index, nodes)
            if index in capture_layers and index != last:
                captured[index] = x
        x = self.model.norm(x)
        if last in capture_layers:
            captured[last] = x
        cache.advance(count, nodes.parents)
        features = torch.cat([captured[i] for i in capture_layers], dim=-1) if capture_layers else None
        logits = self.lm_head(x[-1:] if last_logits_only else x)
        return TargetOutput(logits=logits, features=features)


def text_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The text model's tensors under this module's names, from either checkpoint layout."""
    kept: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.startswith(IGNORED_PREFIXES):
            continue
        kept["model." + name.removeprefix(TEXT_PREFIX) if name.startswith(TEXT_PREFIX) else name] = tensor
    return kept


def load_qwen35(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Qwen35ForCausalLM:
    """Load a Qwen3.5/3.6 checkpoint directory (multimodal or text-only layout; the vision tower is skipped)."""
    directory = Path(path)
    raw = json.loads((directory / "config.json").read_text())
    config = Qwen35TextConfig.from_dict(raw)
    wrapper = {k: v for k, v in raw.items() if k != "text_config"} if "text_config" in raw else {}
    model = Qwen35ForCausalLM(config, wrapper)
    state = text_state(load_safetensors_dir(directory))
    tied = frozenset({"lm_head.weight"}) if config.tie_word_embeddings else frozenset()
    for name in tied:
        state.pop(name, None)
    load_state_exactly(model, state, directory, may_be_missing=tied)
    return model.to(dtype=dtype, device=device).eval()


def random_qwen35(
    config: Qwen35TextConfig, seed: int, std: float = 0.02, wrapper: Mapping[str, Any] | None = None
) -> Qwen35ForCausalLM:
    """Deterministic random weights: normal(0, std); zero-centred norms at 0 and the DeltaNet gates as
    transformers initialises them (``dt_bias`` 1, ``A = exp(A_log)`` uniform in [0.01, 16])."""
    model = Qwen35ForCausalLM(config, wrapper)
    fill_random_(model, seed, std)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, OffsetRMSNorm):
                module.weight.zero_()
            elif isinstance(module, GatedDeltaNet):
                module.dt_bias.fill_(1.0)
                uniform = torch.rand(module.A_log.shape, generator=generator) * (16 - 0.01) + 0.01
                module.A_log.copy_(uniform.log())
    return model.eval()


def multimodal_config(model: Qwen35ForCausalLM) -> dict[str, Any]:
    """``config.json``: the multimodal layout (``text_config`` nested) unless the model came text-only."""
    text = model.config.text_dict()
    if not model.wrapper:
        return {"architectures": ["Qwen3_5ForCausalLM"], **text, "model_type": "qwen3_5_text",
                "torch_dtype": "float32"}
    outer = {k: v for k, v in model.wrapper.items() if k not in ("dtype", "torch_dtype", "transformers_version")}
    outer.setdefault("architectures", [MULTIMODAL_ARCHITECTURE])
    outer.setdefault("model_type", "qwen3_5")
    return {**outer, "text_config": text, "tie_word_embeddings": model.config.tie_word_embeddings,
            "torch_dtype": "float32"}


def save_qwen35(
    model: Qwen35ForCausalLM, path: str | Path, extra_tensors: Mapping[str, torch.Tensor] | None = None
) -> None:
    """Write ``config.json`` and ``model.safetensors`` in the checkpoint's layout.

    Multimodal models store the text weights under ``model.language_model.``; ``extra_tensors`` (a vision
    tower's ``model.visual.*``) are written beside them unchanged.
    """
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(multimodal_config(model), indent=2) + "\n")
    tied = model.config.tie_word_embeddings
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        nested = model.wrapper and name.startswith("model.")
        state[TEXT_PREFIX + name.removeprefix("model.") if nested else name] = tensor
    state.update(extra_tensors or {})
    save_safetensors(state, directory / "model.safetensors")
