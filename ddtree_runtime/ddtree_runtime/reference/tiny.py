"""Tiny random target + DFlash drafter pairs: for the self-check, the device smoke test and the unit tests.

Weights are deterministic from the seed (the drafter uses seed + 1); std 0.3 makes the target's distributions
peaked enough that greedy continuations are far from ties.

The byte pair (:func:`random_byte_target`, :func:`random_byte_drafter`) is a random Qwen3 target at the byte
tokenizer's vocabulary and a z-lab-format drafter sized to a target, so chat prompts drive it: ``bench.tau``'s default
pair, and the models the lab's server makes for paths that are not on disk. :func:`name_seed` seeds them from a name,
so every machine makes the same weights for it.
"""

from __future__ import annotations

import hashlib

from ddtree_runtime.reference.decoding import DFlashDrafter, SpeculativeDecoder
from ddtree_runtime.reference.dflash import DFlashConfig, DFlashDraftModel, build_target_layer_ids, random_dflash
from ddtree_runtime.reference.qwen3 import Qwen3Config, Qwen3ForCausalLM, random_qwen3
from ddtree_runtime.reference.qwen3_5 import Qwen35ForCausalLM, Qwen35TextConfig, random_qwen35
from ddtree_runtime.reference.target import TargetModel
from ddtree_runtime.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE, ByteTokenizer

TINY_TARGET_LAYERS = 4
BYTE_TARGET_LAYERS = 6
BYTE_BLOCK_SIZE = 16
BYTE_STD = 0.1


def tiny_target_config(vocab: int = 32) -> Qwen3Config:
    return Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=TINY_TARGET_LAYERS,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def tiny_drafter_config(vocab: int = 32, block_size: int = 16, sliding: bool = False) -> DFlashConfig:
    """Two layers reading two target layers; ``sliding`` makes the first one sliding-window (window 8)."""
    return DFlashConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, block_size=block_size,
                        target_layer_ids=build_target_layer_ids(TINY_TARGET_LAYERS, 2), mask_token_id=vocab - 1,
                        layer_types=["sliding_attention", "full_attention"] if sliding else [],
                        sliding_window=8 if sliding else None)


def tiny_pair(
    vocab: int = 32, seed: int = 0, std: float = 0.3, sliding: bool = False
) -> tuple[Qwen3ForCausalLM, DFlashDraftModel]:
    """A random target and drafter in float32 on the CPU (move or cast them as needed)."""
    target = random_qwen3(tiny_target_config(vocab), seed, std=std)
    drafter = random_dflash(tiny_drafter_config(vocab, sliding=sliding), seed + 1, std=std)
    return target, drafter


def tiny_hybrid_config(vocab: int = 32) -> Qwen35TextConfig:
    """Three Gated DeltaNet layers, then one gated full-attention layer (Qwen3.6's pattern), partial rotary 0.25."""
    return Qwen35TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=TINY_TARGET_LAYERS,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_key_heads=2,
                            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)


def tiny_hybrid_pair(
    vocab: int = 32, seed: int = 0, std: float = 0.3
) -> tuple[Qwen35ForCausalLM, DFlashDraftModel]:
    """A random hybrid target and the tiny drafter for it (same drafter config as :func:`tiny_pair`)."""
    target = random_qwen35(tiny_hybrid_config(vocab), seed, std=std)
    drafter = random_dflash(tiny_drafter_config(vocab), seed + 1, std=std)
    return target, drafter


def tiny_decoder(target: TargetModel, drafter: DFlashDraftModel) -> SpeculativeDecoder:
    return SpeculativeDecoder(target, DFlashDrafter(drafter, target))


def name_seed(name: str) -> int:
    """A seed from a name: the first four bytes of its SHA-256."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def byte_target_config() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=BYTE_TARGET_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=131072,
        eos_token_id=sorted(ByteTokenizer.eos_token_ids),
    )


def byte_drafter_config(target: Qwen3Config | Qwen35TextConfig) -> DFlashConfig:
    """Two layers (sliding-window, then full attention) of ``target``'s width reading two of its layers."""
    return DFlashConfig(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=target.num_attention_heads,
        num_key_value_heads=target.num_key_value_heads,
        head_dim=target.head_dim,
        block_size=BYTE_BLOCK_SIZE,
        target_layer_ids=build_target_layer_ids(target.num_hidden_layers, 2),
        mask_token_id=SPECIAL_TOKENS["<|mask|>"],
        max_position_embeddings=target.max_position_embeddings,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=2048,
    )


def random_byte_target(seed: int) -> Qwen3ForCausalLM:
    return random_qwen3(byte_target_config(), seed, std=BYTE_STD)


def random_byte_drafter(target: Qwen3Config | Qwen35TextConfig, seed: int) -> DFlashDraftModel:
    """A random drafter for ``target`` (any target: a byte target, or a model read from disk)."""
    return random_dflash(byte_drafter_config(target), seed, std=BYTE_STD)
