"""What a target/drafter pair's Hugging Face configs say (plain JSON, no torch): the target's architecture and text
settings (dense Qwen3, or the Qwen3.5/3.6 hybrid with its settings under ``text_config``), and what SGLang needs to
serve the pair.

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

HYBRID_ARCHITECTURES = frozenset({"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"})
HYBRID_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_text"})
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
WINDOW_SWITCHED_MODEL_TYPES = frozenset({"qwen2", "qwen3", "qwen3_moe"})
"""Model types whose transformers config keeps ``sliding_window`` only with ``use_sliding_window: true`` (it sets the
window to None otherwise); a DFlash drafter's flat config is read as one of these (z-lab's say ``qwen3``)."""
DEFAULT_FULL_ATTENTION_INTERVAL = 4
"""Qwen3.5/3.6 (and transformers' ``Qwen3_5TextConfig``) make every fourth layer full attention unless told."""


def text_settings(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's settings: ``text_config`` of a multimodal checkpoint (Qwen3.5/3.6), else the config."""
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def is_hybrid_target(config: Mapping[str, Any]) -> bool:
    """Whether a target config is the Qwen3.5/3.6 hybrid (Gated DeltaNet + gated attention) architecture."""
    architectures = set(config.get("architectures") or [])
    text = text_settings(config)
    return (
        bool(architectures & HYBRID_ARCHITECTURES)
        or config.get("model_type") in HYBRID_MODEL_TYPES
        or text.get("model_type") in HYBRID_MODEL_TYPES
        or LINEAR_ATTENTION in (text.get("layer_types") or [])
    )


def hybrid_layer_types(text: Mapping[str, Any]) -> list[str]:
    """Per-layer ``linear_attention`` / ``full_attention``: ``layer_types`` when given, else every
    ``full_attention_interval``-th layer (1-based) is full attention, as transformers derives it."""
    layers = int(text["num_hidden_layers"])
    given = text.get("layer_types")
    if given:
        types = [str(t) for t in given]
        if len(types) != layers or set(types) - {LINEAR_ATTENTION, FULL_ATTENTION}:
            raise ValueError(f"layer_types must name {layers} layers as {LINEAR_ATTENTION} or {FULL_ATTENTION}")
        return types
    interval = int(text.get("full_attention_interval") or DEFAULT_FULL_ATTENTION_INTERVAL)
    return [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(layers)]


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


def drafter_window_problem(config: Mapping[str, Any]) -> str | None:
    """Why SGLang cannot build a drafter's ``sliding_attention`` layers, or None when it can (or there are none).

    SGLang reads the drafter's config through transformers and refuses sliding layers without a window ("DFLASH
    sliding_attention layers require config.sliding_window"); for a ``qwen3`` config transformers keeps the window
    only when ``use_sliding_window`` is true (seen on the H200: a drafter with a window of 2048 but without that key
    killed the scheduler at start)."""
    text = text_settings(config)
    if SLIDING_ATTENTION not in (text.get("layer_types") or []):
        return None
    window = text.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        return (f"the drafter has {SLIDING_ATTENTION} layers but sliding_window is {window!r}: SGLang needs the "
                "window's size; set sliding_window in the drafter's config.json")
    model_type = text.get("model_type")
    if model_type in WINDOW_SWITCHED_MODEL_TYPES and text.get("use_sliding_window") is not True:
        return (f"the drafter has {SLIDING_ATTENTION} layers and sliding_window {window}, but its {model_type!r} "
                "config lacks use_sliding_window: true, so transformers drops the window and SGLang refuses the "
                "drafter; add \"use_sliding_window\": true to the drafter's config.json")
    return None


def _read_config(model_dir: Path) -> Mapping[str, Any] | None:
    path = model_dir / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def pair_problem(target_dir: str | Path, drafter_dir: str | Path) -> str | None:
    """:func:`drafter_window_problem` and :func:`capture_problem` for checkpoints on disk; None when either is not a
    local directory (a hub id)."""
    target, drafter = _read_config(Path(target_dir)), _read_config(Path(drafter_dir))
    if target is None or drafter is None:
        return None
    window = drafter_window_problem(drafter)
    if window is not None:
        return window
    layer_ids = drafter_target_layer_ids(drafter)
    layers = text_settings(target).get("num_hidden_layers")
    if layer_ids is None or layers is None:
        return None
    return capture_problem(layer_ids, int(layers))
