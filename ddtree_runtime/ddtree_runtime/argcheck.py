"""Validate a server command line with the argument parser of the module that will run it.

``python -m ddtree_runtime.argcheck --launch-module MODULE -- ARGS...`` exits 0 and prints a JSON summary when
``python -m MODULE ARGS...`` would accept ``ARGS``, and exits 2 with the parser's own message otherwise. For
``sglang.launch_server`` it loads SGLang's plugins first (so ``--speculative-algorithm DDTREE`` resolves through
ddtree_runtime's entry point) and runs ``prepare_server_args``, which is what the server itself does at start;
for the lab's ``ddtree_runtime.labserver`` it runs that server's parser. Nothing is loaded onto a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

SGLANG_MODULES = ("sglang.launch_server",)
LAB_MODULE = "ddtree_runtime.labserver"


def check_sglang(server_args: Sequence[str]) -> dict[str, Any]:
    from sglang.srt.plugins import load_plugins  # noqa: PLC0415 - SGLang is only on serving hosts
    from sglang.srt.server_args import prepare_server_args  # noqa: PLC0415
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: PLC0415

    load_plugins()
    parsed = prepare_server_args(list(server_args))
    algorithm = getattr(parsed, "speculative_algorithm", None)
    if algorithm:
        SpeculativeAlgorithm.from_string(algorithm)
    return {"model_path": parsed.model_path, "speculative_algorithm": algorithm, "port": parsed.port}


def check_labserver(server_args: Sequence[str]) -> dict[str, Any]:
    from ddtree_runtime.labserver.cli import parse_args  # noqa: PLC0415

    parsed = parse_args(list(server_args))
    return {"model_path": parsed.model_path, "speculative_algorithm": parsed.speculative_algorithm,
            "port": parsed.port}


def checker_for(launch_module: str) -> Callable[[Sequence[str]], dict[str, Any]]:
    if launch_module in SGLANG_MODULES:
        return check_sglang
    if launch_module == LAB_MODULE:
        return check_labserver
    known = ", ".join((*SGLANG_MODULES, LAB_MODULE))
    raise SystemExit(f"argcheck: no parser known for launch module {launch_module!r} (known: {known})")


def main(argv: Sequence[str] | None = None) -> int:
    summary = (__doc__ or "").split("\n\n", maxsplit=1)[0]
    parser = argparse.ArgumentParser(prog="python -m ddtree_runtime.argcheck", description=summary)
    parser.add_argument("--launch-module", required=True, help="the module the unit runs with python -m")
    parser.add_argument("server_args", nargs=argparse.REMAINDER, help="the server's arguments, after --")
    options = parser.parse_args(argv)
    server_args = options.server_args[1:] if options.server_args[:1] == ["--"] else options.server_args
    summary = checker_for(options.launch_module)(server_args)
    print(json.dumps({"launch_module": options.launch_module, "ok": True, **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
