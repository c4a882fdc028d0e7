# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What keeps a training stop safe when its controller goes away: one stop at a time per host, the rule that says
whether a stop may still be cancelled, and a record on the host of every stop that did something.

A stop runs on the training host (``async``), watched by the controller through a heartbeat file. When the heartbeat
goes stale (Ctrl-C, a lost connection, a dead laptop), the stop is **cancelled** if no signal that ends the job has
been sent yet (the job keeps running; a checkpoint request already sent is harmless), and **completed** otherwise.
Either way it leaves a record in ``<state_dir>/records/``, which the next run's ``stop_training`` role imports into
the controller's durable per-host record.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import time
from datetime import datetime, timezone
from typing import Callable

from ansible_collections.pivot.ops.plugins.module_utils.progress import read_json, write_json_atomically

# Signals after which the job may be ending: once one went out, the stop is committed and runs to its end.
ENDING_SIGNALS = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP})

RECORDS = "records"
LOCK = "lock"

STOPPED = "stopped"  # the job was stopped (with a checkpoint, or forced)
CANCELLED = "cancelled"  # the controller went away before anything that ends the job; the job runs on
FAILED = "failed"  # the stop began ending the job and did not finish cleanly (survivors), or failed after a request


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class CommitState:
    """Whether the stop may still be cancelled: it may until the first signal that ends the job (or ``systemctl
    stop``) goes out."""

    def __init__(self) -> None:
        self.committed_at = None  # UTC time of the first ending action
        self.first_action = None

    @property
    def committed(self) -> bool:
        return self.committed_at is not None

    def note_signal(self, signum: int, what: str = "") -> None:
        if signum in ENDING_SIGNALS:
            self.note_ending(what or signal.Signals(signum).name)

    def note_ending(self, what: str) -> None:
        if self.committed_at is None:
            self.committed_at = utc_now()
            self.first_action = what


def should_cancel(commit: CommitState, heartbeat_stale: bool) -> bool:
    """The decision an unwatched stop makes: cancel only while nothing that ends the job was sent."""
    return heartbeat_stale and not commit.committed


class HostLockBusy(Exception):
    """Another stop holds the host's lock; ``holder`` is what it wrote there (may be empty)."""

    def __init__(self, holder: dict) -> None:
        super().__init__("another training stop is running on this host")
        self.holder = holder


class HostLock:
    """An exclusive ``flock`` on ``<state_dir>/lock`` for the whole run of one stop. The kernel releases it when the
    process ends, however it ends, so a crashed stop never blocks the next one. The holder writes who it is into the
    file, for the message a waiting stop shows."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK)
        self.handle = None

    def try_acquire(self, holder: dict) -> None:
        """Take the lock or raise ``HostLockBusy`` at once."""
        handle = open(self.path, "a+")  # noqa: SIM115 - held, with the lock, for the whole stop
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise HostLockBusy(read_json(self.path) or {}) from exc
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder, sort_keys=True) + "\n")
        handle.flush()
        self.handle = handle

    def acquire(
        self,
        holder: dict,
        timeout: float,
        on_wait: Callable[[dict, float], None],
        *,
        poll_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Wait up to ``timeout`` for the lock, calling ``on_wait(holder, waited)`` between tries; raises
        ``HostLockBusy`` when it is still held."""
        started = clock()
        while True:
            try:
                self.try_acquire(holder)
                return
            except HostLockBusy as busy:
                waited = clock() - started
                if waited >= timeout:
                    raise
                on_wait(busy.holder, waited)
                sleep(min(poll_interval, max(0.0, timeout - waited)))

    def held_by(self) -> dict | None:
        """Who holds the lock now (what it wrote, possibly empty), or None when it is free; takes nothing and writes
        nothing (for check mode)."""
        try:
            handle = open(self.path)  # noqa: SIM115 - closed below, after the probe
        except OSError:
            return None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return read_json(self.path) or {}
        finally:
            handle.close()
        return None

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def ensure_state_dir(state_dir: str) -> None:
    """Create ``state_dir`` and its records directory, root-only (records name the job's command lines)."""
    os.makedirs(os.path.join(state_dir, RECORDS), mode=0o700, exist_ok=True)


def record_path(state_dir: str, started_utc: str, pid: int) -> str:
    stamp = started_utc.replace("-", "").replace(":", "")
    return os.path.join(state_dir, RECORDS, "%s-%d.json" % (stamp, pid))


def write_record(path: str, record: dict) -> None:
    write_json_atomically(path, record)
    os.chmod(path, 0o600)
