"""Paths and helpers shared by the SGLang contract tests (a uniquely named module: tests/ has several conftests)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SGLANG_VENV = REPO / ".venv-sglang"
PROBE = Path(__file__).with_name("sglang_probe.py")

ProbeRunner = Callable[..., dict[str, Any]]


def probe_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The controller's environment without DDTREE_/SGLANG_ settings, plus the plugin selection and ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DDTREE_", "SGLANG_"))}
    env.update({"SGLANG_PLUGINS": "ddtree", "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"})
    env.update(extra or {})
    return env
