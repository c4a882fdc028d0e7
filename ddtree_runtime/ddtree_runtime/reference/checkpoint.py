"""safetensors helpers: read every shard of a checkpoint directory, write one file."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


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
