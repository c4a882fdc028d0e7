# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""SIGTERM, grace period, SIGKILL, confirm: the stop protocol, independent of how the job was found.

``Escalator`` only needs a ``scan`` callable returning the job's live processes and a ``Signaller``; tests drive it
with real child processes or with fakes.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

from ansible_collections.pivot.ops.plugins.module_utils.procfs import ProcessInfo, ProcFS


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class SignalLog:
    """Which signals went to which PID, in order; group signals are recorded separately."""

    def __init__(self) -> None:
        self._entries = {}

    def _entry(self, info: ProcessInfo) -> dict:
        return self._entries.setdefault(
            info.pid, {"pid": info.pid, "cmdline": info.command, "signals": [], "group_signals": []}
        )

    def record(self, info: ProcessInfo, signum: int, group: bool = False) -> None:
        key = "group_signals" if group else "signals"
        self._entry(info)[key].append(signal_name(signum))

    def sent(self, pid: int, signum: int) -> bool:
        entry = self._entries.get(pid)
        return entry is not None and signal_name(signum) in entry["signals"]

    def as_list(self) -> list:
        return [self._entries[pid] for pid in sorted(self._entries)]


class Signaller:
    """Sends signals only to the exact process that was discovered: the PID must still belong to a process with the
    same start time, so a recycled PID is never signalled."""

    def __init__(
        self,
        proc: ProcFS,
        log: SignalLog,
        kill: Callable[[int, int], None] = os.kill,
        killpg: Callable[[int, int], None] = os.killpg,
    ) -> None:
        self.proc = proc
        self.log = log
        self._kill = kill
        self._killpg = killpg

    def _still_same(self, info: ProcessInfo) -> bool:
        current = self.proc.read(info.pid)
        return current is not None and current.start_time == info.start_time and not current.is_zombie

    def send(self, info: ProcessInfo, signum: int) -> bool:
        if not self._still_same(info):
            return False
        try:
            self._kill(info.pid, signum)
        except ProcessLookupError:
            return False
        self.log.record(info, signum)
        return True

    def send_group(self, leader: ProcessInfo, signum: int) -> bool:
        """Signal the process group ``leader`` leads, which also reaches children forked after the last scan."""
        if leader.pgid != leader.pid or not self._still_same(leader):
            return False
        try:
            self._killpg(leader.pid, signum)
        except ProcessLookupError:
            return False
        self.log.record(leader, signum, group=True)
        return True


@dataclass
class EscalationResult:
    sigkill_needed: bool = False
    remaining: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    terminated: list = field(default_factory=list)


class Escalator:
    """Stops every process that ``scan`` reports: SIGTERM (each PID and each group it leads), wait up to
    ``grace_period``, SIGKILL survivors, wait up to ``kill_timeout``, then report what is left.

    Processes that appear during the waits (forked children, workers found by a later scan) get the signal of the
    phase they appear in. Zombies are not reported by ``scan``, so they count as gone: they hold no memory and only
    wait for their parent to reap them.
    """

    def __init__(
        self,
        scan: Callable[[], dict],
        signaller: Signaller,
        poll_interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        *,
        on_wait: Callable[[int, float, float, dict], None] | None = None,
    ) -> None:
        self.scan = scan
        self.signaller = signaller
        self.poll_interval = poll_interval
        self.clock = clock
        self.sleep = sleep
        # Called after every rescan while a phase waits: (signal, seconds waited, the phase's timeout, live members).
        self.on_wait = on_wait

    def _signal_new(self, members: dict, signum: int, done: set) -> None:
        """Signal processes not signalled in this phase yet: each process group a member leads as a whole (that also
        reaches children forked after the scan), every other member by PID. Nobody gets the same signal twice."""
        fresh = {pid: info for pid, info in members.items() if (pid, info.start_time) not in done}
        reached_groups = set()
        for pid, info in fresh.items():
            if info.pgid == pid and self.signaller.send_group(info, signum):
                reached_groups.add(pid)
        for pid, info in fresh.items():
            done.add((pid, info.start_time))
            if info.pgid in reached_groups:
                self.signaller.log.record(info, signum)
            else:
                self.signaller.send(info, signum)

    def _phase(self, members: dict, signum: int, timeout: float, seen: dict) -> dict:
        """Signal ``members`` and everything that shows up until the job is gone or ``timeout`` passes."""
        done = set()
        started = self.clock()
        deadline = started + timeout
        while True:
            seen.update(members)
            self._signal_new(members, signum, done)
            remaining_time = deadline - self.clock()
            if remaining_time <= 0:
                return members
            self.sleep(min(self.poll_interval, remaining_time))
            members = self.scan()
            if not members:
                return members
            if self.on_wait is not None:
                self.on_wait(signum, self.clock() - started, timeout, members)

    def run(self, members: dict, grace_period: float, kill_timeout: float) -> EscalationResult:
        result = EscalationResult()
        seen = {}
        started = self.clock()
        survivors = self._phase(members, signal.SIGTERM, grace_period, seen) if members else {}
        result.timings["sigterm"] = round(self.clock() - started, 3)
        if survivors:
            result.sigkill_needed = True
            kill_started = self.clock()
            survivors = self._phase(survivors, signal.SIGKILL, kill_timeout, seen)
            result.timings["sigkill"] = round(self.clock() - kill_started, 3)
        else:
            result.timings["sigkill"] = 0.0
        result.remaining = sorted(survivors.values(), key=lambda info: info.pid)
        result.terminated = sorted(
            (info for pid, info in seen.items() if pid not in survivors), key=lambda info: info.pid
        )
        return result
