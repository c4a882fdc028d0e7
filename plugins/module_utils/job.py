# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Find a training job's processes exactly and follow them as they re-parent, fork and exit."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ansible_collections.pivot.ops.plugins.module_utils.procfs import (
    ProcessInfo,
    ProcFS,
    ancestors_of,
    descendants_of,
    in_cgroup,
)
from ansible_collections.pivot.ops.plugins.module_utils.systemd_unit import UnitStatus


class JobError(Exception):
    """The job cannot be identified safely; ``candidates`` lists the processes involved."""

    def __init__(self, message: str, candidates: list | None = None) -> None:
        super().__init__(message)
        self.candidates = candidates or []


@dataclass
class JobSpec:
    """How the job is selected. Exactly one of ``pidfile``, ``unit`` or ``cmdline_match`` is the primary selector;
    ``cmdline_match`` may accompany ``pidfile`` as a guard against a recycled PID."""

    pidfile: str | None = None
    unit: UnitStatus | None = None  # the unit's state as SystemdUnit.status read it
    cmdline_match: list = field(default_factory=list)
    match_env: list = field(default_factory=list)
    max_roots: int = 1


def element_matches(argv_element: str, wanted: str) -> bool:
    """``wanted`` equals the argv element, or, when ``wanted`` is a bare file name (no ``/``), the argv element is a
    path to that file: ``train.py`` matches ``/root/train.py`` and ``./train.py``, never ``mytrain.py``,
    ``/root/train.py.bak``, an option such as ``--config=/root/train.py`` or code such as
    ``-c "...; /root/train.py"``."""
    if argv_element == wanted:
        return True
    looks_like_path = ("/" in argv_element and not argv_element.startswith("-") and "=" not in argv_element
                       and not any(char.isspace() for char in argv_element))
    if "/" in wanted or not looks_like_path:
        return False
    return os.path.basename(argv_element) == wanted


def argv_matches(argv: tuple, wanted: list) -> bool:
    """Every wanted element must match one argv element (:func:`element_matches`); no substring or pattern
    matching."""
    return bool(wanted) and all(any(element_matches(arg, element) for arg in argv) for element in wanted)


def describe(info: ProcessInfo) -> dict:
    return {"pid": info.pid, "ppid": info.ppid, "cmdline": info.command}


def parse_env_selectors(entries: list) -> tuple:
    """Split ``match_env`` into names whose values are learned from the job and fixed NAME=VALUE pairs."""
    learned_names = []
    fixed_pairs = set()
    for entry in entries:
        name, sep, value = entry.partition("=")
        if not name:
            raise JobError("match_env entry %r has no variable name; use NAME or NAME=VALUE." % entry)
        if sep:
            fixed_pairs.add((name, value))
        else:
            learned_names.append(name)
    return learned_names, fixed_pairs


def independent_roots(matched: list, table: dict) -> list:
    """Matched PIDs that do not descend from another matched PID (one per job tree)."""
    matched_set = set(matched)
    roots = []
    for pid in matched:
        ancestors = ancestors_of(pid, table)[1:]
        if not matched_set.intersection(ancestors):
            roots.append(pid)
    return roots


def protected_pids(proc: ProcFS, own_pid: int | None = None) -> set:
    """PID 1, this process and its ancestors: never part of a job, whatever matched."""
    own = os.getpid() if own_pid is None else own_pid
    return {1, *ancestors_of(own, {}, proc)}


class JobTracker:
    """Discovers the job and remembers every process ever seen in it, so later scans still find workers that were
    re-parented to PID 1 or a subreaper after their launcher died."""

    def __init__(self, spec: JobSpec, proc: ProcFS, protected: set) -> None:
        self.spec = spec
        self.proc = proc
        self.protected = set(protected)
        self.learned_names, self.fixed_pairs = parse_env_selectors(spec.match_env)
        self.known = {}  # pid -> ProcessInfo when first seen
        self.reasons = {}  # pid -> why it belongs to the job
        self.learned_pairs = set(self.fixed_pairs)
        self.notes = []

    # --- selecting the roots -------------------------------------------------------------------------------------

    def _pidfile_roots(self, table: dict) -> list:
        path = self.spec.pidfile
        try:
            with open(path) as handle:
                content = handle.read().strip()
        except FileNotFoundError:
            self.notes.append("pidfile %s does not exist" % path)
            return []
        except OSError as exc:
            raise JobError("Cannot read pidfile %s: %s. Check the path and permissions." % (path, exc)) from exc
        first_line = content.splitlines()[0].strip() if content else ""
        if not first_line.isdigit() or int(first_line) <= 0:
            raise JobError(
                "pidfile %s does not contain a PID (found %r); point pidfile at the file the launcher writes its PID "
                "to." % (path, content[:80])
            )
        pid = int(first_line)
        info = table.get(pid)
        if info is None or info.is_zombie:
            self.notes.append("pidfile %s names PID %d, which is not running (stale pidfile)" % (path, pid))
            return []
        if self.spec.cmdline_match and not argv_matches(info.argv, self.spec.cmdline_match):
            self.notes.append(
                "pidfile %s names PID %d, which now runs %r and does not match cmdline_match; treating the pidfile as "
                "stale" % (path, pid, info.command)
            )
            return []
        return [pid]

    def _unit_members(self, table: dict) -> list:
        unit = self.spec.unit
        members = []
        for pid, info in table.items():
            if pid in self.protected or info.is_zombie:
                continue
            if in_cgroup(self.proc.cgroup(pid), unit.control_group):
                members.append(pid)
        # MainPID is only trusted before anything was stopped: afterwards the number may belong to a new process.
        if not self.known and unit.main_pid and unit.main_pid in table and unit.main_pid not in members:
            members.append(unit.main_pid)
        return sorted(members)

    def _cmdline_roots(self, table: dict) -> list:
        matched = [
            pid
            for pid, info in sorted(table.items())
            if not info.is_zombie and argv_matches(info.argv, self.spec.cmdline_match)
        ]
        return independent_roots(matched, table)

    def select_roots(self, table: dict) -> list:
        if self.spec.pidfile:
            return self._pidfile_roots(table)
        if self.spec.unit is not None:
            return self._unit_members(table)
        return self._cmdline_roots(table)

    def _check_roots(self, roots: list, table: dict) -> None:
        refused = [table[pid] for pid in roots if pid in self.protected]
        if refused:
            raise JobError(
                "Refusing to act: the selection matches PID 1 or an ancestor of this module (%s). Select the training "
                "job more precisely." % ", ".join("%d %r" % (info.pid, info.command) for info in refused),
                [describe(info) for info in refused],
            )
        if self.spec.unit is None and len(roots) > self.spec.max_roots:
            candidates = [describe(table[pid]) for pid in roots]
            raise JobError(
                "The selection is ambiguous: %d independent process trees match but max_roots is %d. Candidates: %s. "
                "Use a pidfile, a more specific cmdline_match, or raise max_roots if all of them belong to the job."
                % (
                    len(roots),
                    self.spec.max_roots,
                    "; ".join("PID %d: %s" % (item["pid"], item["cmdline"]) for item in candidates),
                ),
                candidates,
            )

    # --- expanding to the whole job ------------------------------------------------------------------------------

    def _same_process(self, pid: int, table: dict) -> bool:
        known = self.known.get(pid)
        current = table.get(pid)
        return known is not None and current is not None and current.start_time == known.start_time

    def _leader_keys(self, table: dict) -> set:
        """Session/group IDs led by job processes. A dead leader's ID still identifies its session as long as no new
        process reuses the PID (the kernel does not hand out a PID still in use as a session or group ID)."""
        keys = set()
        for pid in self.known:
            if pid not in table or self._same_process(pid, table):
                keys.add(pid)
        return keys

    def _learn_env(self, pids: set) -> None:
        if not self.learned_names:
            return
        for pid in pids:
            env = self.proc.environ(pid) or {}
            for name in self.learned_names:
                if name in env:
                    self.learned_pairs.add((name, env[name]))

    def _env_matches(self, pid: int) -> bool:
        if not self.learned_pairs:
            return False
        env = self.proc.environ(pid)
        if not env:
            return False
        return any(env.get(name) == value for name, value in self.learned_pairs)

    def _add(self, info: ProcessInfo, reason: str) -> None:
        if info.pid not in self.known:
            self.known[info.pid] = info
            self.reasons[info.pid] = reason

    def _expand(self, members: set, table: dict) -> set:
        """Grow ``members`` to a fixed point over descendants, sessions/groups led by members, the unit's cgroup and
        the job's environment variables."""
        unit_group = self.spec.unit.control_group if self.spec.unit is not None else ""
        checked_env = set()
        while True:
            known_pairs = len(self.learned_pairs)
            self._learn_env(members)
            if len(self.learned_pairs) != known_pairs:
                checked_env = set()
            leader_keys = self._leader_keys(table) | members
            added = {}
            for pid in descendants_of(members, table):
                added.setdefault(pid, "descendant")
            for pid, info in table.items():
                if pid in members or pid in added:
                    continue
                if info.sid in leader_keys or info.pgid in leader_keys:
                    added[pid] = "session"
                elif unit_group and in_cgroup(self.proc.cgroup(pid), unit_group):
                    added[pid] = "cgroup"
                elif pid not in checked_env and self._env_matches(pid):
                    added[pid] = "environment"
                checked_env.add(pid)
            added = {pid: reason for pid, reason in added.items() if pid not in self.protected}
            if not added:
                return members
            for pid, reason in added.items():
                self._add(table[pid], reason)
            members = members | set(added)

    def scan(self, first: bool = False) -> dict:
        """Return the job's live processes (zombies excluded) keyed by PID.

        The first scan validates the selection (ambiguity, PID 1, ancestors) and raises ``JobError``; later scans
        also re-apply the selector, so a launcher that respawns its trainer is caught.
        """
        table = self.proc.table()
        roots = self.select_roots(table)
        if first:
            self._check_roots(roots, table)
        else:
            # A pidfile keeps naming its PID after the job is gone; only a process already known by identity counts.
            roots = [
                pid
                for pid in roots
                if pid not in self.protected and (not self.spec.pidfile or self._same_process(pid, table))
            ]
        for pid in roots:
            self._add(table[pid], "selected")
        remembered = {pid for pid in self.known if self._same_process(pid, table)}
        members = self._expand(set(roots) | remembered, table)
        return {pid: table[pid] for pid in sorted(members) if pid in table and not table[pid].is_zombie}

    def roots(self) -> list:
        return sorted(pid for pid, reason in self.reasons.items() if reason == "selected")
