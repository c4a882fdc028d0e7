"""The shipped pair's architecture (and a smoke-sized one for CPU tests), and writing a trained pair."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_runtime.labserver.models import LAB_VOCAB, SPECIAL_TOKENS, ByteTokenizer
from ddtree_runtime.reference import (
    DFlashConfig,
    DFlashDraftModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    save_dflash,
    save_qwen3,
)

PAIR_NAME = "pivot-coder-tiny"
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


SHAPES = {
    # The shipped pair. SGLang captures a target layer's output as the input of the next layer, so the drafter may
    # not read the last layer; its bf16 fused QK-norm/RoPE kernel needs a power-of-two head_dim.
    "tiny": PairShape(192, 576, 6, 3, 4, 2, 64, (1, 2, 4)),
    # CPU smoke runs and tests.
    "smoke": PairShape(32, 64, 3, 1, 2, 1, 16, (0, 1)),
}


def target_config(shape: PairShape) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=LAB_VOCAB,
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


def drafter_config(shape: PairShape) -> DFlashConfig:
    return DFlashConfig(
        vocab_size=LAB_VOCAB,
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
    target: Qwen3ForCausalLM,
    drafter: DFlashDraftModel,
    output: Path,
    provenance: dict[str, Any],
    name: str = PAIR_NAME,
) -> tuple[Path, Path]:
    """Write ``output/<name>`` and ``output/<name>-dflash`` with bf16 weights, notes and checksums."""
    target_dir, drafter_dir = output / name, output / f"{name}-dflash"
    save_qwen3(copy.deepcopy(target).bfloat16(), target_dir)
    save_dflash(copy.deepcopy(drafter).bfloat16(), drafter_dir)
    for directory, kind in ((target_dir, "target"), (drafter_dir, "dflash_drafter")):
        _set_stored_dtype(directory, "bfloat16")
        (directory / TOKENIZER_NOTE).write_text(TOKENIZER_TEXT)
        record = {"kind": kind, "pair": name, "random_weights": False, **provenance}
        (directory / PROVENANCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        write_checksums(directory)
    return target_dir, drafter_dir
