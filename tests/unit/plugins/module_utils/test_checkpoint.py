# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

from ansible_collections.pivot.ops.plugins.module_utils.checkpoint import (
    CheckpointSpec,
    CheckpointWatcher,
    latest_step_in_log,
    parse_step,
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


def test_marker_completes_only_new_checkpoints(tmp_path):
    old = tmp_path / "step_100"
    write(str(old / "model.bin"), 10)
    (old / "COMPLETE").write_text("")
    watcher = CheckpointWatcher(CheckpointSpec(str(tmp_path), "step_*", marker="COMPLETE"))
    watcher.take_baseline()
    assert watcher.poll() is None, "a checkpoint that existed before the request does not count"
    write(str(tmp_path / "step_200" / "model.bin"), 10)
    assert watcher.poll() is None, "no marker yet"
    assert watcher.pending() == [str(tmp_path / "step_200")]
    (tmp_path / "step_200" / "COMPLETE").write_text("")
    found = watcher.poll()
    assert found.path == str(tmp_path / "step_200")
    assert found.step == 200
    assert found.size == 10


def test_glob_filters_entries(tmp_path):
    watcher = CheckpointWatcher(CheckpointSpec(str(tmp_path), "step_*", marker="COMPLETE"))
    watcher.take_baseline()
    write(str(tmp_path / "other_300" / "COMPLETE"), 0)
    assert watcher.poll() is None


def test_stable_size_needs_unchanged_size_for_stable_seconds(tmp_path):
    clock = ManualClock()
    watcher = CheckpointWatcher(CheckpointSpec(str(tmp_path), "checkpoint-*", stable_seconds=5), clock=clock)
    watcher.take_baseline()
    shard = str(tmp_path / "checkpoint-50" / "shard0")
    write(shard, 100)
    assert watcher.poll() is None
    clock.now += 3
    write(shard, 200)  # still growing: the stability window restarts
    assert watcher.poll() is None
    clock.now += 4
    assert watcher.poll() is None
    clock.now += 1.5
    found = watcher.poll()
    assert (found.step, found.size) == (50, 200)


def test_empty_checkpoint_never_completes_by_size(tmp_path):
    clock = ManualClock()
    watcher = CheckpointWatcher(CheckpointSpec(str(tmp_path), "step_*", stable_seconds=1), clock=clock)
    watcher.take_baseline()
    os.makedirs(str(tmp_path / "step_1"))
    assert watcher.poll() is None
    clock.now += 10
    assert watcher.poll() is None


def test_wait_times_out_and_highest_step_wins(tmp_path):
    clock = ManualClock()
    watcher = CheckpointWatcher(CheckpointSpec(str(tmp_path), "step_*", marker="M"), clock=clock, sleep=clock.sleep)
    watcher.take_baseline()
    assert watcher.wait(timeout=3, poll_interval=1) is None
    assert clock.now == 103.0
    for step in (7, 12):
        write(str(tmp_path / f"step_{step}" / "M"), 1)
    assert watcher.wait(timeout=3, poll_interval=1).step == 12


def test_missing_directory_is_no_checkpoint(tmp_path):
    watcher = CheckpointWatcher(CheckpointSpec(str(tmp_path / "absent"), "*", marker="M"))
    watcher.take_baseline()
    assert watcher.poll() is None


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
