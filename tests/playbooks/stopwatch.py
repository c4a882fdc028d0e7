"""Controller-side helpers of the training-stop tests: run pivot.yml in the background as a user does in a terminal
(its own process group, the project's pivot.ops.progress output), press Ctrl-C, and read the stop's state on ct200
(its records, its processes)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

import labctl
import pivotlab

STATE_DIR = "/var/lib/pivot/stop_training"
# A progress line of the stop, as pivot.ops.progress prints it for ct200.
PROGRESS = re.compile(r"^ct200: (?P<text>.*)$")
T = TypeVar("T")


class TerminalRun(pivotlab.BackgroundRun):
    """ansible-playbook started like from a terminal with the stdout callback from ansible.cfg (pivot.ops.progress),
    its progress lines read as they arrive."""

    @classmethod
    def start(cls, playbook: str, *extra_vars: str, progress_interval: float | None = None) -> TerminalRun:
        env = {} if progress_interval is None else {"PIVOT_PROGRESS_INTERVAL": str(progress_interval)}
        return super().start(playbook, *extra_vars, callback="pivot.ops.progress", env=env)

    def progress(self) -> list[tuple[float, str]]:
        """(arrival time, text) of every progress line printed for ct200 so far."""
        return [(at, match["text"]) for at, line in self.lines if (match := PROGRESS.match(line))]

    def ctrl_c(self, timeout: float = 60) -> int:
        """What Ctrl-C in the terminal does: SIGINT to the foreground process group. Returns the exit status."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self.kill()
            raise AssertionError(f"ansible-playbook did not end within {timeout}s of Ctrl-C") from exc


def _on_ct200(script: str) -> str:
    result = labctl.pct_exec(["python3", "-c", script])
    assert result.rc == 0, result.stderr
    return result.stdout


def host_records() -> list[dict]:
    """The stop records waiting on ct200 for a controller to import them, oldest first."""
    script = (
        "import glob, json\n"
        f"print(json.dumps([json.load(open(p)) for p in sorted(glob.glob('{STATE_DIR}/records/*.json'))]))\n"
    )
    return json.loads(_on_ct200(script))


def stop_processes() -> list[str]:
    """Command lines of stop_training modules still running on ct200 (async, so not below any ssh session)."""
    script = (
        "import os\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try: argv = open('/proc/%s/cmdline' % pid, 'rb').read().replace(b'\\0', b' ').decode()\n"
        "    except OSError: continue\n"
        "    if 'AnsiballZ_stop_training' in argv and 'python3 -c' not in argv: print(pid, argv)\n"
    )
    return _on_ct200(script).splitlines()


def wait_until(probe: Callable[[], T], timeout: float, what: str, interval: float = 2.0) -> T:
    """Polls probe until it returns something truthy; returns that."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s")
        time.sleep(interval)
