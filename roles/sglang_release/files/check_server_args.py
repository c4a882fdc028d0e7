"""Check a server command line with the SGLang of the venv that will run it; run it with that venv's python.

    python check_server_args.py MODULE [ARGS...]

Does what ``python -m MODULE ARGS`` does before it loads a model: load SGLang's plugins (releases that have a plugin
system; ``SGLANG_PLUGINS`` from the environment selects them), parse the arguments with
``sglang.srt.server_args.prepare_server_args``, resolve the speculative algorithm and, for an algorithm a plugin
registered, run that plugin's server-args check the way SGLang's resolution does (``record_foreign_defaults``). The
rest of SGLang's resolution needs the GPU the server will use and is left to the start. Prints one JSON line
(``sglang_version``, ``speculative_algorithm``, ``plugins``: the names of the general plugins SGLang loaded, None for a
release without a plugin system; ``plugin_distributions``: each one's distribution) and exits 0 when the server would
accept the command line; exits 2 with SGLang's own message otherwise, 3 when MODULE is not SGLang's launcher. Standard
library only besides SGLang, so it runs in any SGLang venv without installing anything there.

Which plugins load is SGLang's own selection (``sglang.srt.plugins.load_plugins_by_group``: the installed entry points,
restricted by a non-empty ``SGLANG_PLUGINS``), read as ``load_plugins`` calls it. A release whose plugin system has no
such function is reported with every installed entry point of the group: more than it may load, never fewer.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import sys
from typing import Any

LAUNCHERS = ("sglang.launch_server",)


GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"


def load_plugins() -> dict[str, str | None] | None:
    """Load SGLang's plugins as the server does; the general ones it loaded, by name with their distribution."""
    # SGLang's own import first, so that its failure (a missing dependency) is reported as itself; swallowed here, it
    # left a half-imported package behind, and the next import died of "KeyError: 'sglang'" (seen with 0.5.11)
    importlib.import_module("sglang.srt")
    if importlib.util.find_spec("sglang.srt.plugins") is None:  # SGLang < 0.5.12 has no plugin system
        return None
    registry = importlib.import_module("sglang.srt.plugins")
    loaded: dict[str, str | None] = {}
    select = getattr(registry, "load_plugins_by_group", None)
    if not callable(select):
        registry.load_plugins()
        return {ep.name: ep.dist.name if ep.dist else None
                for ep in importlib.metadata.entry_points(group=GENERAL_PLUGINS_GROUP)}

    def recording(group: str, *args: Any, **kwargs: Any) -> Any:
        found = select(group, *args, **kwargs)
        if group == GENERAL_PLUGINS_GROUP:
            loaded.update({name: dist for name, (_func, dist) in found.items()})
        return found

    registry.load_plugins_by_group = recording
    try:
        registry.load_plugins()
    finally:
        registry.load_plugins_by_group = select
    return loaded


def run_plugin_validation(algorithm: Any, parsed: Any) -> None:
    validate = getattr(algorithm, "validate_server_args", None)
    if not callable(validate):
        return
    try:
        from sglang.srt.arg_groups.overrides import record_foreign_defaults  # noqa: PLC0415 - SGLang 0.5.2x
    except ImportError:
        validate(parsed)
    else:
        record_foreign_defaults(parsed, "pivot.check_server_args", validate)


def check(module: str, args: list[str]) -> dict[str, Any]:
    if module not in LAUNCHERS:
        print(f"cannot check a command line for {module!r}: only {', '.join(LAUNCHERS)} is known", file=sys.stderr)
        raise SystemExit(3)
    plugins = load_plugins()
    from sglang.srt.server_args import prepare_server_args  # noqa: PLC0415

    parsed = prepare_server_args(args)
    algorithm = getattr(parsed, "speculative_algorithm", None)
    if algorithm:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: PLC0415

        run_plugin_validation(SpeculativeAlgorithm.from_string(algorithm), parsed)
    return {"ok": True, "sglang_version": importlib.metadata.version("sglang"), "speculative_algorithm": algorithm,
            "plugins": None if plugins is None else sorted(plugins), "plugin_distributions": plugins}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 3
    try:
        result = check(argv[0], argv[1:])
    except SystemExit as stop:  # argparse has printed its usage and message
        return stop.code if isinstance(stop.code, int) and stop.code != 0 else 2
    except Exception as error:  # the server would die with this at start
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
