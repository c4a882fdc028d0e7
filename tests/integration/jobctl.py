"""Container-side helper of the integration tests: inspect and clean up lab training jobs in ct200.

Copied into ct200 by the integration tests' ``lab_up`` fixture and run there with the container's python3 (3.11, stdlib
only). Every job a test starts carries ``PIVOT_IT_JOB=<name>`` in its environment, which every process of the job
inherits (the launcher, torchrun-like agent, workers in their own sessions, forked dataloader workers), so the job's
processes are found wherever they were re-parented.

    python3 jobctl.py ps NAME                      JSON list of the job's live processes
    python3 jobctl.py wait-step LOG STEP TIMEOUT   wait until LOG shows step >= STEP; prints the step
    python3 jobctl.py wait-text LOG TEXT TIMEOUT   wait until LOG contains TEXT
    python3 jobctl.py checkpoints DIR              JSON list of entries in DIR: name, complete (COMPLETE marker)
    python3 jobctl.py kill NAME TIMEOUT            SIGKILL the job's processes until none is left
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

MARKER_VARIABLE = b"PIVOT_IT_JOB"
STEP = re.compile(r"\bstep=(\d+)")


def read_process(pid: int) -> dict | None:
    base = Path("/proc", str(pid))
    try:
        stat = (base / "stat").read_text()
        cmdline = (base / "cmdline").read_bytes()
        comm = (base / "comm").read_text().strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return {
        "pid": pid,
        "state": fields[0],
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "comm": comm,
        "cmdline": " ".join(part.decode(errors="replace") for part in cmdline.split(b"\0") if part),
    }


def job_of(pid: int) -> str | None:
    try:
        environ = Path("/proc", str(pid), "environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        name, _unused, value = entry.partition(b"=")
        if name == MARKER_VARIABLE:
            return value.decode()
    return None


def job_processes(name: str) -> list[dict]:
    """The job's processes that are alive (zombies have exited and are left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or job_of(int(entry)) != name:
            continue
        info = read_process(int(entry))
        if info is not None and info["state"] != "Z":
            found.append(info)
    return sorted(found, key=lambda info: info["pid"])


def last_step(log: str) -> int | None:
    try:
        text = Path(log).read_text(errors="replace")
    except FileNotFoundError:
        return None
    steps = STEP.findall(text)
    return int(steps[-1]) if steps else None


def wait_step(log: str, step: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        current = last_step(log)
        if current is not None and current >= step:
            print(current)
            return 0
        if time.monotonic() > deadline:
            print(f"{log} shows step {current} after {timeout}s, expected >= {step}", file=sys.stderr)
            return 1
        time.sleep(0.05)


def wait_text(log: str, text: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        with_text = Path(log).is_file() and text in Path(log).read_text(errors="replace")
        if with_text:
            return 0
        if time.monotonic() > deadline:
            print(f"{log} does not contain {text!r} after {timeout}s", file=sys.stderr)
            return 1
        time.sleep(0.05)


def checkpoints(directory: str) -> list[dict]:
    root = Path(directory)
    if not root.is_dir():
        return []
    return [
        {"name": entry.name, "complete": (entry / "COMPLETE").is_file()}
        for entry in sorted(root.iterdir())
        if entry.is_dir()
    ]


def kill_job(name: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    killed: set[int] = set()
    while True:
        alive = job_processes(name)
        if not alive:
            print(json.dumps(sorted(killed)))
            return 0
        if time.monotonic() > deadline:
            print(f"job {name}: processes survive SIGKILL: {alive}", file=sys.stderr)
            return 1
        for info in alive:
            try:
                os.kill(info["pid"], signal.SIGKILL)
                killed.add(info["pid"])
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "ps":
        print(json.dumps(job_processes(args[0])))
        return 0
    if command == "wait-step":
        return wait_step(args[0], int(args[1]), float(args[2]))
    if command == "wait-text":
        return wait_text(args[0], args[1], float(args[2]))
    if command == "checkpoints":
        print(json.dumps(checkpoints(args[0])))
        return 0
    if command == "kill":
        return kill_job(args[0], float(args[1]))
    print(f"unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
