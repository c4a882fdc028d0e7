"""Helpers for the tests of the lab's test doubles (nvidia-smi, fake_gpu, trainsim).

The doubles run in the lab containers under Debian's python3 (3.11, stdlib only);
here they run as subprocesses of the host's /usr/bin/python3 when it exists.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "lab" / "files"
NVIDIA_SMI = FILES / "nvidia-smi"
TRAINSIM = FILES / "trainsim"
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable

CAPTURE_UUID = "GPU-1d5ec48f-8bbb-2444-2058-2e30e4383e79"
CAPTURE_PID = 419
CAPTURE_PROCESS_MIB = 19592

# The H200 the captures come from, as a fake_gpu inventory. Power draw and GPU
# utilization differ between the captures' moments; tests set those per capture.
CAPTURE_MACHINE = {
    "driver_version": "580.159.04",
    "cuda_version": "13.0",
    "context_overhead_mib": 8.6,
    "gpus": [
        {
            "name": "NVIDIA H200",
            "uuid": CAPTURE_UUID,
            "pci_bus_id": "00000000:00:06.0",
            "memory_total_mib": 143771,
            "memory_reserved_mib": 614.6,
            "compute_cap": "9.0",
            "persistence_mode": True,
            "power_limit_w": 700,
            "power_draw_idle_w": 123.0,
            "power_draw_busy_w": 90.0,
            "temperature_c": 36,
            "fan_speed_pct": None,
            "perf_state": "P0",
            "utilization_busy_pct": 2,
            "ecc_errors": 0,
        }
    ],
}


def capture_machine(**gpu_changes: object) -> dict:
    config = copy.deepcopy(CAPTURE_MACHINE)
    config["gpus"][0].update(gpu_changes)
    return config


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


class SmiEnvironment:
    """A private inventory + registry for one test (nothing under /etc or /run)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config_path = root / "gpus.json"
        self.state_dir = root / "state"
        self.env = {
            **os.environ,
            "FAKE_NVIDIA_CONFIG": str(self.config_path),
            "FAKE_NVIDIA_STATE_DIR": str(self.state_dir),
            "PYTHONPATH": str(FILES),
        }

    def configure(self, config: dict) -> None:
        self.config_path.write_text(json.dumps(config))

    def use_profile(self, filename: str) -> dict:
        config = json.loads((FILES / filename).read_text())
        self.configure(config)
        return config

    def smi(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, str(NVIDIA_SMI), *args], env=self.env, capture_output=True, text=True, timeout=30, check=False
        )

    def smi_ok(self, *args: str) -> str:
        result = self.smi(*args)
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert result.stderr == ""
        return result.stdout

    def memory_used(self) -> list[int]:
        out = self.smi_ok("--query-gpu=memory.used", "--format=csv,noheader,nounits")
        return [int(line) for line in out.splitlines()]

    def fake_gpu(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, "-m", "fake_gpu", *args], env=self.env, capture_output=True, text=True, timeout=30, check=False
        )


def proc_state(pid: int) -> str | None:
    """Process state letter from /proc (None when the PID does not exist)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def proc_ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def is_running(pid: int) -> bool:
    """Alive and not a zombie (orphans may stay zombies when PID 1 does not reap)."""
    return proc_state(pid) not in (None, "Z", "X")


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if proc_ppid(int(entry.name)) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return sorted(found)


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def proc_cmdline(pid: int) -> list[str]:
    return [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part]


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def proc_starttime(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


class ProcessTracker:
    """Every process a test starts or discovers; SIGKILLed by PID at teardown.

    A PID is remembered with its start time, so a PID reused after the test's
    process died is never signalled.
    """

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen] = []
        self.pids: dict[int, int | None] = {}

    def start(self, command: list[str], **kwargs: object) -> subprocess.Popen:
        process = subprocess.Popen(command, **kwargs)
        self.popens.append(process)
        self.track(process.pid)
        return process

    def track(self, *pids: int) -> None:
        for pid in pids:
            self.pids.setdefault(pid, proc_starttime(pid))

    def cleanup(self) -> None:
        for pid, starttime in self.pids.items():
            if is_running(pid) and proc_starttime(pid) == starttime:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for process in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
