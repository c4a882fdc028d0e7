"""``load_plugins`` of the stand-in (built into 0.5.23 only; 0.5.11 has no plugin system).

Shaped as SGLang 0.5.23's ``sglang.srt.plugins``: ``load_plugins_by_group(group)`` discovers every entry point of the
group installed in this venv, restricted to the names in ``SGLANG_PLUGINS`` when that is not empty (an empty value
restricts nothing; ``","`` selects none), and returns ``{name: (callable, distribution)}``; ``load_plugins()`` calls
each once per process and returns None. So a venv without ddtree_runtime never knows DDTREE, and one with it loads it
unless ``SGLANG_PLUGINS`` leaves it out. The registration itself is emulated: ddtree_runtime's ``register()`` hooks real
SGLang internals the stand-in does not have, so for its entry point the stand-in registers ``DDTREE`` with the plugin's
own server-args rules (``ddtree_runtime.sglang.server_args_rules.validate_server_args``, which SGLang runs through the
registration). Any other plugin is loaded and called as SGLang does.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from sglang.srt.speculative.spec_info import register_algorithm

GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
DDTREE_ENTRY_POINT = "ddtree_runtime.sglang:register"

logger = logging.getLogger(__name__)
_loaded = False


def _validate_ddtree(args: argparse.Namespace) -> None:
    """The plugin's own server-args rules, the function SGLang's resolution runs through the registration."""
    from ddtree_runtime.sglang.server_args_rules import validate_server_args  # noqa: PLC0415 - in the release venv

    validate_server_args(args)


def _register_ddtree() -> None:
    register_algorithm("DDTREE", _validate_ddtree)


def load_plugins_by_group(group: str) -> dict[str, tuple[Callable[[], Any], str | None]]:
    """The selected plugins of ``group``, loaded (not yet called): ``{name: (callable, distribution name)}``."""
    selection = os.environ.get("SGLANG_PLUGINS", "")
    allowed = {name.strip() for name in selection.split(",") if name.strip()} if selection else None
    plugins: dict[str, tuple[Callable[[], Any], str | None]] = {}
    for ep in entry_points(group=group):
        if allowed is not None and ep.name not in allowed:
            logger.info("Skipping plugin %s (not in SGLANG_PLUGINS)", ep.name)
            continue
        func = _register_ddtree if ep.value == DDTREE_ENTRY_POINT else ep.load()
        plugins[ep.name] = (func, ep.dist.name if ep.dist else None)
        logger.info("Loaded plugin %s from group %s", ep.name, group)
    return plugins


def load_plugins() -> None:
    """Load and call the selected general plugins, once per process."""
    global _loaded  # noqa: PLW0603 - once per process, as SGLang's guard
    if _loaded:
        return
    _loaded = True
    for func, _dist in load_plugins_by_group(GENERAL_PLUGINS_GROUP).values():
        func()
