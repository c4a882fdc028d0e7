"""Test equipment: an ``ansible-playbook`` the tests start loads each connection plugin once, before it forks.

Ansible forks a worker per task and host, and the worker loads the host's connection plugin. For ``ct200`` that is
``community.proxmox.proxmox_pct_remote``, whose ``import paramiko`` (with ``invoke``, ``asyncio``, ``unittest.mock``)
and documentation parse cost every worker about 80 ms of CPU, for ``set_fact`` as much as for a module run. Loaded
once in the parent, the workers inherit it. Only the parent's first task for a host with a given connection pays, so a
play on ``localhost`` alone never imports paramiko. ``sitecustomize`` installs this in Ansible's command-line processes;
a production controller never loads it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

STRATEGY_MODULE = "ansible.plugins.strategy"


def preload_connection(name: object, loaded: set[str], load: Callable[[str], object]) -> None:
    """Load connection plugin NAME with LOAD unless it was loaded already; a name that is not a plain string
    (a template the worker resolves) or a plugin that fails to load is left to the worker, as without this."""
    if not isinstance(name, str) or not name or "{" in name or name in loaded:
        return
    loaded.add(name)
    try:
        load(name)
    except Exception:  # the worker loads it again and reports what is wrong
        return


def _load_with_ansible(name: str) -> object:
    from ansible.plugins.loader import connection_loader  # noqa: PLC0415 - only once Ansible is imported

    return connection_loader.get(name, class_only=True)


def patch_strategy(strategy_base: type, load: Callable[[str], object] = _load_with_ansible) -> bool:
    """Wrap STRATEGY_BASE._queue_task (which runs in the parent) to preload the task's connection plugin first.
    False when the method is not there (another ansible-core): the tests then run as they would without this."""
    queue_task = getattr(strategy_base, "_queue_task", None)
    if not callable(queue_task) or getattr(queue_task, "_pivot_preloads", False):
        return False
    loaded: set[str] = set()

    def _queue_task(self: Any, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any) -> Any:
        preload_connection(task_vars.get("ansible_connection") or getattr(task, "connection", None), loaded, load)
        return queue_task(self, host, task, task_vars, play_context)

    _queue_task._pivot_preloads = True  # type: ignore[attr-defined]
    strategy_base._queue_task = _queue_task  # type: ignore[attr-defined]
    return True


class _PatchStrategyOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when Ansible's strategy package is imported, its loader is wrapped so that the package's
    ``StrategyBase`` is patched as soon as it exists."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != STRATEGY_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            strategy_base = getattr(module, "StrategyBase", None)
            if isinstance(strategy_base, type):
                patch_strategy(strategy_base)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    if STRATEGY_MODULE not in sys.modules and not any(isinstance(f, _PatchStrategyOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchStrategyOnImport())
