"""Helpers for the tests of the lab's test doubles (nvidia-smi, fake_gpu, trainsim).

The doubles run in the lab containers under Debian's python3 (3.11, stdlib only);
here they run as subprocesses of the host's /usr/bin/python3 when it exists.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "lab" / "files"
NVIDIA_SMI = FILES / "nvidia-smi"
TRAINSIM = FILES / "trainsim"
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
TEST_TOKEN_VARIABLE = "PIVOT_LAB_DOUBLES_TEST"
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
            # Inherited by every descendant (also orphans and new sessions): clean-up finds them by it.
            TEST_TOKEN_VARIABLE: uuid.uuid4().hex,
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

    def cleanup(self, token: str | None = None) -> None:
        """SIGKILL what is tracked, then anything still carrying this test's token."""
        for pid, starttime in self.pids.items():
            if is_running(pid) and proc_starttime(pid) == starttime:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if token:
            for pid in processes_with_token(token):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for process in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)


def processes_with_token(token: str) -> list[int]:
    needle = f"{TEST_TOKEN_VARIABLE}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and is_running(int(entry.name)):
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


STEP_LINE = re.compile(
    r"^\[(?P<minutes>\d+)m\] step=(?P<step>\d+) loss=(?P<loss>---|\d+\.\d+) acc=(?P<acc>---|\d+\.\d+) .*"
    r"\| tgt=\d+\.\d+b/s dft=\d+\.\d+b/s \(\d+\.\dKtok/s\) \| .*ETA=\d+\.\d[dhm]$"
)
REAL_LOG_LINE = "[2158m] step=5381 loss=--- acc=--- ... | tgt=0.48b/s dft=0.48b/s (19.5Ktok/s) | ... ETA=7.1d"


class Trainsim:
    """One simulated training job's directories, environment and log, under a test's tmp dir."""

    def __init__(self, smi: SmiEnvironment, processes: ProcessTracker) -> None:
        self.smi = smi
        self.processes = processes
        root = smi.root
        self.checkpoint_dir = root / "checkpoints"
        self.log_file = root / "train.log"
        self.stdout_file = root / "stdout.log"
        bin_dir = root / "bin"
        bin_dir.mkdir(exist_ok=True)
        # run.sh calls `python3`: make that the python the lab containers have.
        (bin_dir / "python3").symlink_to(PYTHON)
        self.env = {**smi.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        smi.use_profile("gpus-h200x8.json")

    def fast_flags(self) -> list[str]:
        return [
            "--checkpoint-dir", str(self.checkpoint_dir), "--log-file", str(self.log_file),
            "--step-seconds", "0.05", "--checkpoint-seconds", "0", "--save-every", "0", "--gpu-mib", "1000",
        ]

    def start(self, *flags: str, command: list[str] | None = None, **popen: object) -> subprocess.Popen:
        command = command or [PYTHON, str(TRAINSIM / "train_dflash_pipeline.py")]
        stdout = open(self.stdout_file, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            return self.processes.start(
                [*command, *self.fast_flags(), *flags], env=self.env, stdout=stdout, stderr=subprocess.STDOUT,
                **popen,
            )
        finally:
            stdout.close()

    def log_lines(self) -> list[str]:
        return self.log_file.read_text().splitlines() if self.log_file.exists() else []

    def steps(self) -> list[int]:
        return [int(m["step"]) for line in self.log_lines() if (m := STEP_LINE.match(line))]

    def last_step(self) -> int:
        steps = self.steps()
        return steps[-1] if steps else -1

    def wait_for_step(self, step: int, timeout: float = 15.0) -> None:
        wait_for(lambda: self.last_step() >= step, timeout, what=f"step {step}")

    def wait_for_log(self, text: str, timeout: float = 15.0) -> str:
        return wait_for(
            lambda: next((line for line in self.log_lines() if text in line), None), timeout, what=repr(text)
        )

    def complete_steps(self) -> list[int]:
        if not self.checkpoint_dir.is_dir():
            return []
        return sorted(
            int(p.name.removeprefix("step_")) for p in self.checkpoint_dir.glob("step_*") if (p / "COMPLETE").is_file()
        )
