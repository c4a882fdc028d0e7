"""What a target/drafter pair's Hugging Face configs must say for SGLang to serve them (plain JSON, no torch).

SGLang captures the hidden state a drafter reads from target layer ``k`` as the *input* of layer ``k + 1``
(``set_dflash_layers_to_capture`` in its model files), so a drafter can read layers ``0 .. L - 2`` of an ``L``-layer
target. 0.5.23 checks only ``k < L``: a drafter trained on the last layer starts, captures one feature fewer than
it expects and kills the scheduler on the first request ("DFLASH target_hidden feature dim mismatch"; seen on the
H200 with stock DFLASH and DDTREE alike).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def text_settings(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's settings: ``text_config`` of a multimodal checkpoint (Qwen3.5/3.6), else the config."""
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def drafter_target_layer_ids(config: Mapping[str, Any]) -> list[int] | None:
    """The target layers a DFlash drafter reads (z-lab's ``dflash_config.target_layer_ids``), if it names them."""
    dflash = config.get("dflash_config")
    ids = dflash.get("target_layer_ids") if isinstance(dflash, Mapping) else None
    if ids is None:
        ids = config.get("target_layer_ids")
    return None if ids is None else [int(layer) for layer in ids]


def capture_problem(layer_ids: Sequence[int], num_target_layers: int) -> str | None:
    """Why SGLang cannot capture these target layers for a drafter, or None when it can."""
    unreadable = [layer for layer in layer_ids if not 0 <= layer <= num_target_layers - 2]
    if not unreadable:
        return None
    return (f"the drafter reads target layers {list(layer_ids)}, but SGLang can capture only layers "
            f"0..{num_target_layers - 2} of this {num_target_layers}-layer target (a layer's output is captured as "
            f"the next layer's input), not {unreadable}; use a drafter trained on earlier layers")


def _read_config(model_dir: Path) -> Mapping[str, Any] | None:
    path = model_dir / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def pair_problem(target_dir: str | Path, drafter_dir: str | Path) -> str | None:
    """:func:`capture_problem` for checkpoints on disk; None when either is not a local directory (a hub id)."""
    target, drafter = _read_config(Path(target_dir)), _read_config(Path(drafter_dir))
    if target is None or drafter is None:
        return None
    layer_ids = drafter_target_layer_ids(drafter)
    layers = text_settings(target).get("num_hidden_layers")
    if layer_ids is None or layers is None:
        return None
    return capture_problem(layer_ids, int(layers))
