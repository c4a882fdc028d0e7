"""A Qwen3 causal LM in plain PyTorch that loads Hugging Face Qwen3 checkpoints (config.json + safetensors).

It exists so the reference engine controls its KV cache and tree masks directly, and so the lab server
runs with only torch/numpy/safetensors installed. The tests check its logits and hidden states against
``transformers``' ``Qwen3ForCausalLM``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddtree_runtime.reference.cache import KVCache
from ddtree_runtime.reference.checkpoint import fill_random_, load_safetensors_dir, load_state_exactly, save_safetensors
from ddtree_runtime.reference.layers import PreNormLayer, QKNormProjections, RMSNorm, RotaryTable, causal_allowed


def rope_theta_from(config: dict[str, Any]) -> float:
    """``rope_theta`` from either the flat field or Transformers 5's ``rope_parameters``."""
    params = config.get("rope_parameters") or {}
    if params.get("rope_type", "default") not in ("default", None):
        raise ValueError(f"unsupported rope_type {params.get('rope_type')!r} (only default RoPE)")
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)))


@dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    eos_token_id: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> Qwen3Config:
        if config.get("use_sliding_window"):
            raise ValueError("sliding-window Qwen3 targets are not supported by the reference engine")
        if config.get("attention_bias"):
            raise ValueError("Qwen3 targets with attention_bias are not supported")
        eos = config.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        heads = int(config["num_attention_heads"])
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads", heads)),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta_from(config),
            max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            eos_token_id=eos_ids,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that ``transformers`` reads as a Qwen3ForCausalLM."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "use_sliding_window": False,
            "eos_token_id": self.eos_token_id[0] if len(self.eos_token_id) == 1 else self.eos_token_id or None,
            "torch_dtype": "float32",
        }


@dataclass
class TargetOutput:
    logits: torch.Tensor
    """``[T, V]`` (or ``[1, V]`` when only the last position was requested)."""
    features: torch.Tensor | None
    """``[T, len(layers) * H]``: concatenated outputs of the captured decoder layers, or None."""


class Qwen3Attention(QKNormProjections):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                         config.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        layer: int,
        allowed: torch.Tensor,
    ) -> torch.Tensor:
        cos, sin = cos_sin
        q = self.queries(x, cos, sin)
        keys, values = cache.extend(layer, *self.keys_values(x, cos, sin))
        return self.output(q, keys, values, allowed)


class Qwen3Layer(PreNormLayer):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(Qwen3Attention(config), config.hidden_size, config.intermediate_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        layer: int,
        allowed: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, cache, layer, allowed)
        return self.feed_forward(x)


class Qwen3Inner(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3Layer(config) for _unused in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen3ForCausalLM(nn.Module):
    """Batch-1 Qwen3 with an explicit :class:`KVCache` and arbitrary (tree) attention masks."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.config = config
        self.model = Qwen3Inner(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryTable(config.head_dim, config.rope_theta)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def new_cache(self) -> KVCache:
        c = self.config
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype, self.device)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        *,
        attention_mask: torch.Tensor | None = None,
        capture_layers: Sequence[int] = (),
        last_logits_only: bool = False,
    ) -> TargetOutput:
        """Run ``input_ids [T]`` at ``positions [T]`` after the cache's live slots and append their K/V.

        ``attention_mask`` is bool ``[T, cache.length + T]`` (True = visible); None means causal by cache
        index. ``capture_layers`` selects decoder-layer outputs for the drafter, with Hugging Face's
        ``hidden_states[layer + 1]`` meaning (the last layer's entry is the final-normed state).
        """
        past = cache.length
        total = past + input_ids.shape[0]
        if attention_mask is None:
            query_index = torch.arange(past, total, device=input_ids.device)
            attention_mask = causal_allowed(query_index, total)
        elif tuple(attention_mask.shape) != (input_ids.shape[0], total):
            expected = (input_ids.shape[0], total)
            raise ValueError(f"attention_mask must be {list(expected)}, got {list(attention_mask.shape)}")
        cos_sin = self.rotary.cos_sin(positions, self.dtype)
        x = self.embed(input_ids)
        captured: dict[int, torch.Tensor] = {}
        last = self.config.num_hidden_layers - 1
        for index, layer in enumerate(self.model.layers):
            x = layer(x, cos_sin, cache, index, attention_mask)
            if index in capture_layers and index != last:
                captured[index] = x
        x = self.model.norm(x)
        if last in capture_layers:
            captured[last] = x
        cache.advance(input_ids.shape[0])
        features = torch.cat([captured[i] for i in capture_layers], dim=-1) if capture_layers else None
        logits = self.lm_head(x[-1:] if last_logits_only else x)
        return TargetOutput(logits=logits, features=features)


def load_qwen3(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Qwen3ForCausalLM:
    """Load a Hugging Face Qwen3 checkpoint directory (``config.json`` + ``*.safetensors``)."""
    directory = Path(path)
    config = Qwen3Config.from_dict(json.loads((directory / "config.json").read_text()))
    model = Qwen3ForCausalLM(config)
    state = load_safetensors_dir(directory)
    tied = frozenset({"lm_head.weight"}) if config.tie_word_embeddings else frozenset()
    for name in tied:
        state.pop(name, None)
    load_state_exactly(model, state, directory, may_be_missing=tied)
    return model.to(dtype=dtype, device=device).eval()


def random_qwen3(config: Qwen3Config, seed: int, std: float = 0.02) -> Qwen3ForCausalLM:
    """A Qwen3 with deterministic random weights (normal(0, std), norms at 1)."""
    model = Qwen3ForCausalLM(config)
    fill_random_(model, seed, std)
    return model.eval()


def save_qwen3(model: Qwen3ForCausalLM, path: str | Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` in Hugging Face's layout."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
    tied = model.config.tie_word_embeddings
    state = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_safetensors(state, directory / "model.safetensors")
