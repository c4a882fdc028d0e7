"""``load_plugins`` of the stand-in (built into 0.5.23 only; 0.5.11 has no plugin system).

Discovery is SGLang's: every entry point of the group ``sglang.srt.plugins`` installed in this venv, restricted to the
names in ``SGLANG_PLUGINS`` when that is set, so a venv without ddtree_runtime never knows DDTREE. The registration
itself is emulated: ddtree_runtime's ``register()`` hooks real SGLang internals the stand-in does not have, so for its
entry point the stand-in registers ``DDTREE`` with the plugin's own rules (``ddtree_runtime.sglang.config``'s settings
resolver, ``ddtree_runtime.model_layout``'s pair check). Any other plugin is loaded and called as SGLang does.
"""

from __future__ import annotations

import argparse
import logging
import os
from importlib.metadata import entry_points

from sglang.srt.speculative.spec_info import register_algorithm

GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
DDTREE_ENTRY_POINT = "ddtree_runtime.sglang:register"

logger = logging.getLogger(__name__)
_loaded: list[str] = []


def _validate_ddtree(args: argparse.Namespace) -> None:
    from ddtree_runtime.model_layout import pair_problem  # noqa: PLC0415 - the plugin's own rules
    from ddtree_runtime.sglang.config import resolve_settings  # noqa: PLC0415

    def refuse(message: str) -> None:
        raise ValueError(f"--speculative-algorithm DDTREE: {message}")

    try:
        resolve_settings(args.speculative_num_draft_tokens)
    except ValueError as error:
        refuse(str(error))
    if not args.speculative_draft_model_path:
        refuse("needs --speculative-draft-model-path (the DFlash drafter)")
    problem = pair_problem(args.model_path, args.speculative_draft_model_path)
    if problem is not None:
        refuse(problem)


def load_plugins() -> list[str]:
    """Load the selected plugins once per process; returns the names loaded."""
    if _loaded:
        return list(_loaded)
    allowed = {name.strip() for name in os.environ.get("SGLANG_PLUGINS", "").split(",") if name.strip()} or None
    for ep in entry_points(group=GENERAL_PLUGINS_GROUP):
        if allowed is not None and ep.name not in allowed:
            logger.info("Skipping plugin %s (not in SGLANG_PLUGINS)", ep.name)
            continue
        if ep.value == DDTREE_ENTRY_POINT:
            register_algorithm("DDTREE", _validate_ddtree)
        else:
            ep.load()()
        logger.info("Loaded plugin %s -> %s", ep.name, ep.value)
        _loaded.append(ep.name)
    return list(_loaded)
