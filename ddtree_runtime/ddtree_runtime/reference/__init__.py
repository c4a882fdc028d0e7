"""Reference engine: pure-PyTorch Qwen3 and Qwen3.5/3.6 (hybrid) targets, the DFlash drafter and the AR / DFlash /
DDTree decoders."""

from ddtree_runtime.reference.cache import HybridCache, KVCache
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
from ddtree_runtime.reference.qwen3_5 import (
    Qwen35ForCausalLM,
    Qwen35TextConfig,
    load_qwen35,
    random_qwen35,
    save_qwen35,
)
from ddtree_runtime.reference.target import (
    TargetModel,
    load_target,
    random_target,
    save_target,
    target_architecture,
)

__all__ = [
    "METHODS",
    "DFlashConfig",
    "DFlashDraftModel",
    "DFlashDrafter",
    "Drafter",
    "GenerationResult",
    "GenerationStats",
    "HybridCache",
    "KVCache",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "Qwen35ForCausalLM",
    "Qwen35TextConfig",
    "SpeculativeDecoder",
    "TargetModel",
    "build_target_layer_ids",
    "load_dflash",
    "load_qwen3",
    "load_qwen35",
    "load_target",
    "random_dflash",
    "random_qwen3",
    "random_qwen35",
    "random_target",
    "save_dflash",
    "save_qwen3",
    "save_qwen35",
    "save_target",
    "target_architecture",
]
