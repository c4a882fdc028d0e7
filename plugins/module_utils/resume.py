# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Restart a training job from a recorded checkpoint: the command from its template, whether the checkpoint is still
usable, whether the restarted job really trains, and the host's record of the job Pivot started (so that a second run
recognises it, and a job Pivot did not start is refused instead of duplicated).

A job "really trains" when (1) it has at least the expected number of processes, (2) its log shows, in what was written
since the start, a step after the checkpoint's step, and (3) every expected GPU has memory in use. A first logged step
at or below the checkpoint's step means the trainer did not resume from it (it started over, or from elsewhere).
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from typing import Callable

from ansible_collections.pivot.ops.plugins.module_utils.checkpoint import (
    CheckpointSpec,
    entry_signature,
    list_entries,
    parse_step,
    writers_inside,
)
from ansible_collections.pivot.ops.plugins.module_utils.procfs import ProcessInfo, service_of_cgroup

PLACEHOLDER = re.compile(r"\{(checkpoint|checkpoint_name|step)\}")
RECORD_NAME = "resume.json"
LOG_WINDOW = 65536  # bytes read at each end of what the log gained since the start

TRAINING = "training"  # every condition holds
STARTING = "starting"  # not yet: some condition does not hold yet
DIED = "died"  # nothing of the job is left
NOT_RESUMED = "not resumed"  # it logged a step at or below the checkpoint's: it did not resume from it


class ResumeError(Exception):
    """Something makes the resume impossible; the message says what and what to do."""


# --- the command --------------------------------------------------------------------------------------------------


def render_command(template: list, checkpoint: str, step: int | None) -> list:
    """The argv to run: ``{checkpoint}``, ``{checkpoint_name}`` and ``{step}`` replaced in each element (other braces
    are left alone; there is no shell)."""
    if step is None and any("{step}" in element for element in template):
        raise ResumeError(
            "The resume command uses {step}, but the step of checkpoint %s is unknown (no number in its name and none "
            "recorded). Use {checkpoint} instead, or name a checkpoint whose step is known." % checkpoint
        )
    values = {
        "checkpoint": checkpoint,
        "checkpoint_name": os.path.basename(checkpoint.rstrip("/")),
        "step": "" if step is None else str(step),
    }
    return [PLACEHOLDER.sub(lambda match: values[match.group(1)], element) for element in template]


def names_checkpoint(template: list) -> bool:
    """Whether the template passes the checkpoint (its path, name or step) to the job at all."""
    return any(PLACEHOLDER.search(element) for element in template)


# --- the checkpoint -----------------------------------------------------------------------------------------------


def checkpoint_problem(
    path: str,
    marker: str | None,
    size_bytes: int | None,
    writers: Callable[[str], list] = writers_inside,
) -> str | None:
    """Why the checkpoint cannot be resumed from (a phrase that follows its path), or None when it can."""
    if not os.path.lexists(path):
        return "is gone: nothing is at that path any more"
    if marker and not os.path.exists(os.path.join(path, marker)):
        return "is incomplete: its completion marker %s is missing" % marker
    signature = entry_signature(path)
    if signature is None or signature.size == 0:
        return "is empty"
    if size_bytes is not None and signature.size != size_bytes:
        return "changed since the stop confirmed it: %d bytes then, %d now" % (size_bytes, signature.size)
    busy = writers(path)
    if busy:
        return "is being written by PID %s" % ", ".join(str(pid) for pid in busy)
    return None


def newer_checkpoints(
    checkpoint: str, pattern: str, marker: str | None, step_regex: str, step: int | None
) -> list:
    """Complete checkpoints beside ``checkpoint`` with a higher step, as (path, step), highest first. Without a marker,
    one with fewer files than ``checkpoint`` is a torn save and does not count."""
    if step is None:
        return []
    directory = os.path.dirname(checkpoint.rstrip("/"))
    own = entry_signature(checkpoint)
    own_files = own.files if own is not None else 0
    found = []
    for path in list_entries(CheckpointSpec(directory, pattern)):
        other = parse_step(os.path.basename(path), step_regex)
        if other is None or other <= step or not _complete(path, marker, own_files):
            continue
        found.append((path, other))
    return sorted(found, key=lambda item: -item[1])


def _complete(path: str, marker: str | None, min_files: int) -> bool:
    if marker:
        return os.path.exists(os.path.join(path, marker))
    signature = entry_signature(path)
    return signature is not None and signature.size > 0 and signature.files >= min_files


# --- the log ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogSteps:
    """Steps in what a log gained since an offset: the first and the last, and the line of the last."""

    first: int | None
    last: int | None
    last_line: str | None
    size: int


def _complete_lines(data: bytes, cut_first: bool) -> list:
    """Lines that are whole: the part after the last line end is still being written; the first part of a window that
    starts inside the file may be the end of a longer line."""
    lines = re.split(r"[\r\n]", data.decode("utf-8", "replace"))
    lines = lines[:-1]
    return lines[1:] if cut_first else lines


def _step_lines(lines: list, regex: str) -> list:
    compiled = re.compile(regex)
    found = []
    for line in lines:
        if compiled.search(line):
            step = parse_step(line, regex)
            if step is not None:
                found.append((step, line.strip()))
    return found


def steps_since(path: str, offset: int, regex: str, window: int = LOG_WINDOW) -> LogSteps:
    """The steps logged after ``offset`` (the log's size when the job was started). A log now shorter than that was
    truncated or replaced since: all of it is new."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return LogSteps(None, None, None, 0)
    start = offset if size >= offset else 0
    with open(path, "rb") as handle:
        handle.seek(start)
        head = handle.read(window)
        tail_start = max(start, size - window)
        handle.seek(tail_start)
        tail = handle.read()
    first = _step_lines(_complete_lines(head, cut_first=False), regex)
    last = _step_lines(_complete_lines(tail, cut_first=tail_start > start), regex)
    return LogSteps(
        first=first[0][0] if first else None,
        last=last[-1][0] if last else None,
        last_line=last[-1][1] if last else None,
        size=size,
    )


# --- is it training? ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One look at the restarted job."""

    processes: int  # the job's live processes, as its selector finds them
    launched_alive: bool  # the process Pivot started is still running
    steps: LogSteps
    gpus: list  # the expected GPUs as nvidia-smi reports them (dicts with index and memory_used_mib)


@dataclass(frozen=True)
class Verdict:
    state: str
    detail: str


def idle_gpus(gpus: list, busy_min_mib: int) -> list:
    """Indexes of GPUs with less than ``busy_min_mib`` in use (a GPU whose memory is not reported does not count)."""
    return [gpu["index"] for gpu in gpus
            if gpu["memory_used_mib"] is not None and gpu["memory_used_mib"] < busy_min_mib]


def judge(observation: Observation, checkpoint_step: int | None, expect_processes: int, busy_min_mib: int) -> Verdict:
    steps = observation.steps
    if observation.processes == 0 and not observation.launched_alive:
        return Verdict(DIED, "the job exited: no process of it is left")
    if steps.first is not None and checkpoint_step is not None and steps.first <= checkpoint_step:
        return Verdict(
            NOT_RESUMED,
            "its first logged step is %d, not after the checkpoint's step %d: it did not resume from the checkpoint"
            % (steps.first, checkpoint_step),
        )
    missing = []
    if observation.processes < expect_processes:
        missing.append("%d of %d processes" % (observation.processes, expect_processes))
    if steps.last is None:
        missing.append("no step logged since the start")
    idle = idle_gpus(observation.gpus, busy_min_mib)
    if idle:
        missing.append("GPU %s below %d MiB in use" % (",".join(str(index) for index in idle), busy_min_mib))
    if missing:
        return Verdict(STARTING, "; ".join(missing))
    return Verdict(TRAINING, describe(observation, busy_min_mib))


def describe(observation: Observation, busy_min_mib: int) -> str:
    """``9 processes, step 5403 logged, GPUs in use 8 of 8``."""
    steps = "step %d logged" % observation.steps.last if observation.steps.last is not None else "no step logged"
    busy = len(observation.gpus) - len(idle_gpus(observation.gpus, busy_min_mib))
    return "%d processes, %s, GPUs in use %d of %d" % (observation.processes, steps, busy, len(observation.gpus))


# --- the job Pivot started ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """The process Pivot started: its PID and start time, its session, and the systemd unit it runs in (if any)."""

    pid: int
    start_time: int
    sid: int
    unit: str = ""

    @classmethod
    def from_record(cls, record: dict | None) -> Launch | None:
        try:
            return cls(int(record["pid"]), int(record["start_time"]), int(record["sid"]), str(record.get("unit") or ""))
        except (KeyError, TypeError, ValueError):
            return None


def owned_pids(
    launch: Launch | None,
    members: dict,
    leader: ProcessInfo | None,
    cgroup_of: Callable[[int], str | None],
) -> list:
    """Which of the job's processes come from ``launch``: the launched process itself, any process still in its session
    (while the session's leader is the launched process or gone; a new process with its PID is someone else's), or any
    process in its systemd unit."""
    if launch is None:
        return []
    session_is_ours = leader is None or leader.start_time == launch.start_time
    unit = launch.unit if launch.unit.endswith(".service") or not launch.unit else launch.unit + ".service"
    owned = []
    for pid, info in members.items():
        if (
            (pid == launch.pid and info.start_time == launch.start_time)
            or (session_is_ours and info.sid == launch.sid)
            or (unit and service_of_cgroup(cgroup_of(pid)) == unit)
        ):
            owned.append(pid)
    return sorted(owned)


def record_path(state_dir: str) -> str:
    return os.path.join(state_dir, RECORD_NAME)


# --- starting it detached ----------------------------------------------------------------------------------------

MAX_FD = 65536


def spawn_detached(argv: list, cwd: str | None, env: dict, output: str | None) -> int:
    """Start ``argv`` as ``setsid nohup argv >> output 2>&1 < /dev/null &`` does: in a new session (no controlling
    terminal, out of the caller's process group), SIGHUP ignored, no descriptor of the caller inherited. Returns its
    PID once it has exec'd; raises OSError with the child's own error when it could not (no such file, ...)."""
    read_end, write_end = os.pipe()  # close-on-exec: EOF tells the parent the exec happened
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; what it does is seen through the parent
        try:
            os.close(read_end)
            _become_detached(cwd, output, write_end)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:  # reported to the parent, whatever it is
            os.write(write_end, ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace"))
        finally:
            os._exit(127)
    os.close(write_end)
    error = b""
    while True:
        chunk = os.read(read_end, 4096)
        if not chunk:
            break
        error += chunk
    os.close(read_end)
    if error:
        os.waitpid(pid, 0)
        raise OSError(error.decode("utf-8", "replace"))
    return pid


def _become_detached(cwd: str | None, output: str | None, keep: int) -> None:
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # SIG_IGN survives exec, as under nohup
    stdin = os.open(os.devnull, os.O_RDONLY)
    out = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if output else os.open(os.devnull, os.O_WRONLY)
    os.dup2(stdin, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.closerange(3, keep)
    os.closerange(keep + 1, MAX_FD)
    if cwd:
        os.chdir(cwd)
