"""Lab models and tokenizers.

The lab's serving host has no weights at the production paths. When ``PIVOT_LAB_MODEL_ROOT`` is set and a
model path has no ``config.json``, the path is mapped to ``$PIVOT_LAB_MODEL_ROOT/<path with / as _>`` and a
small random model is created there on first use (seeded from the path, so every host builds the same
weights; written atomically; never downloaded). Random lab targets are Qwen3 checkpoints; a model directory given
on disk may hold either architecture (Qwen3, or the Qwen3.5/3.6 hybrid in its multimodal layout). Drafters are
z-lab-format DFlash checkpoints sized to the target. Lab models carry ``pivot_lab_model.json`` describing their
origin.

Tokenizer and chat template: :mod:`ddtree_runtime.tokenizer` (re-exported here for the lab server).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddtree_runtime.reference import (
    DFlashConfig,
    Qwen3Config,
    Qwen35TextConfig,
    build_target_layer_ids,
    random_dflash,
    random_qwen3,
    save_dflash,
    save_qwen3,
)
from ddtree_runtime.tokenizer import (  # re-exported: the lab server and its tests read them here
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    ByteTokenizer,
)

LAB_ROOT_ENV = "PIVOT_LAB_MODEL_ROOT"
LAB_MARKER = "pivot_lab_model.json"

LAB_VOCAB = VOCAB_SIZE
LAB_TARGET_LAYERS = 6
LAB_BLOCK_SIZE = 16


def lab_seed(path: str) -> int:
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:4], "big")


def lab_dir_for(path: str, root: Path) -> Path:
    slug = path.strip("/").replace("/", "_") or "root"
    return root / slug


def lab_target_config() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=LAB_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAB_TARGET_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=131072,
        eos_token_id=sorted(ByteTokenizer.eos_token_ids),
    )


def lab_drafter_config(target: Qwen3Config | Qwen35TextConfig) -> DFlashConfig:
    return DFlashConfig(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=target.num_attention_heads,
        num_key_value_heads=target.num_key_value_heads,
        head_dim=target.head_dim,
        block_size=LAB_BLOCK_SIZE,
        target_layer_ids=build_target_layer_ids(target.num_hidden_layers, 2),
        mask_token_id=SPECIAL_TOKENS["<|mask|>"],
        max_position_embeddings=target.max_position_embeddings,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=2048,
    )


def _publish(directory: Path, write: Any) -> None:
    """Create ``directory`` atomically: build in a sibling temp dir, then rename (a concurrent winner wins)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        write(staging)
        os.rename(staging, directory)
    except OSError:
        if not (directory / "config.json").is_file():
            raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def resolve_target_dir(path: str) -> Path:
    """The directory to load the target from (creating a lab model when the path is not on disk)."""

    def save_random(seed: int, staging: Path) -> None:
        save_qwen3(random_qwen3(lab_target_config(), seed, std=0.1), staging)

    return _resolve_model_dir(path, "target", save_random)


def resolve_drafter_dir(path: str, target: Qwen3Config | Qwen35TextConfig) -> Path:
    """The directory to load the drafter from (creating a lab drafter for ``target`` when not on disk)."""

    def save_random(seed: int, staging: Path) -> None:
        save_dflash(random_dflash(lab_drafter_config(target), seed, std=0.1), staging)

    return _resolve_model_dir(path, "dflash_drafter", save_random)


def _resolve_model_dir(path: str, kind: str, save_random: Callable[[int, Path], None]) -> Path:
    given = Path(path)
    if (given / "config.json").is_file():
        return given
    root = os.environ.get(LAB_ROOT_ENV)
    if not root:
        raise FileNotFoundError(f"{path} has no config.json (set {LAB_ROOT_ENV} to serve a random lab model)")
    directory = lab_dir_for(path, Path(root))
    if not (directory / "config.json").is_file():
        seed = lab_seed(path)

        def write(staging: Path) -> None:
            save_random(seed, staging)
            marker = {"kind": kind, "production_path": path, "seed": seed, "random_weights": True}
            (staging / LAB_MARKER).write_text(json.dumps(marker, indent=2) + "\n")

        _publish(directory, write)
    return directory
