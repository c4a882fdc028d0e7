# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""module_utils.resume: the resume command, the checkpoint checks, the log since the start, the verdict on whether the
restarted job trains, and which running processes are the job Pivot started."""

from __future__ import annotations

import json
import shutil

import pytest
from ansible_collections.pivot.ops.plugins.module_utils.procfs import ProcessInfo
from ansible_collections.pivot.ops.plugins.module_utils.resume import (
    DIED,
    NOT_RESUMED,
    STARTING,
    TRAINING,
    Launch,
    LogSteps,
    Observation,
    ResumeError,
    SettleWatch,
    checkpoint_problem,
    command_difference,
    judge,
    names_checkpoint,
    newer_checkpoints,
    owned_pids,
    render_command,
    steps_since,
)

STEP = r"\bstep=(\d+)"


def checkpoint(root, step: int, marker: bool = True, files: int = 3):
    path = root / f"step_{step:09d}"
    path.mkdir(parents=True)
    for index in range(files - 1):
        (path / f"part{index}.bin").write_bytes(b"x" * 100)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if marker:
        (path / "COMPLETE").write_text("{}")
    return path


# --- the command ------------------------------------------------------------------------------------------------


def test_placeholders_are_replaced_inside_elements_and_other_braces_stay():
    argv = render_command(["/root/run.sh", "--resume={checkpoint}", "--step", "{step}", "{checkpoint_name}", "{x}"],
                          "/c/step_000005400/", 5400)
    assert argv == ["/root/run.sh", "--resume=/c/step_000005400/", "--step", "5400", "step_000005400", "{x}"]


def test_an_unknown_step_cannot_be_passed():
    with pytest.raises(ResumeError, match=r"uses \{step\}, but the step of checkpoint /c/latest is unknown"):
        render_command(["run.sh", "{step}"], "/c/latest", None)
    assert render_command(["run.sh", "{checkpoint}"], "/c/latest", None) == ["run.sh", "/c/latest"]


def test_a_template_without_placeholders_does_not_name_the_checkpoint():
    assert not names_checkpoint(["/root/run.sh", "--resume", "<CONFIRM>"])
    assert names_checkpoint(["/root/run.sh", "--resume-step={step}"])


# --- the command the stopped job had been started with ---------------------------------------------------------

CKPT = "/data/dflash/checkpoints/step_000005400"
TRAINER = "python3 -u /root/train_dflash_pipeline.py --config /root/dflash.yaml"


@pytest.mark.parametrize(("template", "resumed"), [
    # the option and the checkpoint as two elements, run.sh passing them on to the trainer
    (["/root/run.sh", "--resume_from_checkpoint", "{checkpoint}"], f"{TRAINER} --resume_from_checkpoint {CKPT}"),
    # one element, option and value
    (["/root/run.sh", "--resume={checkpoint}"], f"{TRAINER} --resume={CKPT}"),
    # the step and the checkpoint's name, each after its option
    (["/root/run.sh", "--step", "{step}", "--name", "{checkpoint_name}"],
     f"{TRAINER} --step 5400 --name step_000005400"),
    # the checkpoint alone, as an argument of its own
    (["/root/run.sh", "{checkpoint}"], f"{TRAINER} {CKPT}"),
    # a trainer that resumes from its newest checkpoint by itself: nothing added
    (["/root/run.sh"], TRAINER),
])
def test_the_resumed_job_runs_as_the_stopped_one_when_only_the_checkpoint_was_added(template, resumed):
    assert command_difference([TRAINER], [resumed], template, CKPT, 5400) is None


def test_a_stopped_job_that_had_itself_been_resumed_carries_its_own_checkpoint_which_does_not_count():
    earlier = f"{TRAINER} --resume_from_checkpoint /data/dflash/checkpoints/step_000004000"
    resumed = f"{TRAINER} --resume_from_checkpoint {CKPT}"
    template = ["/root/run.sh", "--resume_from_checkpoint", "{checkpoint}"]
    assert command_difference([earlier], [resumed], template, CKPT, 5400) is None


def test_a_job_started_otherwise_is_named_with_both_command_lines():
    resumed = f"python3 -u /root/train_dflash_pipeline.py --config /root/other.yaml --resume_from_checkpoint {CKPT}"
    template = ["/root/run.sh", "--resume_from_checkpoint", "{checkpoint}"]
    said = command_difference([TRAINER], [resumed], template, CKPT, 5400)
    assert said == (
        "The resumed job does not run the way the stopped one had been started: the stop recorded "
        f"{TRAINER}, the resumed job runs {resumed} (compared word by word without what the resume command adds for "
        "the checkpoint: --resume_from_checkpoint {checkpoint}). If that is not intended, make "
        "pivot_training_resume.command start the job as before, with only the checkpoint added.")


@pytest.mark.parametrize("resumed", [
    # a checkpoint from another directory is not "the checkpoint": the job was pointed elsewhere
    f"{TRAINER} --resume_from_checkpoint /tmp/step_000005400",
    # the option's value missing: the option itself is a difference
    f"{TRAINER} --resume_from_checkpoint",
    # more processes selected than the stop recorded
    f"{TRAINER}; {TRAINER}",
])
def test_what_is_not_the_checkpoint_counts(resumed):
    template = ["/root/run.sh", "--resume_from_checkpoint", "{checkpoint}"]
    assert command_difference([TRAINER], resumed.split("; "), template, CKPT, 5400) is not None


def test_a_bare_step_takes_out_only_this_checkpoints_step_not_every_number():
    template = ["/root/run.sh", "{step}"]
    assert command_difference([f"{TRAINER} --gpus 8"], [f"{TRAINER} --gpus 8 5400"], template, CKPT, 5400) is None
    assert command_difference([f"{TRAINER} --gpus 8"], [f"{TRAINER} --gpus 4 5400"], template, CKPT, 5400) is not None


def test_nothing_is_compared_without_both_command_lines():
    template = ["/root/run.sh", "{checkpoint}"]
    assert command_difference([], [f"{TRAINER} {CKPT}"], template, CKPT, 5400) is None
    assert command_difference([TRAINER], [], template, CKPT, 5400) is None


# --- the checkpoint ---------------------------------------------------------------------------------------------


def test_a_complete_checkpoint_has_no_problem(tmp_path):
    path = checkpoint(tmp_path, 400)
    size = sum(f.stat().st_size for f in path.iterdir())
    assert checkpoint_problem(str(path), "COMPLETE", size, writers=lambda _p: []) is None


@pytest.mark.parametrize(("change", "problem"), [
    ("remove", "is gone: nothing is at that path any more"),
    ("unmark", "is incomplete: its completion marker COMPLETE is missing"),
    ("grow", "changed since the stop confirmed it"),
    ("empty", "is empty"),
])
def test_checkpoint_problems_are_named(tmp_path, change, problem):
    path = checkpoint(tmp_path, 400)
    size = sum(f.stat().st_size for f in path.iterdir())
    if change == "remove":
        for item in path.iterdir():
            item.unlink()
        path.rmdir()
    elif change == "unmark":
        (path / "COMPLETE").unlink()
    elif change == "grow":
        (path / "part0.bin").write_bytes(b"y" * 101)
    else:
        for item in path.iterdir():
            item.write_bytes(b"")
    found = checkpoint_problem(str(path), "COMPLETE" if change != "empty" else None, size if change == "grow" else None,
                               writers=lambda _p: [])
    assert found is not None and found.startswith(problem)


def test_a_checkpoint_someone_writes_into_is_not_used(tmp_path):
    path = checkpoint(tmp_path, 400, marker=False)
    assert checkpoint_problem(str(path), None, None, writers=lambda _p: [4242]) == "is being written by PID 4242"


class Watch:
    """A manual clock, a sleep that advances it (and lets the test change the checkpoint meanwhile), and what the
    watch said while it waited."""

    def __init__(self, settle_seconds: float = 30, during_sleep=None) -> None:
        self.now = 100.0
        self.said: list[str] = []
        self.during_sleep = during_sleep or (lambda _now: None)
        self.watch = SettleWatch(settle_seconds=settle_seconds, poll_interval=2, clock=lambda: self.now,
                                 sleep=self.sleep, on_wait=self.said.append)

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.during_sleep(self.now)

    @property
    def watched(self) -> float:
        return self.now - 100.0


def test_without_a_marker_or_recorded_size_a_checkpoint_must_settle_as_the_stops_does(tmp_path):
    path = checkpoint(tmp_path, 400, marker=False)
    watch = Watch(settle_seconds=30)
    assert checkpoint_problem(str(path), None, None, writers=lambda _p: [], watch=watch.watch) is None
    assert watch.watched == 30, "it watched the checkpoint unchanged for settle_seconds, no longer"
    assert watch.said[0] == "step_000000400 (settling 0 of 30 s, 220 B), watched 0 of at most 60 s"


def test_a_marker_or_a_recorded_size_needs_no_watch(tmp_path):
    path = checkpoint(tmp_path, 400)
    size = sum(f.stat().st_size for f in path.iterdir())
    watch = Watch()
    assert checkpoint_problem(str(path), "COMPLETE", None, writers=lambda _p: [], watch=watch.watch) is None
    assert checkpoint_problem(str(path), None, size, writers=lambda _p: [], watch=watch.watch) is None
    assert watch.watched == 0 and watch.said == []


def test_a_checkpoint_that_keeps_changing_is_refused_as_unsettled(tmp_path):
    path = checkpoint(tmp_path, 400, marker=False)

    def copy_goes_on(now: float) -> None:  # a checkpoint still being copied back: a file grows at every look
        with (path / "part0.bin").open("ab") as handle:
            handle.write(b"y" * 10)

    watch = Watch(settle_seconds=10, during_sleep=copy_goes_on)
    problem = checkpoint_problem(str(path), None, None, writers=lambda _p: [], watch=watch.watch)
    assert problem is not None and problem.startswith(
        "has not settled within 20 s: with no marker and no size recorded by a stop, it counts as complete once its "
        "files stay unchanged for settle_seconds (10 s) with none open for writing; last seen: step_000000400 (growing")
    assert watch.watched == 20


def test_a_change_during_the_watch_restarts_the_settle_period(tmp_path):
    path = checkpoint(tmp_path, 400, marker=False)

    def one_late_file(now: float) -> None:
        if now == 106.0:
            (path / "optimizer.pt").write_bytes(b"o" * 50)

    watch = Watch(settle_seconds=10, during_sleep=one_late_file)
    assert checkpoint_problem(str(path), None, None, writers=lambda _p: [], watch=watch.watch) is None
    assert watch.watched >= 16, "10 s unchanged after the last change at 6 s"


def test_a_writer_that_appears_during_the_watch_holds_it_back(tmp_path):
    path = checkpoint(tmp_path, 400, marker=False)
    looks = []

    def writers(_path: str) -> list:  # nobody at the first look, then a process opens a file in it for writing
        looks.append(_path)
        return [] if len(looks) == 1 else [4242]

    watch = Watch(settle_seconds=4)
    problem = checkpoint_problem(str(path), None, None, writers=writers, watch=watch.watch)
    assert problem is not None and problem.startswith("has not settled within 8 s")
    assert "last seen: step_000000400 (growing" in problem, "a writer found restarts the settle period, as in the stop"


def test_a_checkpoint_removed_during_the_watch_is_gone(tmp_path):
    path = checkpoint(tmp_path, 400, marker=False)

    def removed(_now: float) -> None:
        if path.exists():
            shutil.rmtree(path)

    watch = Watch(settle_seconds=10, during_sleep=removed)
    assert checkpoint_problem(str(path), None, None, writers=lambda _p: [], watch=watch.watch) == (
        "is gone: nothing is at that path any more")


def test_a_name_with_glob_characters_is_watched_as_itself(tmp_path):
    path = checkpoint(tmp_path, 400, marker=False)
    odd = path.rename(tmp_path / "step_[400]*")
    checkpoint(tmp_path, 401, marker=False, files=0)  # "step_[400]*" as a pattern would also match an empty step_4...
    watch = Watch(settle_seconds=2)
    assert checkpoint_problem(str(odd), None, None, writers=lambda _p: [], watch=watch.watch) is None


def test_newer_complete_checkpoints_are_found_highest_first(tmp_path):
    own = checkpoint(tmp_path, 400)
    checkpoint(tmp_path, 800)
    checkpoint(tmp_path, 1200)
    checkpoint(tmp_path, 1600, marker=False)  # a save cut short: no marker
    checkpoint(tmp_path, 200)
    found = newer_checkpoints(str(own), "step_*", "COMPLETE", r"(\d+)(?!.*\d)", 400)
    assert found == [(str(tmp_path / "step_000001200"), 1200), (str(tmp_path / "step_000000800"), 800)]


def test_without_a_marker_a_newer_entry_with_fewer_files_is_a_torn_save(tmp_path):
    own = checkpoint(tmp_path, 400, marker=False, files=3)
    checkpoint(tmp_path, 800, marker=False, files=1)
    checkpoint(tmp_path, 1200, marker=False, files=3)
    assert newer_checkpoints(str(own), "step_*", None, r"(\d+)(?!.*\d)", 400) == [
        (str(tmp_path / "step_000001200"), 1200)]
    assert newer_checkpoints(str(own), "step_*", None, r"(\d+)(?!.*\d)", None) == []


# --- the log ----------------------------------------------------------------------------------------------------


def test_only_steps_logged_after_the_offset_count(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("[1m] step=5381 loss=---\nSIGTERM received\n")
    offset = log.stat().st_size
    with log.open("a") as handle:
        handle.write("Resuming from checkpoint step_4000\n[1m] step=4001 x\n[1m] step=4002 x\n[1m] step=40")
    found = steps_since(str(log), offset, STEP)
    assert (found.first, found.last, found.last_line) == (4001, 4002, "[1m] step=4002 x")


def test_a_log_shorter_than_the_offset_was_replaced_and_counts_whole(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step=11\nstep=12\n")
    found = steps_since(str(log), 10_000, STEP)
    assert (found.first, found.last) == (11, 12)


def test_a_missing_log_has_no_steps(tmp_path):
    assert steps_since(str(tmp_path / "none.log"), 0, STEP) == LogSteps(None, None, None, 0)


def test_a_long_log_is_read_at_both_ends_without_cut_lines(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"[1m] step={step} loss=--- padding padding\n" for step in range(401, 5000)))
    found = steps_since(str(log), 0, STEP, window=1000)
    assert (found.first, found.last) == (401, 4999)
    carriage = tmp_path / "bar.log"
    carriage.write_text("step=7 |###   \rstep=8 |####  \r")
    assert steps_since(str(carriage), 0, STEP).last == 8


# --- the verdict ------------------------------------------------------------------------------------------------

GPU_BUSY = {"index": 0, "memory_used_mib": 61449}
GPU_IDLE = {"index": 1, "memory_used_mib": 0}


def observe(processes: int = 9, alive: bool = True, first: int | None = 401, last: int | None = 403,
            gpus: tuple = (GPU_BUSY,)) -> Observation:
    return Observation(processes, alive, LogSteps(first, last, None, 100), list(gpus))


def test_training_needs_processes_a_later_step_and_busy_gpus():
    verdict = judge(observe(), 400, 9, 2048)
    assert verdict.state == TRAINING
    assert verdict.detail == "9 processes, step 403 logged, GPUs in use 1 of 1"


@pytest.mark.parametrize(("observation", "detail"), [
    (observe(processes=1), "1 of 9 processes"),
    (observe(first=None, last=None), "no step logged since the start"),
    (observe(gpus=(GPU_BUSY, GPU_IDLE)), "GPU 1 below 2048 MiB in use"),
    (observe(processes=0, first=None, last=None), "0 of 9 processes; no step logged since the start"),
])
def test_what_is_missing_is_said(observation, detail):
    verdict = judge(observation, 400, 9, 2048)
    assert (verdict.state, verdict.detail) == (STARTING, detail)


def test_a_first_step_at_or_below_the_checkpoint_is_not_a_resume():
    verdict = judge(observe(first=1, last=3), 400, 9, 2048)
    assert verdict.state == NOT_RESUMED
    assert "first logged step is 1, not after the checkpoint's step 400" in verdict.detail
    assert judge(observe(first=400, last=401), 400, 9, 2048).state == NOT_RESUMED


def test_nothing_left_is_dead_and_an_unknown_step_accepts_any_step():
    assert judge(observe(processes=0, alive=False), 400, 9, 2048).state == DIED
    assert judge(observe(first=1, last=2), None, 9, 2048).state == TRAINING


def test_a_gpu_whose_memory_is_not_reported_does_not_hold_it_up():
    assert judge(observe(gpus=({"index": 0, "memory_used_mib": None},)), 400, 9, 2048).state == TRAINING


# --- the job Pivot started ----------------------------------------------------------------------------------------


def info(pid: int, sid: int, start: int = 100, ppid: int = 1) -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=ppid, pgid=sid, sid=sid, state="S", start_time=start, comm="python3",
                       argv=("python3", "train.py"))


def no_cgroup(_pid: int) -> str:
    return ""


def test_the_launched_process_and_its_session_are_pivots():
    launch = Launch(10, 100, 10)
    members = {10: info(10, 10), 11: info(11, 10, ppid=10), 20: info(20, 20, ppid=11)}
    assert owned_pids(launch, members, members[10], no_cgroup) == [10, 11]


def test_the_session_still_counts_after_its_leader_exited_but_not_once_its_pid_is_reused():
    launch = Launch(10, 100, 10)
    members = {11: info(11, 10)}
    assert owned_pids(launch, members, None, no_cgroup) == [11]
    assert owned_pids(launch, members, info(10, 10, start=999), no_cgroup) == []


def test_a_job_pivot_did_not_start_is_not_pivots():
    members = {50: info(50, 50)}
    assert owned_pids(Launch(10, 100, 10), members, None, no_cgroup) == []
    assert owned_pids(None, members, None, no_cgroup) == []
    assert owned_pids(Launch(50, 7, 50), members, members[50], no_cgroup) == []  # same PID, another process


def test_processes_in_the_started_unit_are_pivots():
    launch = Launch(10, 100, 10, "pivot-training")
    members = {70: info(70, 70)}
    cgroups = {70: "0::/system.slice/pivot-training.service\n"}
    assert owned_pids(launch, members, None, lambda pid: cgroups.get(pid, "")) == [70]


def test_a_record_without_the_launch_fields_is_no_launch():
    assert Launch.from_record({"pid": 1}) is None
    assert Launch.from_record(None) is None
    assert Launch.from_record({"pid": "10", "start_time": 5, "sid": 10, "unit": None}) == Launch(10, 5, 10, "")
