# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import json
import os

from ansible_collections.pivot.ops.plugins.module_utils.progress import Heartbeat, ProgressFile, waited_text


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_heartbeat_is_stale_once_older_than_its_timeout(tmp_path):
    wall = Clock(10_000.0)
    beat = Heartbeat(str(tmp_path / "hb"), 60, wall_clock=wall)
    assert beat.stale() is True, "a heartbeat that was never written counts as gone"
    beat.touch()
    wall.now += 60
    assert (beat.age(), beat.stale()) == (60.0, False)
    wall.now += 1
    assert beat.stale() is True
    beat.touch()
    assert beat.stale() is False
    beat.close()
    assert beat.stale() is True and not (tmp_path / "hb").exists()


def test_without_a_file_or_a_timeout_there_is_no_heartbeat_to_keep(tmp_path):
    assert Heartbeat(None, 60).stale() is False
    old = tmp_path / "hb"
    old.write_text("")
    os.utime(old, (1, 1))
    assert Heartbeat(str(old), 0).stale() is False


def test_progress_is_rewritten_on_a_new_stage_and_otherwise_at_most_every_interval(tmp_path):
    clock = Clock()
    path = tmp_path / "progress.json"
    progress = ProgressFile(str(path), identity={"run_id": "r1"}, min_interval=1.0, clock=clock,
                            wall_clock=lambda: 5.0)

    def written() -> dict:
        return json.loads(path.read_text())

    progress.update("checkpoint", "waiting: 0 s of 900")
    assert written() == {"run_id": "r1", "stage": "checkpoint", "line": "waiting: 0 s of 900", "updated": 5.0,
                         "pid": os.getpid()}
    clock.now += 0.5
    progress.update("checkpoint", "waiting: 0.5 s of 900")
    assert written()["line"] == "waiting: 0 s of 900", "throttled"
    progress.update("SIGTERM", "SIGTERM sent")
    assert written()["stage"] == "SIGTERM", "a new stage is written at once"
    clock.now += 1.0
    progress.update("SIGTERM", "SIGTERM sent: 1 s")
    assert written()["line"] == "SIGTERM sent: 1 s"
    progress.close()
    assert not path.exists()


def test_progress_without_a_file_does_nothing_and_an_unwritable_one_is_not_an_error(tmp_path):
    ProgressFile(None).update("x", "y")
    ProgressFile(str(tmp_path / "missing-dir" / "p.json")).update("x", "y")


def test_waited_text():
    assert waited_text(119.6, 900) == "120 s of 900"
    assert waited_text(3, None) == "3 s"
