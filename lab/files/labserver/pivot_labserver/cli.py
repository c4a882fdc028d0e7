"""SGLang-compatible command line for the lab server.

Accepts the production flags of ``sglang.launch_server`` 0.5.23 that Pivot renders (full names; argparse's
prefix abbreviations work as in SGLang) and rejects anything else with argparse's usage error (exit 2).
DDTree tree knobs are not stock SGLang flags, so they come from the environment:

- ``DDTREE_BUDGET``: tree node budget (non-root nodes); default ``speculative_num_draft_tokens - 1``.
- ``DDTREE_TOPK``: per-depth top-k cap; default unset (the paper's ``min(budget, vocab)``).

The DDTree draft depth is ``speculative_num_draft_tokens - 1`` (the DFlash verify block minus the bonus).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

SPECULATIVE_ALGORITHMS = ("DDTREE", "DFLASH", "NEXTN", "EAGLE", "EAGLE3")
MAMBA_RADIX_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pivot_labserver",
        description="The lab's stand-in for SGLang's server: SGLang's HTTP surface over the reference engine.",
    )
    p.add_argument("--model-path", required=True)
    p.add_argument("--tokenizer-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tp", type=int, default=1, dest="tp_size")
    p.add_argument("--mem-fraction-static", type=float, default=0.88)
    p.add_argument("--context-length", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--mamba-full-memory-ratio", type=float)
    p.add_argument("--mamba-radix-cache-strategy", choices=MAMBA_RADIX_STRATEGIES)
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--speculative-algorithm", choices=SPECULATIVE_ALGORITHMS)
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path")
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--api-key")
    p.add_argument("--served-model-name")
    p.add_argument("--attention-backend")
    p.add_argument("--speculative-draft-attention-backend")
    p.add_argument("--linear-attn-verify-backend")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--cuda-graph-max-bs-decode", type=int)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float64", "bfloat16", "float16"))
    p.add_argument("--device", default="auto")
    p.add_argument("--random-seed", type=int)
    return p


@dataclass(frozen=True)
class TreeKnobs:
    budget: int | None
    topk: int | None


def _positive_env_int(env: dict[str, str] | os._Environ[str], name: str, minimum: int) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def tree_knobs_from_env(env: dict[str, str] | os._Environ[str] | None = None) -> TreeKnobs:
    env = os.environ if env is None else env
    return TreeKnobs(budget=_positive_env_int(env, "DDTREE_BUDGET", 0), topk=_positive_env_int(env, "DDTREE_TOPK", 1))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tp_size < 1:
        parser.error("--tp-size must be >= 1")
    if not 0 < args.mem_fraction_static <= 1:
        parser.error("--mem-fraction-static must be in (0, 1]")
    if args.speculative_algorithm in ("DDTREE", "DFLASH") and not args.speculative_draft_model_path:
        parser.error(f"--speculative-algorithm {args.speculative_algorithm} needs --speculative-draft-model-path")
    if args.speculative_num_draft_tokens is not None and args.speculative_num_draft_tokens < 1:
        parser.error("--speculative-num-draft-tokens must be >= 1")
    try:
        tree_knobs_from_env()
    except ValueError as error:
        parser.error(str(error))
    return args


def reported_algorithm(algorithm: str | None) -> str | None:
    """What SGLang reports in ``/server_info``: NEXTN is an alias that resolves to EAGLE."""
    return "EAGLE" if algorithm == "NEXTN" else algorithm
