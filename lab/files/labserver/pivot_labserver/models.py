"""Lab models.

The lab's serving host has no weights at the production paths. When ``PIVOT_LAB_MODEL_ROOT`` is set and a
model path has no ``config.json``, the path is mapped to ``$PIVOT_LAB_MODEL_ROOT/<path with / as _>`` and a
small random model is created there on first use (seeded from the path, so every host builds the same
weights; written atomically; never downloaded). Random lab targets are the byte pair's Qwen3 checkpoints
(:mod:`ddtree_runtime.reference.tiny`); a model directory given on disk may hold either architecture (Qwen3, or the
Qwen3.5/3.6 hybrid in its multimodal layout). Drafters are z-lab-format DFlash checkpoints sized to the target. Lab
models carry ``pivot_lab_model.json`` describing their origin.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ddtree_runtime.reference import Qwen3Config, Qwen35TextConfig, save_dflash, save_qwen3
from ddtree_runtime.reference.tiny import name_seed, random_byte_drafter, random_byte_target

LAB_ROOT_ENV = "PIVOT_LAB_MODEL_ROOT"
LAB_MARKER = "pivot_lab_model.json"


def lab_dir_for(path: str, root: Path) -> Path:
    slug = path.strip("/").replace("/", "_") or "root"
    return root / slug


def _publish(directory: Path, write: Callable[[Path], None]) -> None:
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
        save_qwen3(random_byte_target(seed), staging)

    return _resolve_model_dir(path, "target", save_random)


def resolve_drafter_dir(path: str, target: Qwen3Config | Qwen35TextConfig) -> Path:
    """The directory to load the drafter from (creating a lab drafter for ``target`` when not on disk)."""

    def save_random(seed: int, staging: Path) -> None:
        save_dflash(random_byte_drafter(target, seed), staging)

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
        seed = name_seed(path)

        def write(staging: Path) -> None:
            save_random(seed, staging)
            marker = {"kind": kind, "production_path": path, "seed": seed, "random_weights": True}
            (staging / LAB_MARKER).write_text(json.dumps(marker, indent=2) + "\n")

        _publish(directory, write)
    return directory
