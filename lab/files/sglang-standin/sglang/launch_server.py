"""``python -m sglang.launch_server ARGS``: SGLang's start sequence, then the reference engine behind SGLang's API.

As SGLang does: load the selected plugins (releases with a plugin system), parse and check the command line (exit 2
with the parser's message, or the plugin's refusal as a traceback), then serve. Serving is the lab's server
(``pivot_labserver``, installed beside this stand-in) with the checked settings; it reports this release's version.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from sglang.srt.server_args import prepare_server_args, release
from sglang.version import __version__

VERSION_ENV = "DDTREE_LAB_SGLANG_VERSION"


def labserver_argv(args: argparse.Namespace) -> list[str]:
    """The lab server's command line for the checked settings: every value it has a flag for and that is set."""
    from pivot_labserver.cli import build_parser  # noqa: PLC0415 - the lab's server, installed beside this stand-in

    argv: list[str] = []
    for action in build_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value is None or value is False:
            continue
        flag = max(action.option_strings, key=len)
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    if release().has_plugins:
        from sglang.srt.plugins import load_plugins  # noqa: PLC0415 - not built into releases without plugins

        load_plugins()
    args = prepare_server_args(list(sys.argv[1:] if argv is None else argv))
    from pivot_labserver.server import main as serve  # noqa: PLC0415

    os.environ[VERSION_ENV] = __version__
    return serve(labserver_argv(args))


if __name__ == "__main__":
    sys.exit(main())
