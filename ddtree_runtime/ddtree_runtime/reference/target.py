"""Either target architecture behind one name, and loading a checkpoint by what its ``config.json`` says."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ddtree_runtime.model_layout import is_hybrid_target
from ddtree_runtime.reference.qwen3 import Qwen3ForCausalLM, load_qwen3
from ddtree_runtime.reference.qwen3_5 import Qwen35ForCausalLM, load_qwen35

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
