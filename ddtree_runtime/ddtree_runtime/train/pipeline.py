"""The whole recipe: corpus -> target -> self-distillation data -> drafter -> checkpoints + provenance."""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ddtree_runtime.reference import TargetModel, load_target, random_dflash, random_target
from ddtree_runtime.train.corpus import build_stream, list_sources, split_sources, spread_sample, stdlib_root
from ddtree_runtime.train.loop import (
    DraftSettings,
    Schedule,
    distill_sequences,
    drafter_chain_tau,
    mean_loss,
    train_drafter,
    train_target,
)
from ddtree_runtime.train.pair import (
    PROVENANCE_FILE,
    SHAPES,
    drafter_config,
    multimodal_wrapper,
    random_vision_tower,
    save_pair,
    target_config,
)


@dataclass(frozen=True)
class PairRecipe:
    shape: str = "tiny"
    seed: int = 0
    seq_len: int = 512
    target: Schedule = field(default_factory=lambda: Schedule(seconds=150, max_steps=100_000, batch=128, lr=3e-3))
    drafter: Schedule = field(default_factory=lambda: Schedule(seconds=120, max_steps=100_000, batch=64, lr=2e-3))
    draft: DraftSettings = field(default_factory=DraftSettings)
    max_files: int | None = None
    held_out_per_mille: int = 50


def _log(message: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_pair(recipe: PairRecipe, output: Path, device: str, root: Path | None = None,
              target_from: Path | None = None) -> dict[str, Any]:
    """Train both models and write them under ``output``; returns the provenance record (also saved).
    ``target_from``: a target this recipe trained before (its directory), used as it is, so only the drafter is
    trained (a drafter layout change does not retrain the target)."""
    begin = time.monotonic()
    torch.manual_seed(recipe.seed)
    generator = torch.Generator().manual_seed(recipe.seed)
    root = root or stdlib_root()
    files = spread_sample(list_sources(root), recipe.max_files)
    train_files, held_out_files = split_sources(files, recipe.held_out_per_mille)
    train_stream, held_out_stream = build_stream(train_files), build_stream(held_out_files)
    _log(f"corpus: {len(train_files)} train / {len(held_out_files)} held-out files, {train_stream.size} tokens")

    shape = SHAPES[recipe.shape]
    log: list[dict[str, Any]] = []
    wrapper = multimodal_wrapper(shape)
    reused: dict[str, Any] = {}
    if target_from is None:
        target = random_target(target_config(shape), recipe.seed, std=0.02, wrapper=wrapper).to(device)
        target_steps = train_target(
            target, train_stream, recipe.target, seq_len=recipe.seq_len, generator=generator, log=log
        )
    else:
        target, target_steps, reused = reuse_target(target_from, device, recipe.shape)
        _log(f"target: {target_from} as it is ({target_steps} steps when it was trained)")
    held_out_loss = mean_loss(target, held_out_stream, recipe.seq_len, batches=8, batch=32)
    _log(f"target: {target_steps} steps, held-out loss {held_out_loss:.3f} nats/byte")

    sequences = distill_sequences(target, train_stream, recipe.draft, generator)
    held_out_draft = replace_batches(recipe.draft, 1, min(recipe.draft.distill_batch, 128))
    held_out_sequences = distill_sequences(target, held_out_stream, held_out_draft, generator)
    _log(f"distilled {sequences.shape[0]} sequences of {sequences.shape[1]} tokens")

    drafter = random_dflash(drafter_config(shape), recipe.seed + 1, std=0.02).to(device)
    drafter_steps = train_drafter(
        drafter,
        target,
        sequences,
        schedule=recipe.drafter,
        settings=recipe.draft,
        generator=generator,
        log=log,
    )
    held_out_tau = drafter_chain_tau(drafter, target, held_out_sequences, recipe.draft, batch=32)
    _log(f"drafter: {drafter_steps} steps, held-out teacher-forced chain tau {held_out_tau:.3f}")

    provenance = {
        "recipe": asdict(recipe),
        "corpus": {
            "root": str(root),
            "python": platform.python_version(),
            "train_files": len(train_files),
            "held_out_files": len(held_out_files),
            "train_tokens": train_stream.size,
            "chat_examples": int(train_stream.chat_starts.numel()),
        },
        "architecture": "qwen3_5" if wrapper else "qwen3",
        "torch": torch.__version__,
        "device": _device_name(device),
        "target_steps": target_steps,
        **({"target_reused_from": reused} if reused else {}),
        "target_held_out_loss_nats_per_byte": held_out_loss,
        "distilled_sequences": int(sequences.shape[0]),
        "drafter_steps": drafter_steps,
        "drafter_held_out_chain_tau_teacher_forced": held_out_tau,
        "seconds": round(time.monotonic() - begin, 1),
    }
    vision = _vision_tower(wrapper, recipe.seed)
    if wrapper:
        provenance["vision_tower"] = "transformers' random init, untrained" if vision else "absent (no transformers)"
    output.mkdir(parents=True, exist_ok=True)
    save_pair(target.cpu(), drafter.cpu(), output, provenance, shape.pair_name, extra_tensors=vision)
    (output / "train_log.json").write_text(json.dumps({"provenance": provenance, "log": log}, indent=2) + "\n")
    _log(f"wrote {output / shape.pair_name} and {output / (shape.pair_name + '-dflash')}")
    return provenance


def reuse_target(directory: Path, device: str, shape: str) -> tuple[TargetModel, int, dict[str, Any]]:
    """A target saved by :func:`make_pair` for ``shape``, its training steps and what its provenance says of it (bf16
    weights read back exactly into float32, so saving it again writes the same bytes)."""
    record = json.loads((directory / PROVENANCE_FILE).read_text())
    if record.get("kind") != "target" or record.get("random_weights", True):
        raise ValueError(f"{directory} is not a trained target written by `train pair` ({PROVENANCE_FILE})")
    trained_for = record.get("recipe", {}).get("shape")
    if trained_for != shape:
        raise ValueError(f"{directory} was trained for --shape {trained_for}, not {shape}: the drafter of one shape "
                         f"does not fit the target of another; pass --shape {trained_for} or train the target too")
    kept = {key: record[key] for key in ("target_steps", "target_held_out_loss_nats_per_byte", "recipe", "torch",
                                         "device") if key in record}
    return load_target(directory).to(device), int(record["target_steps"]), {"path": directory.name, **kept}


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads)"


def _vision_tower(wrapper: dict[str, Any] | None, seed: int) -> dict[str, torch.Tensor] | None:
    if not wrapper:
        return None
    try:
        return random_vision_tower(wrapper["vision_config"], seed)
    except ImportError:
        _log("transformers is not installed: the hybrid target is written without its (unused) vision tower")
        return None


def replace_batches(settings: DraftSettings, batches: int, batch: int) -> DraftSettings:
    return DraftSettings(**{**asdict(settings), "distill_max_batches": batches, "distill_batch": batch})
