# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The DDTree plugin's own rules, loaded from the bundled ddtree_runtime source on the controller.

``ddtree_runtime.sglang.config`` (draft length, budget, top-k) and ``ddtree_runtime.model_layout`` (what a target and
drafter config must say) are plain Python without torch or SGLang. The playbooks judge inputs and model configs with
exactly these modules, loaded by path from the collection's ``ddtree_runtime/`` tree (the source the release installs),
so no second copy of a range or a layout rule exists.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

COLLECTION_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = COLLECTION_ROOT / "ddtree_runtime" / "ddtree_runtime"


@cache
def _load(relative: str, name: str) -> ModuleType:
    path = PACKAGE_DIR / relative
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}: the collection's bundled ddtree_runtime source is missing")
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class body runs
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def settings_module() -> ModuleType:
    """``ddtree_runtime.sglang.config``: ``resolve_settings``, ``DDTreeConfigError``, ``MAX_DRAFT_TOKENS``..."""
    return _load("sglang/config.py", "pivot_ddtree_settings")


def layout_module() -> ModuleType:
    """``ddtree_runtime.model_layout``: ``text_settings``, ``drafter_target_layer_ids``, ``capture_problem``..."""
    return _load("model_layout.py", "pivot_ddtree_model_layout")


def _settings_refusal(draft_tokens: object, environ: dict[str, str]) -> str | None:
    config = settings_module()
    try:
        draft = int(str(draft_tokens))
    except ValueError:
        return f"--speculative-num-draft-tokens must be an integer, got {draft_tokens!r}"
    try:
        config.resolve_settings(draft, environ)
    except config.DDTreeConfigError as error:
        return str(error)
    return None


def settings_problems(draft_tokens: object, budget: object, topk: object) -> list[str]:
    """Every reason the plugin would refuse this draft length / budget / top-k, in its own words: each value judged
    on its own (beside the plugin's defaults for the others), then together; empty when it serves them."""
    config = settings_module()
    alone = [_settings_refusal(draft_tokens, {}),
             _settings_refusal(config.MAX_DRAFT_TOKENS, {config.ENV_BUDGET: str(budget)}),
             _settings_refusal(config.MAX_DRAFT_TOKENS, {config.ENV_TOPK: str(topk)})]
    problems = [problem for problem in alone if problem]
    if problems:
        return problems
    together = _settings_refusal(draft_tokens, {config.ENV_BUDGET: str(budget), config.ENV_TOPK: str(topk)})
    return [together] if together else []


def _served_settings(draft_tokens: object, budget: object, topk: object) -> Any:
    """The plugin's resolved settings for values it serves (:func:`settings_problem` said nothing)."""
    config = settings_module()
    return config.resolve_settings(int(str(draft_tokens)), {config.ENV_BUDGET: str(budget), config.ENV_TOPK: str(topk)})


def settings_problem(draft_tokens: object, budget: object, topk: object) -> str | None:
    """Why the plugin would refuse this draft length / budget / top-k, in its own words (every reason, joined); None
    when it serves them."""
    problems = settings_problems(draft_tokens, budget, topk)
    return "; ".join(problems) if problems else None


def mamba_tracking_problem(draft_tokens: object, budget: object, topk: object,
                           server_flags: Mapping[str, object]) -> str | None:
    """Why the plugin would refuse these settings with a hybrid target's mamba cache flags (SGLang 0.5.23 names,
    without the leading ``--``), with the fix; None when it serves them or the settings themselves are refused."""
    config = settings_module()
    if settings_problem(draft_tokens, budget, topk) is not None:
        return None
    settings = _served_settings(draft_tokens, budget, topk)
    interval = server_flags.get("mamba-track-interval")
    try:
        track = None if interval is None else int(str(interval))
    except ValueError:
        return f"mamba-track-interval must be an integer, got {interval!r}"
    strategy = server_flags.get("mamba-radix-cache-strategy")
    return config.mamba_tracking_problem(settings, None if strategy is None else str(strategy), track)


def required_flags(server_flags: Mapping[str, object], draft_tokens: object, budget: object,
                   topk: object) -> dict[str, object]:
    """The flags (SGLang 0.5.23 names, without the leading ``--``) the plugin would set on a DDTREE server started with
    ``server_flags`` (``ddtree_runtime.sglang.config.required_server_args``): the release's unit states them, so that
    ``systemctl cat`` shows what serves. Raises ValueError when the plugin would refuse the settings."""
    config = settings_module()
    problem = settings_problem(draft_tokens, budget, topk)
    if problem is not None:
        raise ValueError(problem)
    settings = _served_settings(draft_tokens, budget, topk)
    given = {field: _flag_value(server_flags.get(field.replace("_", "-")))
             for field in config.REQUIRED_SERVER_ARG_FIELDS}
    required = config.required_server_args(given, settings)
    return {field.replace("_", "-"): value for field, value in required.items()}


def _flag_value(value: object) -> object:
    """A flag's value as SGLang's parser would hold it: integers as int (Jinja hands them over as text)."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value)
    return int(text) if text.lstrip("-").isdigit() else text
