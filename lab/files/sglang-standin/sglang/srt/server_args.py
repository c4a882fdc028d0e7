"""``prepare_server_args`` of the stand-in: the command line of the SGLang release this build stands in for.

Each release accepts the flags Pivot renders and the user's NEXTN unit uses, under that release's names, and refuses
the others with argparse's usage error (exit 2), as SGLang's own parser does:

- 0.5.11 (the user's venv before the first pivot): ``--mamba-scheduler-strategy``, ``--cuda-graph-max-bs``; no plugin
  system, so no DDTREE.
- 0.5.23 (what the DDTree release installs): ``--mamba-radix-cache-strategy`` replaced ``--mamba-scheduler-strategy``
  (0.5.20), ``--cuda-graph-max-bs-decode``/``-prefill``; plugins register further speculative algorithms.

``--config FILE.yaml`` is merged as SGLang merges it: each key becomes ``--KEY VALUE`` ahead of the command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm, validate_registered
from sglang.version import __version__


@dataclass(frozen=True)
class Release:
    mamba_strategy_flag: str
    mamba_strategies: tuple[str, ...]
    cuda_graph_flags: tuple[str, ...]
    has_plugins: bool
    # --mamba-track-interval with this release's default (SGLang 0.5.23: 256); None where the stand-in lacks the flag
    mamba_track_interval: int | None = None


RELEASES = {
    "0.5.11": Release("--mamba-scheduler-strategy", ("auto", "no_buffer", "extra_buffer"), ("--cuda-graph-max-bs",),
                      has_plugins=False),
    "0.5.23": Release("--mamba-radix-cache-strategy", ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"),
                      ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"), has_plugins=True,
                      mamba_track_interval=256),
}
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def release() -> Release:
    return RELEASES[__version__]


def build_parser() -> argparse.ArgumentParser:
    rel = release()
    p = argparse.ArgumentParser(prog="sglang serve")
    p.add_argument("--config")
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tp", type=int, default=1, dest="tp_size")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--mamba-full-memory-ratio", type=float)
    p.add_argument(rel.mamba_strategy_flag, choices=rel.mamba_strategies)
    if rel.mamba_track_interval is not None:
        p.add_argument("--mamba-track-interval", type=int, default=rel.mamba_track_interval)
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--speculative-algorithm", type=str.upper)
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
    p.add_argument("--page-size", type=int)
    for flag in rel.cuda_graph_flags:
        p.add_argument(flag, type=int)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device")
    p.add_argument("--random-seed", type=int)
    return p


def merge_config(argv: list[str]) -> list[str]:
    """SGLang's ``--config`` merge: the file's keys as ``--KEY VALUE`` first, then the command line without it."""
    if "--config" not in argv:
        return argv
    at = argv.index("--config")
    if at == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[at + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {path}")
    import yaml  # noqa: PLC0415 - only --config needs it

    data: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    merged: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            merged += [f"--{key}"] if value else []
        else:
            merged += [f"--{key}", str(value)]
    return merged + argv[:at] + argv[at + 2:]


def prepare_server_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and check a server command line the way this SGLang release does before it loads anything."""
    parser = build_parser()
    try:
        merged = merge_config(list(argv))
    except ValueError as error:
        parser.error(str(error))
    args = parser.parse_args(merged)
    args.version = __version__
    if args.speculative_algorithm is not None:
        SpeculativeAlgorithm.from_string(args.speculative_algorithm)
        validate_registered(args)
    return args
