# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

from ansible_collections.pivot.ops.plugins.module_utils.checkpoint import (
    CheckpointSpec,
    CheckpointWatcher,
    describe_wait,
    format_bytes,
    latest_step_in_log,
    parse_step,
    writers_inside,
)

LOG_LINE = "[2158m] step=5381 loss=--- acc=--- | tgt=0.48b/s dft=0.48b/s (19.5Ktok/s) | ETA=7.1d"


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def write(path, size: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(b"\0" * size)


def test_parse_step_variants():
    default = r"(\d+)(?!.*\d)"
    assert parse_step("step_5381", default) == 5381
    assert parse_step("checkpoint-5400", default) == 5400
    assert parse_step("epoch3-step_120", default) == 120
    assert parse_step("latest", default) is None
    assert parse_step("ckpt_e3_s77", r"s(?P<step>\d+)") == 77


def watcher_for(tmp_path, clock=None, writers=None, **spec) -> CheckpointWatcher:
    spec.setdefault("pattern", "step_*")
    return CheckpointWatcher(
        CheckpointSpec(str(tmp_path), **spec),
        clock=clock or ManualClock(),
        writers=writers or (lambda _path: []),
    )


def save(directory, step: int, files: int = 2, size: int = 10, marker: str | None = None) -> str:
    """A checkpoint directory step_<step> with ``files`` files of ``size`` bytes (and the marker, if given)."""
    target = directory / f"step_{step}"
    for index in range(files):
        write(str(target / f"part{index}.bin"), size)
    if marker:
        (target / marker).write_text("")
    return str(target)


def states_of(watcher) -> dict:
    return {os.path.basename(entry.path): entry.state for entry in watcher.poll()}


# --- with a marker -------------------------------------------------------------------------------------------------


def test_marker_completes_only_new_checkpoints(tmp_path):
    save(tmp_path, 100, marker="COMPLETE")
    watcher = watcher_for(tmp_path, marker="COMPLETE")
    watcher.take_baseline()
    assert watcher.poll() == [], "a checkpoint that existed before the request does not count"
    save(tmp_path, 200, files=1)
    states = watcher.poll()
    assert watcher.accept(states) is None, "no marker yet"
    assert watcher.pending(states) == [f"{tmp_path / 'step_200'} (no marker yet)"]
    (tmp_path / "step_200" / "COMPLETE").write_text("")
    found = watcher.accept(watcher.poll())
    assert (found.path, found.step, found.size) == (str(tmp_path / "step_200"), 200, 10)


def test_glob_filters_entries(tmp_path):
    watcher = watcher_for(tmp_path, marker="COMPLETE")
    watcher.take_baseline()
    write(str(tmp_path / "other_300" / "COMPLETE"), 0)
    assert watcher.poll() == []


def test_marker_mode_takes_the_highest_step_at_once(tmp_path):
    watcher = watcher_for(tmp_path, marker="M")
    watcher.take_baseline()
    for step in (7, 12):
        save(tmp_path, step, marker="M")
    save(tmp_path, 13, files=1)  # the next save, still in progress: a marker makes waiting for it unnecessary
    assert watcher.accept(watcher.poll()).step == 12


def test_missing_directory_is_no_checkpoint(tmp_path):
    watcher = watcher_for(tmp_path / "absent", pattern="*", marker="M")
    watcher.take_baseline()
    assert watcher.poll() == []
    assert watcher.newest_before() is None


# --- without a marker: settled -------------------------------------------------------------------------------------


def test_a_growing_checkpoint_is_not_taken_and_a_settled_one_is(tmp_path):
    clock = ManualClock()
    watcher = watcher_for(tmp_path, clock=clock, pattern="checkpoint-*", settle_seconds=30)
    watcher.take_baseline()
    shard = str(tmp_path / "checkpoint-50" / "shard0")
    write(shard, 100)
    assert states_of(watcher) == {"checkpoint-50": "settling"}
    for size in (200, 300, 400):  # written on: every poll sees it change
        clock.now += 10
        write(shard, size)
        states = watcher.poll()
        assert [entry.state for entry in states] == ["growing"]
        assert watcher.accept(states) is None
    clock.now += 29
    states = watcher.poll()
    assert [(entry.state, entry.unchanged_for) for entry in states] == [("settling", 29)]
    assert watcher.accept(states) is None
    clock.now += 1
    found = watcher.accept(watcher.poll())
    assert (found.step, found.size) == (50, 400)


def test_a_change_of_mtime_alone_restarts_the_settle_period(tmp_path):
    clock = ManualClock()
    watcher = watcher_for(tmp_path, clock=clock, settle_seconds=10)
    watcher.take_baseline()
    path = save(tmp_path, 5, files=1)
    watcher.poll()
    clock.now += 9
    os.utime(os.path.join(path, "part0.bin"), ns=(1, os.stat(path).st_mtime_ns + 10**9))  # rewritten, same size
    assert states_of(watcher) == {"step_5": "growing"}
    clock.now += 9
    assert states_of(watcher) == {"step_5": "settling"}
    clock.now += 1
    assert states_of(watcher) == {"step_5": "complete"}


def test_an_empty_checkpoint_never_settles(tmp_path):
    clock = ManualClock()
    watcher = watcher_for(tmp_path, clock=clock, settle_seconds=1)
    watcher.take_baseline()
    os.makedirs(str(tmp_path / "step_1"))
    watcher.poll()
    clock.now += 10
    assert states_of(watcher) == {"step_1": "empty"}
    assert watcher.accept(watcher.poll()) is None


def test_a_file_held_open_for_writing_keeps_it_incomplete(tmp_path):
    clock = ManualClock()
    writing = {"pids": [4242]}
    watcher = watcher_for(tmp_path, clock=clock, settle_seconds=5, writers=lambda _path: writing["pids"])
    watcher.take_baseline()
    save(tmp_path, 9)
    watcher.poll()
    clock.now += 6
    states = watcher.poll()
    assert [(entry.state, entry.unchanged_for) for entry in states] == [("growing", 0.0)]
    assert watcher.accept(states) is None
    writing["pids"] = []
    clock.now += 4
    assert states_of(watcher) == {"step_9": "settling"}, "the settle period restarted when the writer was seen"
    clock.now += 1
    assert states_of(watcher) == {"step_9": "complete"}


def test_fewer_files_than_the_newest_checkpoint_before_must_settle_three_times_as_long(tmp_path):
    clock = ManualClock()
    save(tmp_path, 100, files=3)
    watcher = watcher_for(tmp_path, clock=clock, settle_seconds=5)
    watcher.take_baseline()
    save(tmp_path, 200, files=2)  # a save that paused (or died) before its third file
    watcher.poll()
    clock.now += 14
    states = watcher.poll()
    assert [(entry.state, entry.settle_for) for entry in states] == [("settling", 15)]
    assert watcher.accept(states) is None
    assert describe_wait(states, None, watcher.reference) == (
        "newest step_200 (settling 14 of 15 s, 2 files, step_100 had 3, 20 B)")
    write(str(tmp_path / "step_200" / "part2.bin"), 10)  # the third file comes after all
    watcher.poll()
    clock.now += 5
    assert watcher.accept(watcher.poll()).step == 200, "with all its files, the normal settle period"


def test_a_save_with_fewer_files_is_taken_after_the_longer_period(tmp_path):
    """A trainer whose format changed (a marker it no longer writes, a file it dropped) is not blocked for good."""
    clock = ManualClock()
    save(tmp_path, 100, files=4)
    watcher = watcher_for(tmp_path, clock=clock, settle_seconds=5)
    watcher.take_baseline()
    save(tmp_path, 200, files=3)
    watcher.poll()
    clock.now += 15
    assert watcher.accept(watcher.poll()).step == 200


def test_no_checkpoint_is_taken_while_a_later_save_is_still_written(tmp_path):
    clock = ManualClock()
    watcher = watcher_for(tmp_path, clock=clock, settle_seconds=5)
    watcher.take_baseline()
    save(tmp_path, 300)
    watcher.poll()
    clock.now += 5
    write(str(tmp_path / "step_301" / "part0.bin"), 10)  # the next save starts
    states = watcher.poll()
    assert {os.path.basename(e.path): e.state for e in states} == {"step_300": "complete", "step_301": "settling"}
    assert watcher.accept(states) is None, "stopping now would leave step_301 torn, with the highest step"
    write(str(tmp_path / "step_301" / "part1.bin"), 10)
    watcher.poll()
    clock.now += 5
    assert watcher.accept(watcher.poll()).step == 301


def test_a_partial_checkpoint_left_by_a_killed_trainer_is_not_new_after_the_request(tmp_path):
    clock = ManualClock()
    save(tmp_path, 4000, files=3)
    save(tmp_path, 4500, files=1)  # debris: the trainer was killed while saving step 4500
    watcher = watcher_for(tmp_path, clock=clock, settle_seconds=5)
    watcher.take_baseline()
    previous = watcher.newest_before()
    assert (previous.path, previous.step) == (str(tmp_path / "step_4000"), 4000), "debris is no resume point"
    for _poll in range(3):
        clock.now += 10
        assert watcher.poll() == [], "the debris is as it was before the request: not new"
    assert watcher.accept(watcher.poll()) is None


def test_a_killed_trainers_partial_rewritten_after_the_request_is_new(tmp_path):
    clock = ManualClock()
    save(tmp_path, 4000, files=3)
    save(tmp_path, 4500, files=1)
    watcher = watcher_for(tmp_path, clock=clock, settle_seconds=5)
    watcher.take_baseline()
    save(tmp_path, 4500, files=3, size=11)  # the restarted trainer saves step 4500 again, in place
    assert states_of(watcher) == {"step_4500": "settling"}
    clock.now += 5
    assert watcher.accept(watcher.poll()).step == 4500


def test_a_save_in_progress_at_the_request_is_no_resume_point(tmp_path):
    save(tmp_path, 100)
    save(tmp_path, 200)
    writer = {str(tmp_path / "step_200"): [77]}
    watcher = watcher_for(tmp_path, settle_seconds=5, writers=lambda path: writer.get(path, []))
    watcher.take_baseline()
    assert watcher.newest_before().step == 100


def test_single_file_checkpoints(tmp_path):
    clock = ManualClock()
    write(str(tmp_path / "model_100.pt"), 50)
    watcher = watcher_for(tmp_path, clock=clock, pattern="model_*.pt", settle_seconds=3)
    watcher.take_baseline()
    assert watcher.newest_before().step == 100
    write(str(tmp_path / "model_200.pt"), 50)
    watcher.poll()
    clock.now += 3
    found = watcher.accept(watcher.poll())
    assert (found.path, found.step, found.size) == (str(tmp_path / "model_200.pt"), 200, 50)


def test_writers_inside_sees_a_file_open_for_writing_not_one_open_for_reading(tmp_path):
    target = tmp_path / "step_1"
    write(str(target / "done.bin"), 1)
    with open(target / "done.bin", "rb"):
        assert writers_inside(str(target)) == []
    with open(target / "shard.bin", "wb"):
        assert os.getpid() in writers_inside(str(target))
    assert os.getpid() not in writers_inside(str(tmp_path / "step_2"))


# --- progress text -------------------------------------------------------------------------------------------------


def test_progress_names_the_newest_entry_its_state_and_size(tmp_path):
    clock = ManualClock()
    watcher = watcher_for(tmp_path, clock=clock, settle_seconds=30)
    watcher.take_baseline()
    assert describe_wait([], None) == "no new one yet"
    write(str(tmp_path / "step_000005400" / "model.bin"), 1000)
    watcher.poll()
    clock.now += 1
    write(str(tmp_path / "step_000005400" / "model.bin"), 1288490189)
    assert describe_wait(watcher.poll(), None) == "newest step_000005400 (growing, 1.2 GiB)"
    clock.now += 12
    assert describe_wait(watcher.poll(), None) == "newest step_000005400 (settling 12 of 30 s, 1.2 GiB)"


def test_progress_before_anything_new_names_the_last_checkpoint(tmp_path):
    save(tmp_path, 5300)
    watcher = watcher_for(tmp_path)
    watcher.take_baseline()
    assert describe_wait(watcher.poll(), watcher.newest_before()) == (
        "no new one yet (newest before the request: step_5300)")


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536 * 1024, 5 * 1024**3, 3000 * 1024**3)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 MiB", "5.0 GiB", "3000.0 GiB"]


def test_last_step_from_log_tail(tmp_path):
    log = tmp_path / "train.log"
    lines = [LOG_LINE.replace("5381", str(step)) for step in range(5300, 5382)]
    log.write_text("\n".join(lines) + "\nsaving checkpoint...\n")
    step, line = latest_step_in_log(str(log), r"\bstep=(\d+)", 65536)
    assert step == 5381
    assert line == LOG_LINE


def test_last_step_handles_carriage_returns_and_cut_first_line(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(
        b"[1m] step=99999 loss=1\n" + b"x" * 200 + b"\r[2m] step=7 loss=---\r[2m] step=8 loss=---\rEval 10%"
    )
    assert latest_step_in_log(str(log), r"\bstep=(\d+)", 65536)[0] == 8
    # A tail that cuts into "[1m] step=99999" must not read a partial number from it.
    log.write_bytes(b"[1m] step=99999 loss=1\n" + b"y" * 50)
    assert latest_step_in_log(str(log), r"\bstep=(\d+)", 55) == (None, None)


def test_custom_log_regex_with_named_group(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("global_step: 41 | lr 1e-4\nglobal_step: 42 | lr 1e-4\n")
    assert latest_step_in_log(str(log), r"global_step: (?P<step>\d+)", 1024) == (42, "global_step: 42 | lr 1e-4")
