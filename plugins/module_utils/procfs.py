# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Read the Linux process table from /proc without third-party libraries.

Every reader tolerates processes that exit while being read: they simply disappear from the result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

ZOMBIE_STATES = ("Z", "X", "x")


@dataclass(frozen=True)
class ProcessInfo:
    """One process as seen in /proc/<pid>/stat and /proc/<pid>/cmdline."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start_time: int
    comm: str
    argv: tuple = field(default_factory=tuple)

    @property
    def is_zombie(self) -> bool:
        return self.state in ZOMBIE_STATES

    @property
    def is_kernel_thread(self) -> bool:
        # Kernel threads have no command line and descend from kthreadd (PID 2).
        return self.pid == 2 or self.ppid == 2

    @property
    def command(self) -> str:
        if self.argv:
            return " ".join(self.argv)
        return "[%s]" % self.comm


def parse_stat(text: str) -> tuple:
    """Split /proc/<pid>/stat into (pid, comm, fields after the command name).

    The command name is in parentheses and may itself contain spaces and parentheses, so the split is done at the last
    closing parenthesis.
    """
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    pid = int(text[:open_paren].strip())
    comm = text[open_paren + 1 : close_paren]
    rest = text[close_paren + 2 :].split()
    return pid, comm, rest


def parse_cmdline(raw: bytes) -> tuple:
    if not raw:
        return ()
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts = parts[:-1]
    return tuple(part.decode("utf-8", "replace") for part in parts)


def parse_environ(raw: bytes) -> dict:
    env = {}
    for entry in raw.split(b"\0"):
        if not entry or b"=" not in entry:
            continue
        name, _separator, value = entry.partition(b"=")
        env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def parse_signal_mask(status_text: str, key: str) -> int:
    """Return the hexadecimal signal mask on the line ``key:`` of /proc/<pid>/status (0 when absent)."""
    prefix = key + ":"
    for line in status_text.splitlines():
        if line.startswith(prefix):
            return int(line[len(prefix) :].strip(), 16)
    return 0


class ProcFS:
    """Reads processes from a proc file system; ``root`` is configurable so tests can point it at a fake tree."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root

    def _read_bytes(self, pid: int, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.root, str(pid), name), "rb") as handle:
                return handle.read()
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            return None
        except OSError:
            # ESRCH and similar races while a process exits.
            return None

    def pids(self) -> list:
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return sorted(int(name) for name in names if name.isdigit())

    def read(self, pid: int) -> ProcessInfo | None:
        raw_stat = self._read_bytes(pid, "stat")
        if raw_stat is None:
            return None
        try:
            parsed_pid, comm, rest = parse_stat(raw_stat.decode("utf-8", "replace"))
            info = ProcessInfo(
                pid=parsed_pid,
                state=rest[0],
                ppid=int(rest[1]),
                pgid=int(rest[2]),
                sid=int(rest[3]),
                start_time=int(rest[19]),
                comm=comm,
                argv=parse_cmdline(self._read_bytes(pid, "cmdline") or b""),
            )
        except (ValueError, IndexError):
            return None
        return info

    def table(self) -> dict:
        """Every readable process, kernel threads excluded, keyed by PID."""
        processes = {}
        for pid in self.pids():
            info = self.read(pid)
            if info is not None and not info.is_kernel_thread:
                processes[pid] = info
        return processes

    def environ(self, pid: int) -> dict | None:
        raw = self._read_bytes(pid, "environ")
        if raw is None:
            return None
        return parse_environ(raw)

    def cgroup(self, pid: int) -> str | None:
        raw = self._read_bytes(pid, "cgroup")
        if raw is None:
            return None
        return raw.decode("utf-8", "replace")

    def signal_masks(self, pid: int) -> dict | None:
        """Return the caught, ignored and blocked signal masks of a process (``SigCgt``, ``SigIgn``, ``SigBlk``)."""
        raw = self._read_bytes(pid, "status")
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace")
        return {key: parse_signal_mask(text, key) for key in ("SigCgt", "SigIgn", "SigBlk")}


def catches_signal(masks: dict | None, signum: int) -> bool:
    """True when the process installed a handler for ``signum`` (bit ``signum - 1`` of SigCgt)."""
    if not masks:
        return False
    return bool(masks.get("SigCgt", 0) & (1 << (signum - 1)))


def ancestors_of(pid: int, table: dict, proc: ProcFS | None = None) -> list:
    """PIDs from ``pid`` up to the root of its tree, ``pid`` first.

    Processes missing from ``table`` are read from ``proc`` when given (the table may exclude nothing relevant, but the
    module's own ancestors must be found even if the table was filtered).
    """
    chain = []
    seen = set()
    current = pid
    while current > 0 and current not in seen:
        seen.add(current)
        chain.append(current)
        info = table.get(current)
        if info is None and proc is not None:
            info = proc.read(current)
        if info is None:
            break
        current = info.ppid
    return chain


def descendants_of(roots: set, table: dict) -> set:
    """All PIDs in ``table`` whose parent chain reaches one of ``roots`` (the roots themselves excluded)."""
    children = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found and child not in roots:
                found.add(child)
                stack.append(child)
    return found


def cgroup_paths(cgroup_text: str) -> list:
    """Cgroup paths that systemd uses for units: the v2 line ``0::`` and the v1 ``name=systemd`` hierarchy."""
    paths = []
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if (hierarchy == "0" and controllers == "") or "name=systemd" in controllers.split(","):
            paths.append(path)
    return paths


def in_cgroup(cgroup_text: str | None, control_group: str) -> bool:
    """Whether a process whose /proc/<pid>/cgroup is ``cgroup_text`` lives in ``control_group`` or below it."""
    if not cgroup_text or not control_group:
        return False
    wanted = control_group.rstrip("/")
    return any(path == wanted or path.startswith(wanted + "/") for path in cgroup_paths(cgroup_text))


def service_of_cgroup(cgroup_text: str | None) -> str | None:
    """The systemd service (``name.service``) whose control group holds a process, from its /proc/<pid>/cgroup."""
    for path in cgroup_paths(cgroup_text or ""):
        for part in reversed(path.split("/")):
            if part.endswith(".service"):
                return part
    return None
