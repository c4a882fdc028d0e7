"""Round cost at real size: milliseconds per decode round of a Qwen3-8B-shaped target with a 1B-shaped drafter.

The models are config-only directories (``config.json``, no weights, no tokenizer; nothing is downloaded): the
target has Qwen3-8B's shape (:data:`ROUND_COST_TARGET`), the drafter the shape of z-lab's Qwen3-8B-DFlash-b16 (five
decoder layers of the target's width, :data:`ROUND_COST_DRAFTER`). Servers load them with random weights and without a
tokenizer (:data:`RANDOM_TARGET_FLAGS`, :data:`RANDOM_PAIR_FLAGS`): the acceptance length they reach says nothing, the
time a round takes is the figure.

Each server, once started, answers one warm-up request and then the same prompt (:func:`round_cost_prompt`, batch 1,
greedy, ``ignore_eos``) at two output lengths. The difference between the two removes the prefill, so
``ms per round = 1000 * (seconds_long - seconds_short) / (rounds_long - rounds_short)``, where a speculative server's
rounds are SGLang's ``spec_verify_ct`` and the baseline's are its completion tokens (one decode step per token).

Memory, computed (not yet seen on a GPU), with the suite's ``--mem-fraction-static 0.25`` on a 141 GB H200: the bf16
weights are 16.4 GB (target) plus 2.1 GB (drafter; it shares the target's embedding and LM head), and SGLang's KV
pool gets what is left of the static 35 GB (about 16 GB, some 100,000 tokens at 36 + 5 layers of 8 KV heads x 128),
so the suite's flags are kept.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_runtime.acceptance.launch import Server, ServerError
from ddtree_runtime.acceptance.measure import TimedCall, figure_of, ratio, timed_call
from ddtree_runtime.reference.dflash import FULL, DFlashConfig
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

MODEL_DTYPE = "bfloat16"
"""``torch_dtype`` written into both configs (the servers get ``--dtype`` from the suite either way)."""

NO_TOKENIZER_FLAGS = ("--skip-tokenizer-init",)
"""The config-only models have no tokenizer (Qwen3-8B's vocabulary of 151,936 is not shipped): SGLang must not load
one. Requests carry ``input_ids`` (:func:`round_cost_prompt`) and use no stop string or grammar, so nothing here
needs it. Every other server of the suite loads its model's tokenizer."""
RANDOM_TARGET_FLAGS = ("--load-format", "dummy", *NO_TOKENIZER_FLAGS)
"""SGLang fills the target's weights with random values instead of reading a checkpoint (and loads no tokenizer:
:data:`NO_TOKENIZER_FLAGS`)."""
RANDOM_PAIR_FLAGS = (*RANDOM_TARGET_FLAGS, "--speculative-draft-load-format", "dummy")
"""The same for the drafter (SGLang would otherwise take ``--load-format`` for it too; said explicitly here)."""

PROMPT_TOKENS = 128
WARM_UP_NEW_TOKENS = 16
SHORT_NEW_TOKENS = 64
LONG_NEW_TOKENS = 320
GREEDY_TO_LENGTH = {"temperature": 0.0, "ignore_eos": True}
"""Greedy, never stopping before ``max_new_tokens`` (random weights emit EOS ids like any other)."""


def round_cost_dirs(root: Path) -> tuple[Path, Path]:
    """Where the target and the drafter configs go under ``root``."""
    return root / "qwen3-8b-shape", root / "qwen3-8b-shape-dflash"


def target_config() -> dict[str, Any]:
    return {**ROUND_COST_TARGET.to_hf_dict(), "torch_dtype": MODEL_DTYPE}


def drafter_config() -> dict[str, Any]:
    return {**ROUND_COST_DRAFTER.to_dict(), "torch_dtype": MODEL_DTYPE}


def write_config_only(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def write_round_cost_pair(root: Path) -> tuple[Path, Path]:
    """Both config-only model directories under ``root`` (rewritten each time: they are two small files)."""
    target, drafter = round_cost_dirs(root)
    return write_config_only(target, target_config()), write_config_only(drafter, drafter_config())


def round_cost_prompt(seed: int = 0) -> list[int]:
    """:data:`PROMPT_TOKENS` fixed random ids below the target's vocabulary size."""
    rng = random.Random(seed)
    return [rng.randrange(ROUND_COST_TARGET.vocab_size) for _unused in range(PROMPT_TOKENS)]


@dataclass(frozen=True)
class RoundCost:
    """The same prompt at two output lengths on one server; the difference is decode rounds only."""

    speculative: bool
    short: TimedCall
    long: TimedCall

    def decode_rounds(self, call: TimedCall) -> int:
        return call.verify_rounds if self.speculative else call.tokens

    @property
    def rounds(self) -> int:
        return self.decode_rounds(self.long) - self.decode_rounds(self.short)

    @property
    def tokens(self) -> int:
        return self.long.tokens - self.short.tokens

    @property
    def seconds(self) -> float:
        return self.long.seconds - self.short.seconds

    def problem(self) -> str | None:
        """Why the difference measures no round cost, or None."""
        for call, wanted in ((self.short, SHORT_NEW_TOKENS), (self.long, LONG_NEW_TOKENS)):
            if call.tokens != wanted:
                return f"asked for {wanted} new tokens with ignore_eos, got {call.tokens}"
        if self.rounds <= 0:
            return (f"decode rounds did not grow with the output ({self.decode_rounds(self.short)} at "
                    f"{SHORT_NEW_TOKENS} tokens, {self.decode_rounds(self.long)} at {LONG_NEW_TOKENS})")
        if self.seconds <= 0:
            return f"the longer output took no longer ({self.short.seconds:.3f} s, then {self.long.seconds:.3f} s)"
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "short": self.short.as_dict(), "long": self.long.as_dict(),
            "decode_rounds": self.rounds, "decode_tokens": self.tokens, "decode_seconds": round(self.seconds, 4),
            "ms_per_round": round(1000 * self.seconds / self.rounds, 3),
            "tokens_per_round": round(self.tokens / self.rounds, 3),
            "tokens_per_s": round(self.tokens / self.seconds, 1),
        }


def measure_round_cost(server: Server) -> dict[str, Any]:
    """Warm up, then the two lengths (:class:`RoundCost`); raises :class:`ServerError` when they measure nothing."""
    prompt = [round_cost_prompt()]
    timed_call(server, prompt, {**GREEDY_TO_LENGTH, "max_new_tokens": WARM_UP_NEW_TOKENS})
    short = timed_call(server, prompt, {**GREEDY_TO_LENGTH, "max_new_tokens": SHORT_NEW_TOKENS})
    long = timed_call(server, prompt, {**GREEDY_TO_LENGTH, "max_new_tokens": LONG_NEW_TOKENS})
    cost = RoundCost(speculative=server.spec.algorithm is not None, short=short, long=long)
    problem = cost.problem()
    if problem is not None:
        raise ServerError(f"{server.spec.name}: {problem}")
    return cost.as_dict()


def round_cost_rows(table: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per server, DDTREE's ms per round against DFLASH's. ``table``: server name -> ``{"algorithm",
    "budget", **RoundCost.as_dict()}``."""
    dflash = figure_of(table, "DFLASH", ("ms_per_round",))
    return [{"server": name, "algorithm": entry.get("algorithm"), "budget": entry.get("budget"),
             "ms_per_round": entry.get("ms_per_round"), "tokens_per_round": entry.get("tokens_per_round"),
             "tokens_per_s": entry.get("tokens_per_s"),
             "ddtree_vs_dflash_ms_per_round": ratio(entry.get("ms_per_round"), dflash)
             if entry.get("algorithm") == "DDTREE" else None}
            for name, entry in table.items()]
