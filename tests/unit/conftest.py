# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Fixtures for the module unit tests.

Under ``ansible-test units`` the collection is already importable. Run plainly
(``.venv/bin/python -m pytest tests/unit``), the ``ansible_collections.pivot.ops`` package is made importable from
``.cache/collections`` (created by lab/setup.sh) or, failing that, from a temporary symlink to this checkout.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "nvidia-smi")
FAKE_TRAINER = os.path.join(REPO, "tests", "unit", "support", "fake_trainer.py")


def _make_collection_importable() -> None:
    try:
        importlib.import_module("ansible_collections.pivot.ops.plugins.module_utils.procfs")
    except ImportError:
        pass
    else:
        return
    cached = os.path.join(REPO, ".cache", "collections")
    if os.path.isdir(os.path.join(cached, "ansible_collections", "pivot", "ops")):
        sys.path.insert(0, cached)
        return
    base = os.path.join(tempfile.gettempdir(), f"pivot-ops-unit-{os.getuid()}")
    namespace = os.path.join(base, "ansible_collections", "pivot")
    os.makedirs(namespace, exist_ok=True)
    link = os.path.join(namespace, "ops")
    if not os.path.islink(link):
        os.symlink(REPO, link)
    sys.path.insert(0, base)


_make_collection_importable()

from ansible.module_utils import _internal as module_utils_internal  # noqa: E402
from ansible.module_utils import basic  # noqa: E402
from ansible.module_utils.common import warnings as ansible_warnings  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402


class ModuleExit(Exception):
    def __init__(self, result: dict) -> None:
        super().__init__(result.get("msg", ""))
        self.result = result


def _exit_json(self, **kwargs):
    kwargs.setdefault("failed", False)
    kwargs["warnings"] = list(ansible_warnings.get_warning_messages())
    raise ModuleExit(kwargs)


def _fail_json(self, msg, **kwargs):
    kwargs["failed"] = True
    kwargs["msg"] = msg
    kwargs["warnings"] = list(ansible_warnings.get_warning_messages())
    raise ModuleExit(kwargs)


@pytest.fixture
def run_module(monkeypatch):
    """Run a module's ``main`` with ``args`` and return its result dict (``failed`` tells exit from fail)."""
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)
    monkeypatch.setattr(ansible_warnings, "_global_warnings", {})
    # A module runs on the target: once a test imported controller code (a callback plugin), ansible would send the
    # module's warnings to the controller's display instead of the result.
    monkeypatch.setattr(module_utils_internal, "is_controller", False)

    def run(main, args: dict, check_mode: bool = False, diff: bool = False) -> dict:
        full_args = dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)
        # Round-trip through JSON like the controller does.
        full_args = json.loads(json.dumps(full_args))
        with patch_module_args(full_args):
            try:
                main()
            except ModuleExit as done:
                return done.result
        raise AssertionError("module returned without calling exit_json or fail_json")

    return run


@pytest.fixture
def smi_fixture():
    """Text of a real nvidia-smi capture copied into tests/fixtures/nvidia-smi/."""

    def read(name: str) -> str:
        with open(os.path.join(FIXTURES, name)) as handle:
            return handle.read()

    return read


# ansible-playbook's JSON output (ansible.posix.json) for the tests that run whole playbooks on this machine.
JSON_OUTPUT_ENV = {"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
                   "NO_COLOR": "1"}
PLAYBOOK_TIMEOUT_S = 300


def run_playbook_json(inventory: str, playbook: str, *args: str, env: dict[str, str] | None = None,
                      timeout: float = PLAYBOOK_TIMEOUT_S) -> tuple[int, dict]:
    """``ansible-playbook -i INVENTORY PLAYBOOK ARGS...`` from this checkout's .venv, in the repository root: its exit
    status and its output as ansible.posix.json prints it. ``env`` replaces os.environ (the JSON callback is added)."""
    cmd = [os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", inventory, playbook, *args]
    proc = subprocess.run(cmd, cwd=REPO, env={**(os.environ if env is None else env), **JSON_OUTPUT_ENV},
                          capture_output=True, text=True, timeout=timeout, check=False)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"no JSON from {cmd}: {proc.stdout[-3000:]} {proc.stderr[-3000:]}") from exc


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def live_pids_with_argument(argument: str) -> list[int]:
    """Every live (not zombie) process with ``argument`` as one of its argv entries, sorted."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if argument.encode() in argv and _alive(int(entry)):
            found.append(int(entry))
    return sorted(found)


class Trainers:
    """Starts fake_trainer.py process trees for a test and kills whatever is left afterwards."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.popens = []
        self.token = "pivot-unit-" + uuid.uuid4().hex[:12]

    def start(self, role: str, *args: str, env: dict | None = None, ready: int = 1) -> subprocess.Popen:
        """Start ``role`` and wait until ``ready`` of its processes have installed their signal handlers."""
        full_env = dict(os.environ, PIVOT_UNIT_JOB=self.token, **(env or {}))
        popen = subprocess.Popen(
            [sys.executable, FAKE_TRAINER, role, "--token", self.token, "--state-dir", str(self.tmp_path), *args],
            env=full_env,
            cwd=str(self.tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.popens.append(popen)
        self.wait_ready(ready)
        return popen

    def ready(self, role: str | None = None) -> list:
        """PIDs that reported ready, optionally only those of one role."""
        prefix = f"ready_{role}_" if role else "ready_"
        names = [name for name in os.listdir(str(self.tmp_path)) if name.startswith(prefix)]
        return sorted(int(name.rsplit("_", 1)[1]) for name in names if not name.endswith(".tmp"))

    def wait_ready(self, count: int, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while len(self.ready()) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(self.ready())} of {count} fake trainer processes became ready")
            time.sleep(0.02)
        return self.ready()

    def job_pids(self) -> list:
        """Every live process whose argv carries this test's token (the job, wherever it was re-parented)."""
        return live_pids_with_argument(self.token)

    def cleanup(self) -> None:
        for pid in self.job_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for popen in self.popens:
            if popen.poll() is None:
                popen.kill()
            popen.wait(timeout=10)


@pytest.fixture
def trainers(tmp_path):
    manager = Trainers(tmp_path)
    yield manager
    manager.cleanup()


@pytest.fixture
def alive():
    return _alive
