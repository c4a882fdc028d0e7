"""Reference engine: a pure-PyTorch Qwen3 target, the DFlash drafter and the AR / DFlash / DDTree decoders."""

from ddtree_runtime.reference.cache import KVCache
from ddtree_runtime.reference.decoding import (
    METHODS,
    DFlashDrafter,
    Drafter,
    GenerationResult,
    GenerationStats,
    SpeculativeDecoder,
)
from ddtree_runtime.reference.dflash import (
    DFlashConfig,
    DFlashDraftModel,
    build_target_layer_ids,
    load_dflash,
    random_dflash,
    save_dflash,
)
from ddtree_runtime.reference.qwen3 import Qwen3Config, Qwen3ForCausalLM, load_qwen3, random_qwen3, save_qwen3

__all__ = [
    "METHODS",
    "DFlashConfig",
    "DFlashDraftModel",
    "DFlashDrafter",
    "Drafter",
    "GenerationResult",
    "GenerationStats",
    "KVCache",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "SpeculativeDecoder",
    "build_target_layer_ids",
    "load_dflash",
    "load_qwen3",
    "random_dflash",
    "random_qwen3",
    "save_dflash",
    "save_qwen3",
]
