"""Controller-side helpers of the training-stop tests: run pivot.yml in the background as a user does in a terminal
(its own process group, the project's pivot.ops.progress output), press Ctrl-C, and read the stop's state on ct200
(its records, its processes)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import labctl
import pivotlab

STATE_DIR = "/var/lib/pivot/stop_training"
# A progress line of the stop, as pivot.ops.progress prints it for ct200.
PROGRESS = re.compile(r"^ct200: (?P<text>.*)$")
T = TypeVar("T")


@dataclass
class TerminalRun:
    """ansible-playbook started like from a terminal: its own process group (the terminal's foreground group), the
    stdout callback from ansible.cfg (pivot.ops.progress). Lines are kept with the time they arrived."""

    process: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    _queue: queue.Queue[tuple[float, str] | None] = field(default_factory=queue.Queue)

    @classmethod
    def start(cls, playbook: str, *extra_vars: str, progress_interval: float | None = None) -> TerminalRun:
        env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "pivot.ops.progress", "ANSIBLE_NOCOLOR": "1"}
        if progress_interval is not None:
            env["PIVOT_PROGRESS_INTERVAL"] = str(progress_interval)
        args = [arg for value in extra_vars for arg in ("-e", value)]
        process = subprocess.Popen(["ansible-playbook", f"playbooks/{playbook}", *args], cwd=pivotlab.REPO, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        run = cls(process)
        threading.Thread(target=run._read, daemon=True).start()
        return run

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put((time.monotonic(), line.rstrip("\n")))
        self._queue.put(None)

    def wait_for_line(self, pattern: str, timeout: float) -> str:
        """Waits until the run prints a line matching pattern; returns it."""
        deadline = time.monotonic() + timeout
        wanted = re.compile(pattern)
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if item is None:
                raise AssertionError(f"the run ended before printing {pattern!r}:\n{self.output[-4000:]}")
            self.lines.append(item)
            if wanted.search(item[1]):
                return item[1]
        raise AssertionError(f"the run printed no {pattern!r} within {timeout}s:\n{self.output[-4000:]}")

    @property
    def output(self) -> str:
        return "\n".join(line for _at, line in self.lines)

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

    def kill(self) -> None:
        """SIGKILL to the run and all it started, as when the operator's machine dies."""
        if self.process.poll() is None:
            pivotlab.kill_ansible_playbook(self.process.pid)
        self.process.wait(timeout=30)


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
