# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The escalation protocol with a fake clock and fake processes, and with real sleeper processes."""

from __future__ import annotations

import signal
import subprocess
import sys

from ansible_collections.pivot.ops.plugins.module_utils.escalation import Escalator, Signaller, SignalLog
from ansible_collections.pivot.ops.plugins.module_utils.procfs import ProcessInfo, ProcFS


def process(pid: int, pgid: int | None = None, start: int = 1) -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=1, pgid=pgid or pid, sid=pid, state="S", start_time=start, comm="t", argv=("t",))


class FakeWorld:
    """Processes that die after given signals; time only moves when the escalator sleeps."""

    def __init__(self, processes: dict, dies_on: dict) -> None:
        self.processes = dict(processes)
        self.dies_on = dies_on  # pid -> set of signals that end it
        self.now = 0.0
        self.sent = []
        self.appear_at = {}  # time -> processes that show up then

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def scan(self) -> dict:
        for when in sorted(self.appear_at):
            if when <= self.now:
                self.processes.update(self.appear_at.pop(when))
        return dict(self.processes)

    def kill(self, pid: int, signum: int) -> None:
        self.sent.append((pid, signum))
        if signum in self.dies_on.get(pid, ()):
            self.processes.pop(pid, None)

    def killpg(self, pgid: int, signum: int) -> None:
        self.sent.append((-pgid, signum))
        for pid, info in list(self.processes.items()):
            if info.pgid == pgid and signum in self.dies_on.get(pid, ()):
                self.processes.pop(pid)


class FakeProc(ProcFS):
    def __init__(self, world: FakeWorld) -> None:
        super().__init__("/nonexistent")
        self.world = world

    def read(self, pid: int) -> ProcessInfo | None:
        return self.world.processes.get(pid)


def make(world: FakeWorld) -> tuple:
    log = SignalLog()
    signaller = Signaller(FakeProc(world), log, kill=world.kill, killpg=world.killpg)
    escalator = Escalator(world.scan, signaller, poll_interval=0.5, clock=world.clock, sleep=world.sleep)
    return escalator, log


def test_cooperative_processes_stop_on_sigterm():
    world = FakeWorld({10: process(10), 11: process(11, pgid=10)}, {10: {signal.SIGTERM}, 11: {signal.SIGTERM}})
    escalator, log = make(world)
    result = escalator.run(world.scan(), grace_period=10, kill_timeout=5)
    assert result.sigkill_needed is False
    assert result.remaining == []
    assert [info.pid for info in result.terminated] == [10, 11]
    # 10 leads the group 11 is in: one killpg reaches both, and neither gets a second SIGTERM by PID.
    assert world.sent == [(-10, signal.SIGTERM)]
    assert world.now == 0.5
    assert log.as_list() == [
        {"pid": 10, "cmdline": "t", "signals": ["SIGTERM"], "group_signals": ["SIGTERM"]},
        {"pid": 11, "cmdline": "t", "signals": ["SIGTERM"], "group_signals": []},
    ]


def test_member_outside_any_led_group_is_signalled_by_pid():
    world = FakeWorld({10: process(10), 30: process(30, pgid=99)}, {10: {signal.SIGTERM}, 30: {signal.SIGTERM}})
    escalator, _log = make(world)
    escalator.run(world.scan(), grace_period=10, kill_timeout=5)
    assert world.sent == [(-10, signal.SIGTERM), (30, signal.SIGTERM)]


def test_sigterm_ignored_escalates_after_grace_period():
    world = FakeWorld({10: process(10)}, {10: {signal.SIGKILL}})
    escalator, log = make(world)
    result = escalator.run(world.scan(), grace_period=3, kill_timeout=5)
    assert result.sigkill_needed is True
    assert result.remaining == []
    assert result.timings["sigterm"] == 3.0
    assert log.as_list()[0]["signals"] == ["SIGTERM", "SIGKILL"]


def test_process_appearing_during_grace_gets_sigterm_then_sigkill():
    world = FakeWorld({10: process(10)}, {10: {signal.SIGTERM}, 20: {signal.SIGKILL}})
    world.appear_at[0.4] = {20: process(20)}  # e.g. a worker found by a later scan
    escalator, log = make(world)
    result = escalator.run(world.scan(), grace_period=2, kill_timeout=5)
    assert result.sigkill_needed is True
    assert [entry["signals"] for entry in log.as_list()] == [["SIGTERM"], ["SIGTERM", "SIGKILL"]]
    assert result.remaining == []


def test_unkillable_process_is_reported_after_kill_timeout():
    world = FakeWorld({10: process(10)}, {})  # e.g. stuck in uninterruptible sleep
    escalator, _log = make(world)
    result = escalator.run(world.scan(), grace_period=1, kill_timeout=2)
    assert [info.pid for info in result.remaining] == [10]
    assert result.timings == {"sigterm": 1.0, "sigkill": 2.0}


def test_recycled_pid_is_not_signalled():
    world = FakeWorld({10: process(10, start=2)}, {})
    escalator, log = make(world)
    sent = escalator.signaller.send(process(10, start=1), signal.SIGTERM)
    assert sent is False
    assert world.sent == []
    assert log.as_list() == []


def test_nothing_to_stop():
    world = FakeWorld({}, {})
    escalator, _log = make(world)
    result = escalator.run({}, grace_period=5, kill_timeout=5)
    assert result.sigkill_needed is False
    assert world.sent == []
    assert world.now == 0.0


SLEEPER = """
import signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def test_real_sleepers_honouring_and_ignoring_sigterm():
    proc = ProcFS()
    popens = {
        mode: subprocess.Popen([sys.executable, "-c", SLEEPER, mode], stdout=subprocess.PIPE, text=True)
        for mode in ("honour", "ignore")
    }
    try:
        for popen in popens.values():
            assert popen.stdout.readline().strip() == "ready"
        pids = {popen.pid for popen in popens.values()}

        def scan() -> dict:
            found = {pid: proc.read(pid) for pid in pids}
            return {pid: info for pid, info in found.items() if info is not None and not info.is_zombie}

        log = SignalLog()
        result = Escalator(scan, Signaller(proc, log), poll_interval=0.05).run(scan(), grace_period=0.5, kill_timeout=5)
        assert result.sigkill_needed is True
        assert result.remaining == []
        signals = {entry["pid"]: entry["signals"] for entry in log.as_list()}
        assert signals[popens["honour"].pid] == ["SIGTERM"]
        assert signals[popens["ignore"].pid] == ["SIGTERM", "SIGKILL"]
        assert popens["honour"].wait(5) == -signal.SIGTERM
        assert popens["ignore"].wait(5) == -signal.SIGKILL
    finally:
        for popen in popens.values():
            if popen.poll() is None:
                popen.kill()
            popen.wait(5)
            popen.stdout.close()
