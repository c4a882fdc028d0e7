# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Watch a checkpoint directory for a checkpoint that is newer than a request and complete."""

from __future__ import annotations

import fnmatch
import os
import re
import time
from dataclasses import dataclass
from typing import Callable

DEFAULT_STEP_REGEX = r"(\d+)(?!.*\d)"


@dataclass(frozen=True)
class CheckpointSpec:
    directory: str
    pattern: str = "*"
    marker: str | None = None
    stable_seconds: float = 10.0
    step_regex: str = DEFAULT_STEP_REGEX


@dataclass(frozen=True)
class Checkpoint:
    path: str
    step: int | None
    mtime: float
    size: int

    def as_dict(self) -> dict:
        return {"path": self.path, "step": self.step, "mtime": self.mtime, "size_bytes": self.size}


def parse_step(name: str, regex: str) -> int | None:
    """The step number in a checkpoint name: the named group ``step`` if the regex has one, else group 1."""
    match = re.search(regex, name)
    if match is None:
        return None
    value = match.groupdict().get("step") if "step" in match.re.groupindex else match.group(1)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def entry_size(path: str) -> tuple:
    """Total bytes and file count below ``path`` (a file or a directory); files vanishing meanwhile are skipped."""
    if not os.path.isdir(path):
        try:
            return os.path.getsize(path), 1
        except OSError:
            return 0, 0
    total = 0
    count = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for filename in filenames:
            try:
                total += os.path.getsize(os.path.join(dirpath, filename))
                count += 1
            except OSError:
                continue
    return total, count


def list_entries(spec: CheckpointSpec) -> dict:
    """Entries of the checkpoint directory matching the glob, mapped to their modification time in nanoseconds."""
    try:
        names = os.listdir(spec.directory)
    except FileNotFoundError:
        return {}
    entries = {}
    for name in names:
        if not fnmatch.fnmatchcase(name, spec.pattern):
            continue
        path = os.path.join(spec.directory, name)
        try:
            entries[path] = os.stat(path).st_mtime_ns
        except OSError:
            continue
    return entries


class CheckpointWatcher:
    """Call ``take_baseline`` just before requesting a checkpoint, then ``poll`` or ``wait``.

    A checkpoint counts as new when its entry did not exist at the baseline or was modified since. It is complete when
    ``marker`` exists inside it or, without a marker, when its total size is non-zero and has not changed for
    ``stable_seconds``.
    """

    def __init__(
        self,
        spec: CheckpointSpec,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.spec = spec
        self.clock = clock
        self.sleep = sleep
        self.baseline = {}
        self._sizes = {}  # path -> (size, file count, clock when this size was first seen)

    def take_baseline(self) -> None:
        self.baseline = list_entries(self.spec)
        self._sizes = {}

    def _is_new(self, path: str, mtime_ns: int) -> bool:
        before = self.baseline.get(path)
        return before is None or mtime_ns > before

    def _is_complete(self, path: str) -> tuple:
        size, count = entry_size(path)
        if self.spec.marker:
            return os.path.isdir(path) and os.path.exists(os.path.join(path, self.spec.marker)), size
        now = self.clock()
        previous = self._sizes.get(path)
        if previous is None or previous[:2] != (size, count):
            self._sizes[path] = (size, count, now)
            return False, size
        return size > 0 and now - previous[2] >= self.spec.stable_seconds, size

    def poll(self) -> Checkpoint | None:
        """The best complete new checkpoint right now: highest step, then newest."""
        complete = []
        for path, mtime_ns in list_entries(self.spec).items():
            if not self._is_new(path, mtime_ns):
                continue
            done, size = self._is_complete(path)
            if done:
                step = parse_step(os.path.basename(path), self.spec.step_regex)
                complete.append(Checkpoint(path=path, step=step, mtime=mtime_ns / 1e9, size=size))
        if not complete:
            return None
        return max(complete, key=lambda item: (item.step if item.step is not None else -1, item.mtime))

    def newest_before(self) -> Checkpoint | None:
        """The best checkpoint that already existed at the baseline: highest step, then newest. Complete means the
        marker exists or, without a marker, a non-zero size (an old entry is not watched for stability)."""
        found = []
        for path, mtime_ns in self.baseline.items():
            size, _count = entry_size(path)
            complete = os.path.exists(os.path.join(path, self.spec.marker)) if self.spec.marker else size > 0
            if complete:
                step = parse_step(os.path.basename(path), self.spec.step_regex)
                found.append(Checkpoint(path=path, step=step, mtime=mtime_ns / 1e9, size=size))
        if not found:
            return None
        return max(found, key=lambda item: (item.step if item.step is not None else -1, item.mtime))

    def pending(self) -> list:
        """New entries seen so far that are not complete yet (for the failure message)."""
        return sorted(path for path, mtime_ns in list_entries(self.spec).items() if self._is_new(path, mtime_ns))

    def wait(self, timeout: float, poll_interval: float) -> Checkpoint | None:
        deadline = self.clock() + timeout
        while True:
            found = self.poll()
            if found is not None:
                return found
            remaining = deadline - self.clock()
            if remaining <= 0:
                return None
            self.sleep(min(poll_interval, remaining))


def latest_step_in_log(path: str, regex: str, tail_bytes: int) -> tuple:
    """Last training step in the final ``tail_bytes`` of a log, with the line it came from.

    Progress bars rewrite lines with carriage returns, so both ``\\r`` and ``\\n`` end a line.
    Returns (step or None, line or None).
    """
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        start = max(0, size - tail_bytes)
        handle.seek(start)
        data = handle.read().decode("utf-8", "replace")
    lines = re.split(r"[\r\n]+", data)
    if start > 0:
        lines = lines[1:]  # the first line of a tail is usually cut
    compiled = re.compile(regex)
    for line in reversed(lines):
        match = compiled.search(line)
        if match is None:
            continue
        step = parse_step(line, regex)
        if step is not None:
            return step, line.strip()
    return None, None
