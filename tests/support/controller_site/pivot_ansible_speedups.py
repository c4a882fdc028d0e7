"""Test equipment: two things an ``ansible-playbook`` repeats for every task, done once in the tests' processes.

- **The connection plugin, loaded before the fork.** Ansible forks a worker per task and host, and the worker loads the
  host's connection plugin. For ``ct200`` that is ``community.proxmox.proxmox_pct_remote``, whose ``import paramiko``
  (with ``invoke``, ``asyncio``, ``unittest.mock``) and documentation parse cost every worker about 80 ms of CPU, for
  ``set_fact`` as much as for a module run. Loaded once in the parent, the workers inherit it; only the parent's first
  task for a host with a given connection pays, so a play on ``localhost`` alone never imports paramiko.
- **A play's ``vars_files``, parsed once per version of the file.** ansible-core 2.21 reads and parses each
  ``vars_files`` entry again for every task and host (``VariableManager.get_vars`` loads it with ``cache='vaulted'``,
  which keeps only vault-encrypted files): Pivot's ``playbooks/vars/roles.yml`` was a fifth of the CPU of a pivot's
  ``ansible-playbook`` process. The parse is kept per path, size and modification time, so an edited file is read anew.

``sitecustomize`` installs both in Ansible's command-line processes; a production controller never loads them.
"""

from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


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


def remember_vaulted_parses(data_loader: type) -> bool:
    """Wrap DATA_LOADER.load_from_file so that a ``cache='vaulted'`` load of an unchanged file returns the parse it
    returned before (a copy of it unless the caller asked for ``unsafe``, as the loader's own cache does). False when
    the method is not there (another ansible-core)."""
    load_from_file = getattr(data_loader, "load_from_file", None)
    if not callable(load_from_file) or getattr(load_from_file, "_pivot_remembers", False):
        return False
    parses: dict[tuple, Any] = {}

    def remembering_load_from_file(  # noqa: PLR0917 - DataLoader's own signature
        self: Any, file_name: str, cache: str = "all", unsafe: bool = False, json_only: bool = False,
        trusted_as_template: bool = False,
    ) -> Any:
        if cache != "vaulted":
            return load_from_file(self, file_name, cache, unsafe, json_only, trusted_as_template)
        path = self.path_dwim(file_name)
        try:
            status = os.stat(path)
        except OSError:
            return load_from_file(self, file_name, cache, unsafe, json_only, trusted_as_template)
        key = (path, status.st_size, status.st_mtime_ns, json_only, trusted_as_template)
        if key not in parses:
            parses[key] = load_from_file(self, file_name, cache, True, json_only, trusted_as_template)
        return parses[key] if unsafe else copy.deepcopy(parses[key])

    remembering_load_from_file._pivot_remembers = True  # type: ignore[attr-defined]
    data_loader.load_from_file = remembering_load_from_file  # type: ignore[attr-defined]
    return True


def _patch_class(attribute: str, patch: Callable[[type], bool]) -> Callable[[ModuleType], None]:
    def patch_module(module: ModuleType) -> None:
        cls = getattr(module, attribute, None)
        if isinstance(cls, type):
            patch(cls)

    return patch_module


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "ansible.plugins.strategy": _patch_class("StrategyBase", patch_strategy),
    "ansible.parsing.dataloader": _patch_class("DataLoader", remember_vaulted_parses),
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when a module of PATCHES is imported, its loader is wrapped so that the module is patched
    as soon as it has run."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    if not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
    for name, patch in PATCHES.items():  # already imported: patched now
        if name in sys.modules:
            patch(sys.modules[name])
