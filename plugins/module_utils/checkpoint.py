# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Watch a checkpoint directory for a checkpoint that is newer than a request and complete.

Two definitions of "complete":

* with a marker file (``CheckpointSpec.marker``): the marker exists inside the checkpoint directory. The trainer
  writes it last, so this is exact.
* without one (the trainer's own file pattern only): the checkpoint *settled*. Its signature (total size, number of
  files, newest modification time of anything inside it) stayed the same for ``settle_seconds`` of observation, it is
  not empty, and no process has a file inside it open for writing. One with fewer files than the newest checkpoint
  before the request (a save that may be paused between two files) must stay unchanged ``FEW_FILES_FACTOR`` times as
  long. This is weaker than a marker: a trainer that pauses longer than that between two files of one save without
  holding a file open looks complete too early, and a save cut short by a crash after the request looks complete once
  it stops changing. Callers therefore also check that the job is still running when they accept such a checkpoint.

A checkpoint is *new* when its entry did not exist when ``take_baseline`` ran, or its signature changed since. A
half-written entry left behind by an earlier, killed trainer keeps its signature and so never counts as new.
"""

from __future__ import annotations

import fnmatch
import os
import re
import time
from dataclasses import dataclass
from typing import Callable

DEFAULT_STEP_REGEX = r"(\d+)(?!.*\d)"
DEFAULT_SETTLE_SECONDS = 30.0
# A new checkpoint with fewer files than the newest one before the request must stay unchanged this many times as long.
FEW_FILES_FACTOR = 3

# States of a new checkpoint entry, as EntryState.state.
WRITING = "growing"  # its signature changed since the last poll, or a process has a file in it open for writing
SETTLING = "settling"  # unchanged, but not yet for settle_seconds (no marker)
NO_MARKER = "no marker yet"  # marker mode: the marker is not there
EMPTY = "empty"  # no marker: settled with nothing in it
COMPLETE = "complete"

O_ACCMODE = 0o3
O_WRONLY = 0o1
O_RDWR = 0o2


@dataclass(frozen=True)
class CheckpointSpec:
    directory: str
    pattern: str = "*"
    marker: str | None = None
    settle_seconds: float = DEFAULT_SETTLE_SECONDS
    step_regex: str = DEFAULT_STEP_REGEX


@dataclass(frozen=True)
class Signature:
    """What "unchanged" is measured by: total bytes, file count, newest mtime of the entry or anything inside it."""

    size: int
    files: int
    newest_mtime_ns: int


@dataclass(frozen=True)
class Checkpoint:
    path: str
    step: int | None
    mtime: float
    size: int

    def as_dict(self) -> dict:
        return {"path": self.path, "step": self.step, "mtime": self.mtime, "size_bytes": self.size}


@dataclass(frozen=True)
class EntryState:
    """A new checkpoint entry at one poll."""

    path: str
    step: int | None
    signature: Signature
    state: str
    unchanged_for: float  # seconds its signature has been the same, as observed by this watcher
    settle_for: float = 0.0  # how long it must stay unchanged (no marker): settle_seconds, longer with fewer files

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.path, self.step, self.signature.newest_mtime_ns / 1e9, self.signature.size)


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


def _stat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def entry_signature(path: str) -> Signature | None:
    """Signature of a checkpoint entry (a file or a directory tree); None when it vanished. Files vanishing while the
    tree is read are skipped."""
    top = _stat_or_none(path)
    if top is None:
        return None
    if not os.path.isdir(path):
        return Signature(top.st_size, 1, top.st_mtime_ns)
    size = 0
    files = 0
    newest = top.st_mtime_ns
    for dirpath, dirnames, filenames in os.walk(path):
        for dirname in dirnames:
            found = _stat_or_none(os.path.join(dirpath, dirname))
            if found is not None:
                newest = max(newest, found.st_mtime_ns)
        for filename in filenames:
            found = _stat_or_none(os.path.join(dirpath, filename))
            if found is not None:
                size += found.st_size
                files += 1
                newest = max(newest, found.st_mtime_ns)
    return Signature(size, files, newest)


def list_entries(spec: CheckpointSpec) -> list:
    """Paths in the checkpoint directory whose names match the glob."""
    try:
        names = os.listdir(spec.directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(os.path.join(spec.directory, name) for name in names if fnmatch.fnmatchcase(name, spec.pattern))


def writers_inside(path: str, proc_root: str = "/proc") -> list:
    """PIDs that have a file at or below ``path`` open for writing (from /proc/<pid>/fd and fdinfo)."""
    prefix = os.path.realpath(path)
    found = []
    try:
        pids = [name for name in os.listdir(proc_root) if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        fd_dir = os.path.join(proc_root, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            if _fd_writes_below(os.path.join(fd_dir, fd), os.path.join(proc_root, pid, "fdinfo", fd), prefix):
                found.append(int(pid))
                break
    return sorted(found)


def _fd_writes_below(link: str, fdinfo: str, prefix: str) -> bool:
    try:
        target = os.readlink(link)
    except OSError:
        return False
    if target != prefix and not target.startswith(prefix + os.sep):
        return False
    try:
        with open(fdinfo) as handle:
            for line in handle:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & O_ACCMODE in (O_WRONLY, O_RDWR)
    except (OSError, ValueError, IndexError):
        return False
    return False


def best(checkpoints: list) -> Checkpoint | None:
    """Highest step, then newest."""
    if not checkpoints:
        return None
    return max(checkpoints, key=lambda item: (item.step if item.step is not None else -1, item.mtime))


class CheckpointWatcher:
    """Call ``take_baseline`` just before requesting a checkpoint, then ``poll`` repeatedly and ``accept`` its states.

    ``writers`` tells which PIDs hold a file below a path open for writing (injectable for tests).
    """

    def __init__(
        self,
        spec: CheckpointSpec,
        clock: Callable[[], float] = time.monotonic,
        writers: Callable[[str], list] = writers_inside,
    ) -> None:
        self.spec = spec
        self.clock = clock
        self.writers = writers
        self.baseline = {}  # path -> Signature at the baseline
        self.reference = None  # (name, file count) of the newest non-empty checkpoint at the baseline (no-marker rule)
        self._seen = {}  # path -> (Signature, clock when first seen with it)

    # --- baseline ---------------------------------------------------------------------------------------------

    def _by_step(self, entries: dict) -> list:
        """(path, Signature) of non-empty entries, highest step (then newest) first."""
        found = [(path, sig) for path, sig in entries.items() if sig.size > 0]
        return sorted(found, key=lambda item: (self._step(item[0]), item[1].newest_mtime_ns), reverse=True)

    def _step(self, path: str) -> int:
        step = parse_step(os.path.basename(path), self.spec.step_regex)
        return -1 if step is None else step

    def take_baseline(self) -> None:
        self.baseline = {}
        for path in list_entries(self.spec):
            signature = entry_signature(path)
            if signature is not None:
                self.baseline[path] = signature
        ordered = self._by_step(self.baseline)
        self.reference = (os.path.basename(ordered[0][0]), ordered[0][1].files) if ordered else None
        self._seen = {}

    def newest_before(self) -> Checkpoint | None:
        """The best checkpoint that already existed at the baseline: what a stop without a new one leaves to resume
        from. With a marker: the marker exists. Without: the highest step that is not empty, has no file open for
        writing (a save in progress) and has at least as many files as the next lower one (a killed save's debris
        has fewer)."""
        if self.spec.marker:
            found = [Checkpoint(path, parse_step(os.path.basename(path), self.spec.step_regex),
                                sig.newest_mtime_ns / 1e9, sig.size)
                     for path, sig in self.baseline.items()
                     if os.path.isdir(path) and os.path.exists(os.path.join(path, self.spec.marker))]
            return best(found)
        ordered = self._by_step(self.baseline)
        for index, (path, sig) in enumerate(ordered):
            lower = ordered[index + 1][1].files if index + 1 < len(ordered) else 0
            if sig.files >= lower and not self.writers(path):
                return Checkpoint(path, parse_step(os.path.basename(path), self.spec.step_regex),
                                  sig.newest_mtime_ns / 1e9, sig.size)
        return None

    # --- polling ----------------------------------------------------------------------------------------------

    def _is_new(self, path: str, signature: Signature) -> bool:
        return self.baseline.get(path) != signature

    def _observe(self, path: str, signature: Signature, now: float) -> tuple:
        """(changed since the last poll, seconds unchanged)."""
        previous = self._seen.get(path)
        if previous is None or previous[0] != signature:
            self._seen[path] = (signature, now)
            return previous is not None, 0.0
        return False, now - previous[1]

    def settle_for(self, signature: Signature) -> float:
        """How long a new entry must stay unchanged: longer when it has fewer files than the newest one before."""
        if self.reference is not None and signature.files < self.reference[1]:
            return self.spec.settle_seconds * FEW_FILES_FACTOR
        return self.spec.settle_seconds

    def _state(self, path: str, signature: Signature, changed: bool, unchanged_for: float) -> tuple:
        """(state, unchanged_for) of a new entry; a writer found restarts the settle period."""
        if self.spec.marker:
            if os.path.isdir(path) and os.path.exists(os.path.join(path, self.spec.marker)):
                return COMPLETE, unchanged_for
            return (WRITING if changed else NO_MARKER), unchanged_for
        if changed:
            state = WRITING
        elif unchanged_for < self.settle_for(signature):
            state = SETTLING
        elif signature.size == 0:
            state = EMPTY
        elif self.writers(path):
            self._seen[path] = (signature, self.clock())
            state, unchanged_for = WRITING, 0.0
        else:
            state = COMPLETE
        return state, unchanged_for

    def poll(self) -> list:
        """New entries and their states, lowest step first."""
        now = self.clock()
        states = []
        for path in list_entries(self.spec):
            signature = entry_signature(path)
            if signature is None or not self._is_new(path, signature):
                continue
            changed, unchanged_for = self._observe(path, signature, now)
            state, unchanged_for = self._state(path, signature, changed, unchanged_for)
            step = parse_step(os.path.basename(path), self.spec.step_regex)
            states.append(EntryState(path, step, signature, state, unchanged_for, self.settle_for(signature)))
        return sorted(states, key=lambda item: (item.step if item.step is not None else -1, item.path))

    def accept(self, states: list) -> Checkpoint | None:
        """The checkpoint to stop after, if any: the best complete new one. Without a marker, only once no other new
        entry is still growing or settling (a stop in the middle of the next save would leave a torn checkpoint with
        the highest step)."""
        complete = [entry.checkpoint() for entry in states if entry.state == COMPLETE]
        if not complete:
            return None
        if not self.spec.marker and any(entry.state in (WRITING, SETTLING) for entry in states):
            return None
        return best(complete)

    def pending(self, states: list) -> list:
        """New entries that are not complete (for the failure message), with their state."""
        return ["%s (%s)" % (entry.path, entry.state) for entry in states if entry.state != COMPLETE]


def format_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return ("%d %s" % (value, unit)) if unit == "B" else ("%.1f %s" % (value, unit))
        value /= 1024
    return "%d B" % size  # unreachable


def describe_entry(entry: EntryState, reference: tuple | None = None) -> str:
    """``step_000005400 (growing, 1.2 GiB)``, ``step_000005400 (settling 12 of 30 s, 1.2 GiB)``."""
    state = entry.state
    if state == SETTLING:
        state = "settling %d of %d s" % (entry.unchanged_for, entry.settle_for)
        if reference is not None and entry.signature.files < reference[1]:
            state += ", %d files, %s had %d" % (entry.signature.files, reference[0], reference[1])
    return "%s (%s, %s)" % (entry.name, state, format_bytes(entry.signature.size))


def describe_wait(states: list, previous: Checkpoint | None, reference: tuple | None = None) -> str:
    """What the wait has seen so far, for a progress line: the newest new entry, or that none appeared yet."""
    if states:
        newest = max(states, key=lambda item: (
            item.step if item.step is not None else -1, item.signature.newest_mtime_ns))
        return "newest %s" % describe_entry(newest, reference)
    if previous is not None:
        return "no new one yet (newest before the request: %s)" % os.path.basename(previous.path)
    return "no new one yet"


DISK_FULL = re.compile(r"No space left on device|ENOSPC|Disk quota exceeded|EDQUOT")


def _log_tail_lines(path: str, tail_bytes: int) -> list:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        start = max(0, size - tail_bytes)
        handle.seek(start)
        data = handle.read().decode("utf-8", "replace")
    lines = re.split(r"[\r\n]+", data)
    return lines[1:] if start > 0 else lines  # the first line of a tail is usually cut


def disk_full_in_log(path: str, tail_bytes: int) -> str | None:
    """The last line in the final ``tail_bytes`` of a log that says a disk is full (ENOSPC, a quota), or None."""
    try:
        lines = _log_tail_lines(path, tail_bytes)
    except OSError:
        return None
    for line in reversed(lines):
        if DISK_FULL.search(line):
            return line.strip()
    return None


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem of ``path``; None when it cannot be read."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def latest_step_in_log(path: str, regex: str, tail_bytes: int) -> tuple:
    """Last training step in the final ``tail_bytes`` of a log, with the line it came from.

    Progress bars rewrite lines with carriage returns, so both ``\\r`` and ``\\n`` end a line.
    Returns (step or None, line or None).
    """
    lines = _log_tail_lines(path, tail_bytes)
    compiled = re.compile(regex)
    for line in reversed(lines):
        match = compiled.search(line)
        if match is None:
            continue
        step = parse_step(line, regex)
        if step is not None:
            return step, line.strip()
    return None, None
