# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Progress of a long module run, and the controller's heartbeat, as small files on the target.

A module started with ``async`` + ``poll: 0`` writes its progress with ``ProgressFile``; the controller polls it with
``pivot.ops.async_watch`` in an ``until`` loop, which refreshes a heartbeat file on every poll and returns the progress
line, and the ``pivot.ops.progress`` callback prints that line for each retry. A module that must not go on without its
controller checks ``Heartbeat.stale``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Callable


def write_json_atomically(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so a reader never sees half of it."""
    temporary = "%s.%d.tmp" % (path, os.getpid())
    with open(temporary, "w") as handle:
        json.dump(data, handle, sort_keys=True)
        handle.write("\n")
    os.replace(temporary, path)


def read_json(path: str) -> dict | None:
    """The JSON object in ``path``; None when it is missing, unreadable or not an object."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove_quietly(path: str | None) -> None:
    if not path:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)


def seconds_text(seconds: float) -> str:
    return "%d s" % round(seconds)


def waited_text(elapsed: float, limit: float | None) -> str:
    """``120 s of 900``, or ``120 s`` without a limit."""
    if limit is None:
        return seconds_text(elapsed)
    return "%d s of %d" % (round(elapsed), round(limit))


class ProgressFile:
    """The module's side: ``update(stage, line)`` rewrites the file at most every ``min_interval`` seconds unless the
    stage changed; ``close`` removes it. Without a path every call does nothing."""

    def __init__(
        self,
        path: str | None,
        identity: dict | None = None,
        min_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.identity = dict(identity or {})
        self.min_interval = min_interval
        self.clock = clock
        self.wall_clock = wall_clock
        self.last = None  # (stage, clock) of the last write
        self.line = ""

    def update(self, stage: str, line: str) -> None:
        self.line = line
        if not self.path:
            return
        now = self.clock()
        if self.last is not None and self.last[0] == stage and now - self.last[1] < self.min_interval:
            return
        data = dict(self.identity, stage=stage, line=line, updated=self.wall_clock(), pid=os.getpid())
        try:
            write_json_atomically(self.path, data)
        except OSError:
            return  # progress is a courtesy; the stop itself must not fail for it
        self.last = (stage, now)

    def close(self) -> None:
        remove_quietly(self.path)


class Heartbeat:
    """The controller touches ``path`` on every poll; the module asks ``stale()`` before anything it cannot undo.

    ``timeout`` <= 0 or no path means there is no heartbeat to keep: never stale.
    """

    def __init__(self, path: str | None, timeout: float, wall_clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.timeout = timeout
        self.wall_clock = wall_clock

    @property
    def enabled(self) -> bool:
        return bool(self.path) and self.timeout > 0

    def touch(self) -> None:
        """Refresh it (the module does once at its start, so the controller has ``timeout`` for its first poll)."""
        if not self.path:
            return
        with open(self.path, "a"):
            pass
        now = self.wall_clock()
        os.utime(self.path, (now, now))

    def age(self) -> float | None:
        """Seconds since the last refresh; None when the file is missing."""
        if not self.path:
            return None
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            return None
        return max(0.0, self.wall_clock() - mtime)

    def refreshed_since(self, moment: float) -> bool:
        """True when the controller refreshed it after ``moment`` (wall-clock seconds)."""
        if not self.path:
            return False
        try:
            return os.stat(self.path).st_mtime > moment
        except OSError:
            return False

    def stale(self) -> bool:
        """True when the controller stopped refreshing it for longer than ``timeout`` (or removed it)."""
        if not self.enabled:
            return False
        age = self.age()
        return age is None or age > self.timeout

    def close(self) -> None:
        remove_quietly(self.path)
