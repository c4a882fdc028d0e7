"""Either target architecture behind one name: loading a checkpoint by what its ``config.json`` says, random
weights and saving by the config or model type."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ddtree_runtime.model_layout import is_hybrid_target
from ddtree_runtime.reference.qwen3 import Qwen3Config, Qwen3ForCausalLM, load_qwen3, random_qwen3, save_qwen3
from ddtree_runtime.reference.qwen3_5 import (
    Qwen35ForCausalLM,
    Qwen35TextConfig,
    load_qwen35,
    random_qwen35,
    save_qwen35,
)

TargetModel = Qwen3ForCausalLM | Qwen35ForCausalLM
"""A target the decoders run: the dense Qwen3 or the Qwen3.5/3.6 hybrid (same forward and cache interface)."""


def target_architecture(path: str | Path) -> str:
    """``"qwen3_5"`` for a Qwen3.5/3.6 hybrid checkpoint directory, else ``"qwen3"``."""
    config = json.loads((Path(path) / "config.json").read_text())
    return "qwen3_5" if is_hybrid_target(config) else "qwen3"


def load_target(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> TargetModel:
    """Load a target checkpoint directory of either architecture."""
    if target_architecture(path) == "qwen3_5":
        return load_qwen35(path, dtype=dtype, device=device)
    return load_qwen3(path, dtype=dtype, device=device)


def random_target(config: Qwen3Config | Qwen35TextConfig, seed: int, std: float = 0.02,
                  wrapper: Mapping[str, Any] | None = None) -> TargetModel:
    """A target with deterministic random weights for a config of either architecture (``wrapper``: the hybrid's
    multimodal settings outside ``text_config``)."""
    if isinstance(config, Qwen35TextConfig):
        return random_qwen35(config, seed, std=std, wrapper=wrapper)
    return random_qwen3(config, seed, std=std)


def save_target(model: TargetModel, path: str | Path, extra_tensors: Mapping[str, torch.Tensor] | None = None) -> None:
    """Write a target in its architecture's checkpoint layout (``extra_tensors``: the hybrid's vision tower)."""
    if isinstance(model, Qwen35ForCausalLM):
        save_qwen35(model, path, extra_tensors)
    elif extra_tensors:
        raise ValueError("only a hybrid (multimodal) target carries extra tensors")
    else:
        save_qwen3(model, path)
