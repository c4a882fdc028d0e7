# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Restart a training job from a recorded checkpoint: the command from its template, whether the checkpoint is still
usable, whether the restarted job really trains, and the host's record of the job Pivot started (so that a second run
recognises it, and a job Pivot did not start is refused instead of duplicated).

A checkpoint is usable when it is still there and complete: its marker, when the trainer writes one; else the size the
stop recorded when it confirmed it; else (a checkpoint named for this run, of a trainer that writes no marker) the
stop's own rule for a checkpoint without a marker, watched now (:class:`checkpoint.CheckpointWatcher`: unchanged for
``settle_seconds``, not empty, no file in it open for writing).

A job "really trains" when (1) it has at least the expected number of processes, (2) its log shows, in what was written
since the start, a step after the checkpoint's step, and (3) every expected GPU has memory in use. A first logged step
at or below the checkpoint's step means the trainer did not resume from it (it started over, or from elsewhere).
"""

from __future__ import annotations

import glob
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Callable

from ansible_collections.pivot.ops.plugins.module_utils.checkpoint import (
    COMPLETE,
    DEFAULT_SETTLE_SECONDS,
    EMPTY,
    CheckpointSpec,
    CheckpointWatcher,
    describe_entry,
    entry_signature,
    list_entries,
    parse_step,
    writers_inside,
)
from ansible_collections.pivot.ops.plugins.module_utils.procfs import ProcessInfo, service_of_cgroup

PLACEHOLDER = re.compile(r"\{(checkpoint|checkpoint_name|step)\}")
RECORD_NAME = "resume.json"
LOG_WINDOW = 65536  # bytes read at each end of what the log gained since the start
# A checkpoint judged by the settle rule that has not settled within this many settle periods is still being written.
SETTLE_WATCH_FACTOR = 2

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


# --- the command the stopped job had been started with -----------------------------------------------------------
#
# The resumed job's selected processes (the job selector's roots, the processes the stop recorded as "selected") are
# compared with the stopped job's, word by word, after the words the resume command adds for the checkpoint are taken
# out of both: each template element holding a placeholder, with the option element right before it when that is one
# (starts with "-" and holds no placeholder), as it reads for any checkpoint beside this one ({checkpoint}: any path in
# the checkpoint's directory; {checkpoint_name}: any name; {step}: any number). A stopped job that was itself resumed
# carries the option with its own checkpoint, which is taken out too. A placeholder element alone, with no option and
# no other text ("{step}"), could be any word, so only this checkpoint's value is taken out for it.

ANY_VALUE = {"checkpoint_name": r"[^/\s]+", "step": r"[0-9]+"}


@dataclass(frozen=True)
class ResumeWords:
    """What one placeholder element of the template adds to the command line: its option word, if separate, and the
    pattern of its value."""

    option: str | None
    value: re.Pattern
    text: str  # as the template has it: "--resume-from {checkpoint}", "--resume={checkpoint}"


def _value_pattern(element: str, checkpoint: str, step: int | None) -> re.Pattern:
    if PLACEHOLDER.fullmatch(element) and element != "{checkpoint}":
        return re.compile(re.escape(render_command([element], checkpoint, step)[0]))
    directory = os.path.dirname(checkpoint.rstrip("/"))
    any_value = dict(ANY_VALUE, checkpoint=re.escape(directory.rstrip("/")) + r"/[^/\s]+")
    parts = []
    last = 0
    for match in PLACEHOLDER.finditer(element):
        parts.append(re.escape(element[last:match.start()]))
        parts.append(any_value[match.group(1)])
        last = match.end()
    parts.append(re.escape(element[last:]))
    return re.compile("".join(parts))


def resume_words(template: list, checkpoint: str, step: int | None) -> list:
    """The :class:`ResumeWords` of each placeholder element of the template."""
    found = []
    for index, element in enumerate(template):
        if not PLACEHOLDER.search(element):
            continue
        before = template[index - 1] if index > 0 else ""
        option = before if before.startswith("-") and not PLACEHOLDER.search(before) else None
        text = "%s %s" % (option, element) if option else element
        found.append(ResumeWords(option, _value_pattern(element, checkpoint, step), text))
    return found


def without_resume_words(command_line: str, words: list) -> list:
    """The words of a command line without what :func:`resume_words` describes."""
    given = command_line.split()
    kept = []
    index = 0
    while index < len(given):
        word = given[index]
        value = given[index + 1] if index + 1 < len(given) else None
        if value is not None and any(w.option == word and w.value.fullmatch(value) for w in words):
            index += 2
            continue
        if not any(w.option is None and w.value.fullmatch(word) for w in words):
            kept.append(word)
        index += 1
    return kept


def command_difference(
    stopped: list, resumed: list, template: list, checkpoint: str, step: int | None
) -> str | None:
    """Why the resumed job does not run the way the stopped one had been started (a sentence naming both), or None
    when it does, or when either is unknown. ``stopped`` and ``resumed`` are the selected processes' command lines."""
    if not stopped or not resumed:
        return None
    words = resume_words(template, checkpoint, step)
    if sorted(without_resume_words(line, words) for line in stopped) == sorted(
            without_resume_words(line, words) for line in resumed):
        return None
    added = [w.text for w in words]
    return (
        "The resumed job does not run the way the stopped one had been started: the stop recorded %s, the resumed job "
        "runs %s (compared word by word without what the resume command adds for the checkpoint%s). If that is not "
        "intended, make pivot_training_resume.command start the job as before, with only the checkpoint added."
        % ("; ".join(stopped), "; ".join(resumed), (": " + ", ".join(added)) if added else "")
    )


# --- the checkpoint -----------------------------------------------------------------------------------------------


def _no_progress(_detail: str) -> None:
    return None


@dataclass(frozen=True)
class SettleWatch:
    """How a checkpoint with neither a marker nor a recorded size is watched for the stop's settle rule."""

    settle_seconds: float = DEFAULT_SETTLE_SECONDS
    poll_interval: float = 1.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    on_wait: Callable[[str], None] = _no_progress  # told what the watch has seen, before each sleep


def checkpoint_problem(
    path: str,
    marker: str | None,
    size_bytes: int | None,
    writers: Callable[[str], list] = writers_inside,
    watch: SettleWatch | None = None,
) -> str | None:
    """Why the checkpoint cannot be resumed from (a phrase that follows its path), or None when it can. Without a
    marker and a recorded size, it must settle (:func:`settle_problem`), which takes ``settle_seconds`` of watching."""
    path = path.rstrip("/") or "/"
    problem = _content_problem(path, marker, size_bytes)
    if problem:
        return problem
    busy = writers(path)
    if busy:
        return "is being written by PID %s" % ", ".join(str(pid) for pid in busy)
    if marker or size_bytes is not None:
        return None
    return settle_problem(path, watch or SettleWatch(), writers)


def _content_problem(path: str, marker: str | None, size_bytes: int | None) -> str | None:
    """What one look shows: the checkpoint gone, its marker missing, nothing in it, its size not the recorded one."""
    if not os.path.lexists(path):
        return "is gone: nothing is at that path any more"
    if marker and not os.path.exists(os.path.join(path, marker)):
        return "is incomplete: its completion marker %s is missing" % marker
    signature = entry_signature(path)
    if signature is None or signature.size == 0:
        return "is empty"
    if size_bytes is not None and signature.size != size_bytes:
        return "changed since the stop confirmed it: %d bytes then, %d now" % (size_bytes, signature.size)
    return None


def _seconds(value: float) -> str:
    """``60``, ``0.4``: seconds as a person writes them."""
    return "%g" % round(value, 1)


def settle_problem(path: str, watch: SettleWatch, writers: Callable[[str], list] = writers_inside) -> str | None:
    """The stop's rule for "complete" without a marker, applied by the stop's own watcher (``CheckpointWatcher``;
    docs/modules.md, "When a checkpoint is complete"): unchanged for ``settle_seconds`` of watching, not empty, no file
    in it open for writing. No baseline is taken, so the entry counts as new and is watched from now. One that has not
    settled within ``SETTLE_WATCH_FACTOR`` settle periods is still being written (or copied back)."""
    spec = CheckpointSpec(os.path.dirname(path), glob.escape(os.path.basename(path)),
                          settle_seconds=watch.settle_seconds)
    watcher = CheckpointWatcher(spec, clock=watch.clock, writers=writers)
    started = watch.clock()
    limit = SETTLE_WATCH_FACTOR * watch.settle_seconds
    while True:
        entry = next(iter(watcher.poll()), None)
        if entry is None:
            return "is gone: nothing is at that path any more"
        if entry.state == COMPLETE:
            return None
        if entry.state == EMPTY:
            return "is empty"
        waited = watch.clock() - started
        if waited >= limit:
            return (
                "has not settled within %s s: with no marker and no size recorded by a stop, it counts as complete "
                "once its files stay unchanged for settle_seconds (%s s) with none open for writing; last seen: %s"
                % (_seconds(waited), _seconds(watch.settle_seconds), describe_entry(entry))
            )
        watch.on_wait("%s, watched %s of at most %s s" % (describe_entry(entry), _seconds(waited), _seconds(limit)))
        watch.sleep(max(0.0, min(watch.poll_interval, limit - waited)))


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
