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
from functools import cache
from pathlib import Path
from types import ModuleType

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


def settings_problem(draft_tokens: object, budget: object, topk: object) -> str | None:
    """Why the plugin would refuse this draft length / budget / top-k, in its own words; None when it serves them."""
    config = settings_module()
    environ = {config.ENV_BUDGET: str(budget), config.ENV_TOPK: str(topk)}
    try:
        draft = int(str(draft_tokens))
    except ValueError:
        return f"--speculative-num-draft-tokens must be an integer, got {draft_tokens!r}"
    try:
        config.resolve_settings(draft, environ)
    except config.DDTreeConfigError as error:
        return str(error)
    return None
