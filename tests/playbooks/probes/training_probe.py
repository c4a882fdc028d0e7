"""Runs inside ct200 (python3 3.11, stdlib only), fed on stdin through the Proxmox node's `pct exec`.

Reads what a user cares about on the training side: the job's live processes, its checkpoints, the signal
lines of its log, and Pivot's run lock. The job is what `lab/lab train` starts: run.sh -> torchrun agent ->
train_dflash_pipeline.py workers, found by their argv (the way Pivot finds it).

    python3 - state                      JSON: processes, checkpoints, log
    python3 - wait-step SINCE TIMEOUT    wait until the log has a step line after byte offset SINCE
    python3 - kill PID...                SIGKILL these PIDs until none is alive
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

CHECKPOINTS = Path("/data/dflash/checkpoints")
LOG = Path("/root/train/train.log")
LOCK = Path("/run/pivot/pivot.lock")
JOB_ARGS = ("train_dflash_pipeline.py", "/opt/trainsim/run.sh")
SIGNAL_LINES = ("Checkpoint requested", "SIGTERM")
STEP = re.compile(r"\bstep=(\d+)")


def process(pid: int) -> dict | None:
    base = Path("/proc", str(pid))
    try:
        argv = [a.decode(errors="replace") for a in (base / "cmdline").read_bytes().split(b"\0") if a]
        state = (base / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    if state == "Z" or not any(a in JOB_ARGS or a.endswith("/" + JOB_ARGS[0]) for a in argv):
        return None
    return {"pid": pid, "args": " ".join(argv)}


def job_processes() -> list[dict]:
    found = (process(int(entry)) for entry in os.listdir("/proc") if entry.isdigit())
    return sorted((p for p in found if p is not None), key=lambda p: p["pid"])


def checkpoints() -> dict[str, bool]:
    if not CHECKPOINTS.is_dir():
        return {}
    # complete as the trainer counts it: its marker, or (--no-marker) trainer_state.json, which it writes last
    return {entry.name: (entry / "COMPLETE").is_file() or (entry / "trainer_state.json").is_file()
            for entry in sorted(CHECKPOINTS.iterdir()) if entry.is_dir()}


def log_text() -> str:
    try:
        return LOG.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def lock() -> dict | None:
    try:
        return json.loads(LOCK.read_text())
    except (OSError, ValueError):
        return None


def state() -> dict:
    text = log_text()
    lines = text.splitlines()
    steps = STEP.findall(text)
    return {
        "processes": job_processes(),
        "checkpoints": checkpoints(),
        "signal_lines": [line for line in lines if any(marker in line for marker in SIGNAL_LINES)],
        "last_step": int(steps[-1]) if steps else None,
        "log_size": len(text.encode()),
        "lock": lock(),
    }


def wait_step(since: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if STEP.search(log_text().encode()[since:].decode(errors="replace")):
            return 0
        time.sleep(0.1)
    print(f"no training step in {LOG} after byte {since} within {timeout}s", file=sys.stderr)
    return 1


def kill(pids: list[int]) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if process(pid) is not None]
        if not alive:
            return 0
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    print(f"processes survive SIGKILL: {alive}", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "state":
        print(json.dumps(state()))
        return 0
    if command == "wait-step":
        return wait_step(int(args[0]), float(args[1]))
    if command == "kill":
        return kill([int(a) for a in args])
    print(f"unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
