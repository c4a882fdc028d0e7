"""The shipped pairs' architectures (dense Qwen3 and the Qwen3.5/3.6 hybrid, each with a smoke-sized variant for
CPU tests), and writing a trained pair."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddtree_runtime.acceptance.hybrid import HYBRID_TEXT_CONFIG, HYBRID_VISION_CONFIG, HYBRID_VISION_TOKENS
from ddtree_runtime.model_layout import hybrid_layer_types
from ddtree_runtime.reference import (
    DFlashConfig,
    DFlashDraftModel,
    Qwen3Config,
    Qwen35TextConfig,
    TargetModel,
    save_dflash,
    save_target,
)
from ddtree_runtime.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE, ByteTokenizer

PAIR_NAME = "pivot-coder-tiny"
HYBRID_PAIR_NAME = "pivot-coder-tiny-hybrid"
MASK_TOKEN_ID = SPECIAL_TOKENS["<|mask|>"]
BLOCK_SIZE = 16
CHECKSUM_FILE = "SHA256SUMS"
PROVENANCE_FILE = "pivot_model.json"
TOKENIZER_NOTE = "TOKENIZER.md"
TOKENIZER_TEXT = """# Tokenizer

This model uses `ddtree_runtime.labserver.models.ByteTokenizer`, not a Hugging Face tokenizer (there is
deliberately no `tokenizer.json`, so `load_tokenizer` picks the byte tokenizer):

- ids 0-255: the UTF-8 bytes of the text;
- 256 `<|endoftext|>`, 257 `<|im_start|>`, 258 `<|im_end|>`, 259 `<think>`, 260 `</think>`,
  261 `<|mask|>` (the DFlash drafter's mask token), 262 `<tool_call>`, 263 `</tool_call>`;
- 264-319: unused padding of the 320-entry vocabulary.

Prompts use ChatML (`chat_prompt`); generation stops at 256 or 258.
"""


@dataclass(frozen=True)
class PairShape:
    hidden_size: int
    intermediate_size: int
    target_layers: int
    drafter_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    target_layer_ids: tuple[int, ...]
    pair_name: str = PAIR_NAME


@dataclass(frozen=True)
class HybridShape(PairShape):
    """A Qwen3.5/3.6 target: Gated DeltaNet layers with every ``full_attention_interval``-th one full attention."""

    linear_key_heads: int = 2
    linear_value_heads: int = 4
    linear_head_dim: int = 32
    full_attention_interval: int = 4
    pair_name: str = HYBRID_PAIR_NAME


SHAPES = {
    # The shipped pairs. SGLang captures a target layer's output as the input of the next layer, so the drafter may
    # not read the last layer; its bf16 fused QK-norm/RoPE kernel needs a power-of-two head_dim.
    "tiny": PairShape(192, 576, 6, 3, 4, 2, 64, (1, 2, 4)),
    # One group of Qwen3.6's pattern (three DeltaNet layers, then gated attention) at half the width of the lab's
    # random hybrid case (acceptance/hybrid.py), small enough to train on a CPU; the drafter reads DeltaNet layers
    # 1 and 2 (not the last layer, which SGLang cannot capture).
    "tiny-hybrid": HybridShape(128, 384, 4, 2, 4, 2, 64, (1, 2)),
    # CPU smoke runs and tests.
    "smoke": PairShape(32, 64, 3, 1, 2, 1, 16, (0, 1)),
    "smoke-hybrid": HybridShape(32, 64, 4, 1, 2, 1, 16, (0, 1), linear_key_heads=1, linear_value_heads=2,
                                linear_head_dim=8),
}


def target_config(shape: PairShape) -> Qwen3Config | Qwen35TextConfig:
    if isinstance(shape, HybridShape):
        return hybrid_target_config(shape)
    return Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.target_layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        eos_token_id=sorted(ByteTokenizer.eos_token_ids),
    )


def hybrid_target_config(shape: HybridShape) -> Qwen35TextConfig:
    layers = {"num_hidden_layers": shape.target_layers, "full_attention_interval": shape.full_attention_interval}
    rope = HYBRID_TEXT_CONFIG["rope_parameters"]
    return Qwen35TextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.target_layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        layer_types=hybrid_layer_types(layers),
        linear_num_key_heads=shape.linear_key_heads,
        linear_num_value_heads=shape.linear_value_heads,
        linear_key_head_dim=shape.linear_head_dim,
        linear_value_head_dim=shape.linear_head_dim,
        rope_theta=rope["rope_theta"],
        partial_rotary_factor=rope["partial_rotary_factor"],
        max_position_embeddings=4096,
        eos_token_id=sorted(ByteTokenizer.eos_token_ids),
    )


def multimodal_wrapper(shape: PairShape) -> dict[str, Any] | None:
    """The hybrid target's settings beside ``text_config``: a tiny vision tower (as the lab's hybrid case has)."""
    if not isinstance(shape, HybridShape):
        return None
    vision = {**HYBRID_VISION_CONFIG, "out_hidden_size": shape.hidden_size}
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "vision_config": vision,
            **HYBRID_VISION_TOKENS}


def random_vision_tower(vision_config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """transformers' own randomly initialised ``model.visual.*`` tensors for ``vision_config`` (nothing reads them
    here; they make the checkpoint complete for loaders that build the whole multimodal model)."""
    from transformers import Qwen3_5VisionConfig  # noqa: PLC0415 - optional dependency, transformers >= 5
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel  # noqa: PLC0415

    torch.manual_seed(seed)
    tower = Qwen3_5VisionModel(Qwen3_5VisionConfig(**vision_config))
    return {f"model.visual.{name}": tensor for name, tensor in tower.state_dict().items()}


def drafter_config(shape: PairShape) -> DFlashConfig:
    return DFlashConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.drafter_layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        block_size=BLOCK_SIZE,
        target_layer_ids=list(shape.target_layer_ids),
        mask_token_id=MASK_TOKEN_ID,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        num_target_layers=shape.target_layers,
    )


def write_checksums(directory: Path) -> Path:
    """``SHA256SUMS`` over every other file in ``directory`` (``sha256sum -c`` format)."""
    lines = []
    for path in sorted(p for p in directory.iterdir() if p.is_file() and p.name != CHECKSUM_FILE):
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    target = directory / CHECKSUM_FILE
    target.write_text("".join(lines))
    return target


def verify_checksums(directory: Path) -> list[str]:
    """Names of the files whose SHA-256 differs from ``SHA256SUMS`` (or that are missing); empty when intact."""
    bad = []
    for line in (directory / CHECKSUM_FILE).read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        path = directory / name.strip()
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            bad.append(name.strip())
    return bad


def _set_stored_dtype(directory: Path, dtype_name: str) -> None:
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = dtype_name
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def save_pair(
    target: TargetModel,
    drafter: DFlashDraftModel,
    output: Path,
    provenance: dict[str, Any],
    name: str = PAIR_NAME,
    *,
    extra_tensors: dict[str, torch.Tensor] | None = None,
) -> tuple[Path, Path]:
    """Write ``output/<name>`` and ``output/<name>-dflash`` with bf16 weights, notes and checksums
    (``extra_tensors``: a hybrid target's vision tower, stored beside its text weights)."""
    target_dir, drafter_dir = output / name, output / f"{name}-dflash"
    extra = {key: tensor.bfloat16() for key, tensor in (extra_tensors or {}).items()}
    save_target(copy.deepcopy(target).bfloat16(), target_dir, extra)
    save_dflash(copy.deepcopy(drafter).bfloat16(), drafter_dir)
    for directory, kind in ((target_dir, "target"), (drafter_dir, "dflash_drafter")):
        _set_stored_dtype(directory, "bfloat16")
        (directory / TOKENIZER_NOTE).write_text(TOKENIZER_TEXT)
        record = {"kind": kind, "pair": name, "random_weights": False, **provenance}
        (directory / PROVENANCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        write_checksums(directory)
    return target_dir, drafter_dir
