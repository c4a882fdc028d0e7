"""Case 7's models: a small random target of the Qwen3.5/3.6 architecture and a matching random DFlash drafter.

The target has the layout of the Qwen3.5/3.6 multimodal checkpoints as transformers' own
``Qwen3_5ForConditionalGeneration`` writes them (the architecture Qwen3.6-27B names): text settings under
``text_config`` (three Gated DeltaNet layers to one gated full-attention layer, partial rotary 0.25, separate
``lm_head``), a vision tower beside it (tiny here), and the multimodal weight names (``model.language_model.*``,
``model.visual.*``), with random weights. It was not compared with the real Qwen3.6-27B ``config.json`` here (no
download); its scaled-down figures follow the public 27B settings quoted below. The drafter is the z-lab
style flat DFlash config (``dflash_config.target_layer_ids``, ``mask_token_id``, one sliding-window layer) over the
target's hidden size. Vocabulary: the shipped pair's byte tokenizer (320 ids), so the suite's prompts apply. Like
Qwen3.6-27B's checkpoint, the target directory carries its processor and tokenizer (:func:`write_hybrid_processor`):
SGLang loads a multimodal target's processor at start unless ``--skip-tokenizer-init``. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ddtree_runtime.model_layout import drafter_window_problem
from ddtree_runtime.reference.dflash import DFlashConfig, random_dflash, save_dflash
from ddtree_runtime.sglang.config import MAX_DRAFT_TOKENS
from ddtree_runtime.tokenizer import (
    HF_TOKENIZER_FILES,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    ByteTokenizer,
    write_hf_tokenizer,
)

HYBRID_LAYERS = 8
"""Layers of the random target: twice ``linear_attention`` x 3, then ``full_attention`` (Qwen3.6's interval of 4)."""

FULL_ATTENTION_INTERVAL = 4


def qwen36_layer_types(layers: int) -> list[str]:
    """Qwen3.5/3.6's layout: three Gated DeltaNet (``linear_attention``) layers to one ``full_attention`` layer."""
    return (["linear_attention"] * (FULL_ATTENTION_INTERVAL - 1) + ["full_attention"]) * (
        layers // FULL_ATTENTION_INTERVAL)


HYBRID_TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": HYBRID_LAYERS,
    "layer_types": qwen36_layer_types(HYBRID_LAYERS),
    "full_attention_interval": FULL_ATTENTION_INTERVAL,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "eos_token_id": sorted(ByteTokenizer.eos_token_ids),
}
"""Qwen3.6-27B's text settings scaled down (27B: hidden 5120, 64 layers, 24 heads / 4 KV heads of 256, GDN
16 key / 48 value heads of 128, vocabulary 248,320)."""

HYBRID_DRAFTER_TARGET_LAYERS = [1, 3, 5]
"""Target layers whose hidden states feed the drafter: GDN layers and a full-attention one, never the last layer
(SGLang cannot capture it, :mod:`ddtree_runtime.model_layout`; z-lab's Qwen3.6 drafter reads five of 64 layers)."""

HYBRID_VISION_CONFIG: dict[str, Any] = {
    "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 256,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
}
# Unused ids of the byte vocabulary stand in for the vision special tokens (248,053-248,057 in Qwen3.6).
HYBRID_VISION_TOKENS = {"image_token_id": 300, "video_token_id": 301, "vision_start_token_id": 302,
                        "vision_end_token_id": 303}
HYBRID_VISION_TOKEN_NAMES = {"<|image_pad|>": HYBRID_VISION_TOKENS["image_token_id"],
                             "<|video_pad|>": HYBRID_VISION_TOKENS["video_token_id"],
                             "<|vision_start|>": HYBRID_VISION_TOKENS["vision_start_token_id"],
                             "<|vision_end|>": HYBRID_VISION_TOKENS["vision_end_token_id"]}
"""The vision tokens as Qwen3-VL/Qwen3.5's processor names them (``Qwen3VLProcessor`` looks them up by these names),
special tokens of the hybrid target's tokenizer at the ids its config gives."""
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")
"""The processor settings Qwen3.6-27B ships (image and video), beside its tokenizer files."""
QWEN_VL_NORMALIZATION = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
"""Qwen3-VL's pixel normalization (the vision tower here is random; the figures only have to load)."""


def processor_configs(vision_config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``preprocessor_config.json`` and ``video_preprocessor_config.json`` in the Qwen3-VL/Qwen3.5 form, with the
    vision tower's patch, merge and temporal patch sizes (the processor cuts images into the patches the tower
    embeds). Pixel bounds: Qwen3-VL's (not compared with the 27B files here: no download)."""
    patches = {"patch_size": vision_config["patch_size"], "temporal_patch_size": vision_config["temporal_patch_size"],
               "merge_size": vision_config["spatial_merge_size"]}
    common = {**patches, **QWEN_VL_NORMALIZATION, "processor_class": "Qwen3VLProcessor"}
    return {
        "preprocessor_config.json": {"size": {"longest_edge": 16_777_216, "shortest_edge": 65_536}, **common,
                                     "image_processor_type": "Qwen2VLImageProcessorFast"},
        "video_preprocessor_config.json": {"size": {"longest_edge": 25_165_824, "shortest_edge": 4096}, **common,
                                           "video_processor_type": "Qwen3VLVideoProcessor"},
    }


def write_hybrid_processor(directory: Path, vision_config: dict[str, Any] | None = None) -> list[Path]:
    """The processor and tokenizer files of a Qwen3.5/3.6 target into ``directory``: :data:`PROCESSOR_FILES` and the
    byte tokenizer with the vision tokens (:data:`HYBRID_VISION_TOKEN_NAMES`) as special tokens."""
    directory.mkdir(parents=True, exist_ok=True)
    written = write_hf_tokenizer(directory, HYBRID_VISION_TOKEN_NAMES)
    for name, config in processor_configs(vision_config or HYBRID_VISION_CONFIG).items():
        path = directory / name
        path.write_text(json.dumps(config, indent=2) + "\n")
        written.append(path)
    return written


def write_hybrid_target(directory: Path, seed: int = 0) -> Path:
    """A random ``Qwen3_5ForConditionalGeneration`` checkpoint (bf16 safetensors + config.json) in ``directory``, with
    its processor and tokenizer (:func:`write_hybrid_processor`)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration  # noqa: PLC0415 - transformers >= 5

    config = Qwen3_5Config(text_config=dict(HYBRID_TEXT_CONFIG), vision_config=dict(HYBRID_VISION_CONFIG),
                           tie_word_embeddings=False, **HYBRID_VISION_TOKENS)
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    write_hybrid_processor(directory)
    return directory


def hybrid_drafter_config() -> DFlashConfig:
    text = HYBRID_TEXT_CONFIG
    return DFlashConfig(
        vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"],
        intermediate_size=text["intermediate_size"],
        num_hidden_layers=2,
        num_attention_heads=text["num_attention_heads"],
        num_key_value_heads=text["num_key_value_heads"],
        head_dim=text["head_dim"],
        block_size=MAX_DRAFT_TOKENS,
        target_layer_ids=HYBRID_DRAFTER_TARGET_LAYERS,
        mask_token_id=SPECIAL_TOKENS["<|mask|>"],
        max_position_embeddings=text["max_position_embeddings"],
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=2048,
    )


def write_hybrid_drafter(directory: Path, seed: int = 1) -> Path:
    save_dflash(random_dflash(hybrid_drafter_config(), seed, std=0.02).to(torch.bfloat16), directory)
    return directory


def write_hybrid_pair(root: Path) -> tuple[Path, Path]:
    """Both models under ``root`` (written once; a later run reuses them, adds the target's processor and tokenizer
    where an earlier version wrote the target without them, and rewrites a drafter whose window SGLang would not
    see, as an earlier version wrote it)."""
    target, drafter = root / "hybrid-target", root / "hybrid-dflash"
    if not (target / "config.json").is_file():
        write_hybrid_target(target)
    elif not all((target / name).is_file() for name in (*PROCESSOR_FILES, *HF_TOKENIZER_FILES)):
        write_hybrid_processor(target)
    drafter_config = drafter / "config.json"
    if not drafter_config.is_file() or drafter_window_problem(json.loads(drafter_config.read_text())) is not None:
        write_hybrid_drafter(drafter)
    return target, drafter
