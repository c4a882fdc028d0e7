"""Round cost at real size: milliseconds per decode round of real-sized targets and drafters with random weights.

Two shapes (:data:`SHAPES`), each a pair of config-only directories (``config.json``, no weights, no tokenizer;
nothing is downloaded), served with random weights and without a tokenizer (:data:`RANDOM_TARGET_FLAGS`,
:data:`RANDOM_PAIR_FLAGS`): the acceptance length they reach says nothing, the time a round takes is the figure.

- ``8b``: a Qwen3-8B-shaped target (:data:`ROUND_COST_TARGET`) and a drafter of z-lab's Qwen3-8B-DFlash-b16 shape
  (five decoder layers of the target's width, :data:`ROUND_COST_DRAFTER`); batch 1 and 16.
- ``27b``: the user's model family at full size, a Qwen3.6-27B-shaped hybrid target
  (``Qwen3_5ForConditionalGeneration``, :data:`QWEN36_27B_TEXT_CONFIG`, a small vision tower) and a drafter of
  z-lab's Qwen3.6-27B-DFlash shape (:data:`QWEN36_27B_DRAFTER`); batch 1 only (:data:`SHAPE_27B_FLAGS` says why).

Each server, once started, answers one warm-up call and then the same prompts (:func:`round_cost_prompt`, greedy,
``ignore_eos``; at batch 16 sixteen different prompts in one call, which SGLang decodes as one batch) at two output
lengths. The difference between the two removes the prefill, so
``ms per round = 1000 * (seconds_long - seconds_short) / (rounds_long - rounds_short)``, where a speculative server's
rounds are SGLang's ``spec_verify_ct`` (per request: the requests of a batch decode in the same rounds) and the
baseline's are its completion tokens (one decode step per token).

Memory at 8B, computed, with the suite's ``--mem-fraction-static 0.25`` on a 141 GB H200: the bf16 weights are
16.4 GB (target) plus 2.1 GB (drafter; it shares the target's embedding and LM head), and SGLang's KV pool gets what
is left of the static 35 GB (about 16 GB, some 100,000 tokens at 36 + 5 layers of 8 KV heads x 128).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_runtime.acceptance.hybrid import FULL_ATTENTION_INTERVAL, qwen36_layer_types
from ddtree_runtime.acceptance.launch import Server, ServerError
from ddtree_runtime.acceptance.measure import TimedCall, ratio, timed_call
from ddtree_runtime.reference.dflash import FULL, SLIDING, DFlashConfig
from ddtree_runtime.reference.qwen3 import Qwen3Config
from ddtree_runtime.sglang.config import MAX_DRAFT_TOKENS

ROUND_COST_TARGET = Qwen3Config(
    vocab_size=151_936,
    hidden_size=4096,
    intermediate_size=12_288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=40_960,
    tie_word_embeddings=False,
    eos_token_id=[151_645, 151_643],
)
"""Qwen3-8B's shape (``Qwen3ForCausalLM``, 8.2 B parameters)."""

DRAFTER_LAYERS = 5

ROUND_COST_DRAFTER = DFlashConfig(
    vocab_size=ROUND_COST_TARGET.vocab_size,
    hidden_size=ROUND_COST_TARGET.hidden_size,
    intermediate_size=ROUND_COST_TARGET.intermediate_size,
    num_hidden_layers=DRAFTER_LAYERS,
    num_attention_heads=ROUND_COST_TARGET.num_attention_heads,
    num_key_value_heads=ROUND_COST_TARGET.num_key_value_heads,
    head_dim=ROUND_COST_TARGET.head_dim,
    block_size=MAX_DRAFT_TOKENS,
    target_layer_ids=[1, 9, 17, 25, 33],
    mask_token_id=151_669,
    rms_norm_eps=ROUND_COST_TARGET.rms_norm_eps,
    rope_theta=ROUND_COST_TARGET.rope_theta,
    max_position_embeddings=ROUND_COST_TARGET.max_position_embeddings,
    layer_types=[FULL] * DRAFTER_LAYERS,
    num_target_layers=ROUND_COST_TARGET.num_hidden_layers,
)
"""z-lab's Qwen3-8B-DFlash-b16 shape: five full-attention layers of the target's width (1.0 B parameters with
``fc``), block 16, reading target layers 1, 9, 17, 25 and 33, ``<|MASK|>`` 151669."""

QWEN36_LAYERS = 64
QWEN36_VOCAB = 248_320

QWEN36_27B_TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": QWEN36_VOCAB,
    "hidden_size": 5120,
    "intermediate_size": 17_408,
    "num_hidden_layers": QWEN36_LAYERS,
    "layer_types": qwen36_layer_types(QWEN36_LAYERS),
    "full_attention_interval": FULL_ATTENTION_INTERVAL,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    "max_position_embeddings": 262_144,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "eos_token_id": [248_046, 248_044],
}
"""Qwen3.6-27B's text settings as the issue states them (not compared with the real ``config.json`` here: no
download): 64 layers, three Gated DeltaNet layers to one gated full-attention layer, hidden 5120, intermediate
17408, 24 heads / 4 KV heads of 256, GDN 16 key / 48 value heads of 128, conv 4, vocabulary 248,320, partial rotary
0.25 (about 27 B parameters)."""

QWEN36_27B_VISION_CONFIG: dict[str, Any] = {
    "depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "out_hidden_size": 5120,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
}
"""A small vision tower (one block): no request here carries an image; its output width is the text hidden size."""

QWEN36_VISION_TOKENS = {"image_token_id": 248_056, "video_token_id": 248_057, "vision_start_token_id": 248_053,
                        "vision_end_token_id": 248_054}

QWEN36_27B_DRAFTER = DFlashConfig(
    vocab_size=QWEN36_VOCAB,
    hidden_size=5120,
    intermediate_size=17_408,
    num_hidden_layers=DRAFTER_LAYERS,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    block_size=MAX_DRAFT_TOKENS,
    target_layer_ids=[1, 16, 31, 46, 61],
    mask_token_id=248_070,
    rms_norm_eps=1e-6,
    rope_theta=10_000_000.0,
    max_position_embeddings=262_144,
    layer_types=[SLIDING] * (DRAFTER_LAYERS - 1) + [FULL],
    sliding_window=2048,
    num_target_layers=QWEN36_LAYERS,
)
"""z-lab's Qwen3.6-27B-DFlash shape: five layers of width 5120 (32 heads / 8 KV heads of 128, intermediate 17408),
four sliding-window layers of 2048 then one full-attention layer, reading target layers 1, 16, 31, 46 and 61, block
16 (the mask token id is any id of the vocabulary here: the weights are random)."""

MODEL_DTYPE = "bfloat16"
"""``torch_dtype`` written into both configs (the servers get ``--dtype`` from the suite either way)."""

NO_TOKENIZER_FLAGS = ("--skip-tokenizer-init",)
"""The config-only models have no tokenizer (the real vocabularies are not shipped): SGLang must not load one.
Requests carry ``input_ids`` (:func:`round_cost_prompt`) and use no stop string or grammar, so nothing here needs
it. Every other server of the suite loads its model's tokenizer."""
RANDOM_TARGET_FLAGS = ("--load-format", "dummy", *NO_TOKENIZER_FLAGS)
"""SGLang fills the target's weights with random values instead of reading a checkpoint (and loads no tokenizer:
:data:`NO_TOKENIZER_FLAGS`)."""
RANDOM_PAIR_FLAGS = (*RANDOM_TARGET_FLAGS, "--speculative-draft-load-format", "dummy")
"""The same for the drafter (SGLang would otherwise take ``--load-format`` for it too; said explicitly here)."""
SYNC_FLAGS = ("--disable-overlap-schedule",)
"""A server without SGLang's overlap scheduler (the CPU then prepares a round only after the last one ended)."""

SHAPE_27B_FLAGS = ("--mem-fraction-static", "0.90", "--max-running-requests", "1", "--cuda-graph-max-bs-decode", "1",
                   "--context-length", "32768", "--mamba-ssm-dtype", "bfloat16", "--mamba-full-memory-ratio", "0.5",
                   "--mamba-radix-cache-strategy", "extra_buffer")
"""At 27B: the bf16 weights take about 58 GB (target 54, drafter 3.5 beyond the shared embedding and head), so the
static share is raised to what an 80 GB H100 needs (the same flags on an H200, so the figures compare across the
two). One running request and bfloat16 recurrent state: SGLang keeps a Gated DeltaNet state per verify token and
request (48 layers x 48 heads x 128 x 128, 75 MB in bfloat16, 151 MB in float32), 1.2 GB for DFLASH's 16 tokens and
4.9 GB for a budget-64 tree per request, so sixteen requests of a budget-64 tree (79 GB) fit no 80 GB card beside
the weights. The production unit's mamba radix settings; a 32k context keeps the verify-mask buffer small (the round
cost does not depend on it)."""

PROMPT_TOKENS = 128
WARM_UP_NEW_TOKENS = 16
SHORT_NEW_TOKENS = 64
LONG_NEW_TOKENS = 320
GREEDY_TO_LENGTH = {"temperature": 0.0, "ignore_eos": True}
"""Greedy, never stopping before ``max_new_tokens`` (random weights emit EOS ids like any other)."""


@dataclass(frozen=True)
class RoundCostShape:
    """One real-size model pair: its name in server names, directories, server flags and the batches measured."""

    name: str
    title: str
    vocab_size: int
    target_flags: tuple[str, ...]
    batches: tuple[int, ...]

    def dirs(self, root: Path) -> tuple[Path, Path]:
        return root / f"{self.name}-shape", root / f"{self.name}-shape-dflash"


SHAPE_8B = RoundCostShape("8b", "Qwen3-8B-shaped target, 5-layer drafter of its width", ROUND_COST_TARGET.vocab_size,
                          (), (1, 16))
SHAPE_27B = RoundCostShape("27b", "Qwen3.6-27B-shaped hybrid target, z-lab Qwen3.6-27B-DFlash-shaped drafter",
                           QWEN36_VOCAB, SHAPE_27B_FLAGS, (1,))
SHAPES = (SHAPE_8B, SHAPE_27B)


def round_cost_dirs(root: Path) -> tuple[Path, Path]:
    """Where the 8B target and the drafter configs go under ``root``."""
    return SHAPE_8B.dirs(root)


def target_config() -> dict[str, Any]:
    return {**ROUND_COST_TARGET.to_hf_dict(), "torch_dtype": MODEL_DTYPE}


def drafter_config() -> dict[str, Any]:
    return {**ROUND_COST_DRAFTER.to_dict(), "torch_dtype": MODEL_DTYPE}


def qwen36_27b_target_config() -> dict[str, Any]:
    """``config.json`` of a ``Qwen3_5ForConditionalGeneration`` of Qwen3.6-27B's shape, in the multimodal layout
    (text settings under ``text_config``), as transformers' ``Qwen3_5Config`` lays it out."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {**QWEN36_27B_TEXT_CONFIG, "model_type": "qwen3_5_text", "torch_dtype": MODEL_DTYPE},
        "vision_config": {**QWEN36_27B_VISION_CONFIG, "model_type": "qwen3_5_vision"},
        **QWEN36_VISION_TOKENS,
        "tie_word_embeddings": False,
        "torch_dtype": MODEL_DTYPE,
    }


def qwen36_27b_drafter_config() -> dict[str, Any]:
    return {**QWEN36_27B_DRAFTER.to_dict(), "torch_dtype": MODEL_DTYPE}


SHAPE_CONFIGS = {SHAPE_8B.name: (target_config, drafter_config),
                 SHAPE_27B.name: (qwen36_27b_target_config, qwen36_27b_drafter_config)}


def write_config_only(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def write_shape_pair(shape: RoundCostShape, root: Path) -> tuple[Path, Path]:
    """Both config-only model directories of ``shape`` under ``root`` (rewritten each time: two small files)."""
    target, drafter = shape.dirs(root)
    make_target, make_drafter = SHAPE_CONFIGS[shape.name]
    return write_config_only(target, make_target()), write_config_only(drafter, make_drafter())


def write_round_cost_pair(root: Path) -> tuple[Path, Path]:
    """The 8B pair under ``root``."""
    return write_shape_pair(SHAPE_8B, root)


def round_cost_prompt(seed: int = 0, vocab_size: int = ROUND_COST_TARGET.vocab_size) -> list[int]:
    """:data:`PROMPT_TOKENS` fixed random ids below ``vocab_size``."""
    rng = random.Random(seed)
    return [rng.randrange(vocab_size) for _unused in range(PROMPT_TOKENS)]


def round_cost_prompts(batch: int, vocab_size: int) -> list[list[int]]:
    """``batch`` different prompts (seeds 0..batch-1), so no request shares another's prefix cache."""
    return [round_cost_prompt(seed, vocab_size) for seed in range(batch)]


@dataclass(frozen=True)
class RoundCost:
    """The same prompts at two output lengths on one server; the difference is decode rounds only."""

    speculative: bool
    short: TimedCall
    long: TimedCall

    def decode_rounds(self, call: TimedCall) -> float:
        """Rounds per request: the requests of one call decode in the same rounds."""
        return (call.verify_rounds if self.speculative else call.tokens) / call.requests

    @property
    def rounds(self) -> float:
        return self.decode_rounds(self.long) - self.decode_rounds(self.short)

    @property
    def tokens(self) -> float:
        """New tokens per request between the two lengths."""
        return self.long.tokens / self.long.requests - self.short.tokens / self.short.requests

    @property
    def seconds(self) -> float:
        return self.long.seconds - self.short.seconds

    def problem(self) -> str | None:
        """Why the difference measures no round cost, or None."""
        for call, wanted in ((self.short, SHORT_NEW_TOKENS), (self.long, LONG_NEW_TOKENS)):
            if call.tokens != wanted * call.requests:
                return (f"asked for {wanted} new tokens with ignore_eos for each of {call.requests} request(s), "
                        f"got {call.tokens} in all")
        if self.rounds <= 0:
            return (f"decode rounds did not grow with the output ({self.decode_rounds(self.short):g} at "
                    f"{SHORT_NEW_TOKENS} tokens, {self.decode_rounds(self.long):g} at {LONG_NEW_TOKENS})")
        if self.seconds <= 0:
            return f"the longer output took no longer ({self.short.seconds:.3f} s, then {self.long.seconds:.3f} s)"
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.long.requests, "short": self.short.as_dict(), "long": self.long.as_dict(),
            "decode_rounds": round(self.rounds, 3), "decode_tokens": round(self.tokens, 3),
            "decode_seconds": round(self.seconds, 4),
            "ms_per_round": round(1000 * self.seconds / self.rounds, 3),
            "tokens_per_round": round(self.tokens / self.rounds, 3),
            "tokens_per_s": round(self.long.requests * self.tokens / self.seconds, 1),
        }


def measure_batch(server: Server, prompts: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Warm up, then the two lengths (:class:`RoundCost`) for ``prompts`` in one call each; raises
    :class:`ServerError` when they measure nothing."""
    timed_call(server, prompts, {**GREEDY_TO_LENGTH, "max_new_tokens": WARM_UP_NEW_TOKENS})
    short = timed_call(server, prompts, {**GREEDY_TO_LENGTH, "max_new_tokens": SHORT_NEW_TOKENS})
    long = timed_call(server, prompts, {**GREEDY_TO_LENGTH, "max_new_tokens": LONG_NEW_TOKENS})
    cost = RoundCost(speculative=server.spec.algorithm is not None, short=short, long=long)
    problem = cost.problem()
    if problem is not None:
        raise ServerError(f"{server.spec.name}: {problem}")
    return cost.as_dict()


def measure_round_cost(server: Server, shape: RoundCostShape = SHAPE_8B) -> dict[str, Any]:
    """``batch_<n>`` -> :func:`measure_batch`'s figures for every batch ``shape`` measures."""
    return {f"batch_{batch}": measure_batch(server, round_cost_prompts(batch, shape.vocab_size))
            for batch in shape.batches}


def is_reference(entry: Mapping[str, Any]) -> bool:
    """SGLang's DFLASH as it runs by default (overlap scheduling on): what every round is held against."""
    return entry.get("algorithm") == "DFLASH" and entry.get("overlap", True)


def round_cost_rows(table: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per server and batch, every ms per round against the default DFLASH's of the same shape and batch.
    ``table``: server name -> ``{"algorithm", "budget", "shape", "overlap", "batch_<n>": RoundCost.as_dict()}``."""
    references: dict[tuple[Any, str], float] = {}
    for entry in table.values():
        if is_reference(entry):
            for key, figures in entry.items():
                if key.startswith("batch_") and isinstance(figures, Mapping) and "ms_per_round" in figures:
                    references.setdefault((entry.get("shape"), key), float(figures["ms_per_round"]))
    rows = []
    for name, entry in table.items():
        for key, figures in entry.items():
            if not (key.startswith("batch_") and isinstance(figures, Mapping)):
                continue
            ms = figures.get("ms_per_round")
            reference = references.get((entry.get("shape"), key))
            rows.append({"server": name, "shape": entry.get("shape"), "algorithm": entry.get("algorithm"),
                         "budget": entry.get("budget"), "overlap": entry.get("overlap", True),
                         "batch": int(key.removeprefix("batch_")), "ms_per_round": ms,
                         "tokens_per_round": figures.get("tokens_per_round"),
                         "tokens_per_s": figures.get("tokens_per_s"),
                         "vs_dflash_ms_per_round": None if is_reference(entry) else ratio(ms, reference)})
    return rows
