from __future__ import annotations

import pytest
import torch
from ddtree_runtime.reference import (
    DFlashConfig,
    DFlashDrafter,
    Qwen3Config,
    SpeculativeDecoder,
    build_target_layer_ids,
    random_dflash,
    random_qwen3,
)

# Tiny models: two threads make float64 GEMMs thousands of times slower on small shapes (OpenMP contention).
torch.set_num_threads(1)

TARGET_LAYERS = 4


def tiny_target_config(vocab: int = 32) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )


def tiny_drafter_config(vocab: int = 32, block_size: int = 16, sliding: bool = False) -> DFlashConfig:
    return DFlashConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        block_size=block_size,
        target_layer_ids=build_target_layer_ids(TARGET_LAYERS, 2),
        mask_token_id=vocab - 1,
        layer_types=["sliding_attention", "full_attention"] if sliding else [],
        sliding_window=8 if sliding else None,
    )


def make_decoder(vocab: int = 32, seed: int = 0, std: float = 0.3, sliding: bool = False) -> SpeculativeDecoder:
    """A float64 random target + drafter pair. std 0.3 makes the target's distributions peaked enough that
    greedy continuations are far from ties."""
    target = random_qwen3(tiny_target_config(vocab), seed, std=std).double()
    drafter = random_dflash(tiny_drafter_config(vocab, sliding=sliding), seed + 1, std=std).double()
    return SpeculativeDecoder(target, DFlashDrafter(drafter, target))


@pytest.fixture(scope="session")
def decoder() -> SpeculativeDecoder:
    return make_decoder()
