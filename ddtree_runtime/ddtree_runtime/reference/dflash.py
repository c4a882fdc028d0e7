"""The DFlash block-diffusion drafter (z-lab checkpoint format) in plain PyTorch.

Architecture (z-lab ``DFlashDraftModel``): Qwen3-style decoder layers without embeddings or LM head (the
target's are shared). The target's hidden states from ``dflash_config.target_layer_ids`` are concatenated,
fused by ``fc`` (no bias) and ``hidden_norm`` (RMSNorm), and injected into every layer's K/V: each layer
projects ``[context features, block hidden]`` with its own ``k_proj``/``v_proj`` (``k_norm`` + RoPE at the
absolute positions) while Q comes from the block only. Attention is non-causal for ``full_attention`` layers;
``sliding_attention`` layers are causal with a window (key visible iff ``q - k < sliding_window``) unless
``is_causal`` overrides it, as in z-lab's current code.

Checkpoint tensors: ``fc.weight``, ``hidden_norm.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.{input,post_attention}_layernorm.weight``,
``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``norm.weight``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddtree_runtime.model_layout import FULL_ATTENTION, SLIDING_ATTENTION, drafter_window_problem
from ddtree_runtime.reference.cache import KVCache
from ddtree_runtime.reference.checkpoint import fill_random_, load_safetensors_dir, load_state_exactly, save_safetensors
from ddtree_runtime.reference.layers import PreNormLayer, QKNormProjections, RMSNorm, RotaryTable
from ddtree_runtime.reference.qwen3 import rope_theta_from

SLIDING = SLIDING_ATTENTION
FULL = FULL_ATTENTION


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Default feature layers: spread evenly from layer 1 to ``L - 3`` (``L // 2`` for a single layer)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DFlashConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None
    is_causal: bool | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    num_target_layers: int | None = None
    """The layer count of the target it was trained for (z-lab writes it; the preflight compares it)."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError("layer_types must have one entry per layer")
        unknown = set(self.layer_types) - {SLIDING, FULL}
        if unknown:
            raise ValueError(f"unknown layer types {sorted(unknown)}")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError("sliding_attention layers need sliding_window")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> DFlashConfig:
        """A drafter's ``config.json``, read as SGLang reads it (a config SGLang refuses is refused here too)."""
        window_problem = drafter_window_problem(config)
        if window_problem is not None:
            raise ValueError(window_problem)
        dflash = config.get("dflash_config") or {}

        def draft_value(name: str, default: Any = None) -> Any:
            return dflash.get(name, config.get(name, default))

        target_layer_ids = draft_value("target_layer_ids")
        if target_layer_ids is None:
            raise ValueError("drafter config must define dflash_config.target_layer_ids")
        mask_token_id = draft_value("mask_token_id")
        if mask_token_id is None:
            raise ValueError("drafter config must define dflash_config.mask_token_id")
        heads = int(config["num_attention_heads"])
        softcap = draft_value("final_logit_softcapping")
        trained_on = draft_value("num_target_layers")
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads", heads)),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            block_size=int(draft_value("block_size", 16)),
            target_layer_ids=[int(i) for i in target_layer_ids],
            mask_token_id=int(mask_token_id),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta_from(config),
            max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
            layer_types=list(config.get("layer_types") or []),
            sliding_window=config.get("sliding_window"),
            is_causal=config.get("is_causal"),
            input_embedding_scale=float(draft_value("input_embedding_scale", 1.0)),
            output_multiplier=float(draft_value("output_multiplier", 1.0)),
            final_logit_softcapping=None if softcap is None else float(softcap),
            num_target_layers=None if trained_on is None else int(trained_on),
        )

    def to_dict(self) -> dict[str, Any]:
        """The z-lab ``config.json`` layout."""
        trained_on = {} if self.num_target_layers is None else {"num_target_layers": self.num_target_layers}
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "block_size": self.block_size,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "layer_types": self.layer_types or [FULL] * self.num_hidden_layers,
            "sliding_window": self.sliding_window,
            # transformers' qwen3 config drops the window without it (model_layout.drafter_window_problem)
            **({"use_sliding_window": True} if SLIDING in self.layer_types else {}),
            "attention_bias": False,
            "dflash_config": {"target_layer_ids": self.target_layer_ids, "mask_token_id": self.mask_token_id},
            **trained_on,
            "torch_dtype": "float32",
        }

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL


class DFlashAttention(QKNormProjections):
    def __init__(self, config: DFlashConfig, layer: int) -> None:
        super().__init__(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                         config.head_dim, config.rms_norm_eps)
        sliding = config.layer_type(layer) == SLIDING
        self.is_causal = sliding if config.is_causal is None else bool(config.is_causal)
        self.window = config.sliding_window if sliding else None

    def visibility(self, query_count: int, key_count: int, device: torch.device) -> torch.Tensor | None:
        if not self.is_causal and self.window is None:
            return None
        query = torch.arange(key_count - query_count, key_count, device=device)[:, None]
        key = torch.arange(key_count, device=device)[None, :]
        allowed = torch.ones(query_count, key_count, dtype=torch.bool, device=device)
        if self.is_causal:
            allowed &= key <= query
        if self.window is not None:
            allowed &= query - key < self.window
            if not self.is_causal:
                allowed &= key - query < self.window
        return allowed

    def forward(
        self,
        block: torch.Tensor,
        context: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        layer: int,
    ) -> torch.Tensor:
        cos, sin = cos_sin
        ctx_len = context.shape[0]
        q = self.queries(block, cos[ctx_len:], sin[ctx_len:])
        keys, values = cache.extend(layer, *self.keys_values(torch.cat([context, block], dim=0), cos, sin))
        return self.output(q, keys, values, self.visibility(block.shape[0], keys.shape[1], block.device))


class DFlashLayer(PreNormLayer):
    def __init__(self, config: DFlashConfig, layer: int) -> None:
        super().__init__(DFlashAttention(config, layer), config.hidden_size, config.intermediate_size,
                         config.rms_norm_eps)

    def forward(
        self,
        block: torch.Tensor,
        context: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        layer: int,
    ) -> torch.Tensor:
        block = block + self.self_attn(self.input_layernorm(block), context, cos_sin, cache, layer)
        return self.feed_forward(block)


class DFlashDraftModel(nn.Module):
    """The drafter. It owns no embeddings or LM head: callers pass the target's."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DFlashLayer(config, i) for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryTable(config.head_dim, config.rope_theta)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    def new_cache(self) -> KVCache:
        c = self.config
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype, self.fc.weight.device)

    @torch.inference_mode()
    def forward(
        self, target_features: torch.Tensor, noise_embedding: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Draft one block.

        ``target_features [C, n_sel * H]``: target features of the committed tokens not yet in ``cache``;
        ``noise_embedding [S, H]``: target embeddings of ``[bonus, mask, ...]``; ``positions [C + S]``
        (the cache must hold exactly positions ``0 .. positions[0] - 1``). Appends C + S entries to ``cache``
        (the caller crops the S block entries) and returns the final-normed block states ``[S, H]``.
        """
        if cache.length != int(positions[0]):
            raise ValueError(f"drafter cache holds {cache.length} positions but the call starts at {int(positions[0])}")
        context = self.hidden_norm(self.fc(target_features))
        cos_sin = self.rotary.cos_sin(positions, self.dtype)
        block = noise_embedding
        for index, layer in enumerate(self.layers):
            block = layer(block, context, cos_sin, cache, index)
        cache.advance(positions.shape[0])
        return self.norm(block)

    def compute_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        logits = lm_head(hidden) * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap is not None and cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits


def load_dflash(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> DFlashDraftModel:
    directory = Path(path)
    raw = json.loads((directory / "config.json").read_text())
    architectures = raw.get("architectures") or []
    if architectures and not any("DFlash" in a for a in architectures):
        raise ValueError(f"{directory} is not a DFlash drafter (architectures={architectures})")
    model = DFlashDraftModel(DFlashConfig.from_dict(raw))
    load_state_exactly(model, load_safetensors_dir(directory), directory)
    return model.to(dtype=dtype, device=device).eval()


def random_dflash(config: DFlashConfig, seed: int, std: float = 0.02) -> DFlashDraftModel:
    model = DFlashDraftModel(config)
    fill_random_(model, seed, std)
    return model.eval()


def save_dflash(model: DFlashDraftModel, path: str | Path) -> None:
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    save_safetensors(dict(model.state_dict()), directory / "model.safetensors")
