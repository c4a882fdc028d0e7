"""Weights in and out: every safetensors shard of a checkpoint directory, one file out, seeded random weights."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn


def load_safetensors_dir(directory: Path) -> dict[str, torch.Tensor]:
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(shard)))
    return state


def save_safetensors(state: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(path), metadata={"format": "pt"})


def load_state_exactly(model: nn.Module, state: dict[str, torch.Tensor], directory: Path,
                       may_be_missing: frozenset[str] = frozenset()) -> None:
    """Load ``state`` into ``model``; any other missing or any unexpected tensor is an error naming both lists."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) - may_be_missing or unexpected:
        raise ValueError(f"checkpoint mismatch in {directory}: missing={missing} unexpected={unexpected}")


def fill_random_(model: nn.Module, seed: int, std: float) -> None:
    """Deterministic random weights: normal(0, std) in parameter order, every norm weight 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
