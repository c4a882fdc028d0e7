# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""async_watch against results files written the way async_wrapper writes them."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from ansible_collections.pivot.ops.plugins.modules import async_watch


@pytest.fixture
def job(tmp_path):
    """A running async job: the status file async_wrapper writes before it starts the module."""
    path = tmp_path / "123456.789"
    path.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "123456.789"}))
    return path


def set_age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_running_job_refreshes_the_heartbeat_and_reports_its_own_progress(run_module, job, tmp_path):
    heartbeat = tmp_path / "hb"
    progress = tmp_path / "progress.json"
    line = ("waiting for a complete checkpoint newer than the request: 120 s of 900, "
            "newest step_000005400 (growing, 1.2 GiB)")
    progress.write_text(json.dumps({"stage": "checkpoint", "line": line, "updated": time.time()}))
    heartbeat.write_text("")
    set_age(heartbeat, 50)
    result = run_module(async_watch.main, {"results_file": str(job), "heartbeat_file": str(heartbeat),
                                           "progress_file": str(progress)})
    assert result["failed"] is False and result["changed"] is False
    assert (result["finished"], result["progress"], result["stage"]) == (False, line, "checkpoint")
    assert time.time() - heartbeat.stat().st_mtime < 5, "the heartbeat was refreshed"


def test_without_progress_of_its_own_the_line_counts_from_the_jobs_start(run_module, job):
    set_age(job, 40)
    result = run_module(async_watch.main, {"results_file": str(job), "label": "waiting for the GPUs",
                                           "timeout": 120})
    assert result["progress"] in ("waiting for the GPUs: 40 s of 120", "waiting for the GPUs: 41 s of 120")
    assert 39 < result["elapsed"] < 45


def test_old_progress_says_how_old_it_is(run_module, job, tmp_path):
    progress = tmp_path / "progress.json"
    progress.write_text(json.dumps({"stage": "SIGTERM", "line": "SIGTERM sent", "updated": time.time() - 100}))
    result = run_module(async_watch.main, {"results_file": str(job), "progress_file": str(progress)})
    assert result["progress"].startswith("SIGTERM sent (no news for 10")


def test_a_finished_job_removes_the_heartbeat(run_module, job, tmp_path):
    heartbeat = tmp_path / "hb"
    heartbeat.write_text("")
    job.write_text(json.dumps({"changed": True, "msg": "Stopped 10 process(es)"}))
    result = run_module(async_watch.main, {"results_file": str(job), "heartbeat_file": str(heartbeat)})
    assert (result["finished"], result["progress"]) == (True, "finished")
    assert not heartbeat.exists()


def test_a_job_killed_at_its_async_limit_counts_as_finished(run_module, job):
    job.write_text(json.dumps({"msg": "Timeout exceeded", "failed": True, "child_pid": 77}))
    assert run_module(async_watch.main, {"results_file": str(job)})["finished"] is True


def test_a_results_file_not_written_yet_is_a_job_starting(run_module, tmp_path):
    result = run_module(async_watch.main, {"results_file": str(tmp_path / "none"), "label": "stopping"})
    assert (result["failed"], result["finished"], result["progress"]) == (False, False, "stopping: starting")


def test_something_else_than_a_job_status_fails(run_module, tmp_path):
    other = tmp_path / "other"
    other.write_text("not json")
    result = run_module(async_watch.main, {"results_file": str(other)})
    assert result["failed"] is True
    assert "is not a job status written by Ansible's async_wrapper" in result["msg"]
    assert "results_file that the task started with async returned" in result["msg"]


def test_a_heartbeat_that_cannot_be_written_fails_and_says_why_it_matters(run_module, job, tmp_path):
    result = run_module(async_watch.main, {"results_file": str(job),
                                           "heartbeat_file": str(tmp_path / "no-dir" / "hb")})
    assert result["failed"] is True
    assert "Without it the task cancels itself" in result["msg"]


def test_check_mode_does_not_refresh_the_heartbeat(run_module, job, tmp_path):
    heartbeat = tmp_path / "hb"
    heartbeat.write_text("")
    set_age(heartbeat, 50)
    result = run_module(async_watch.main, {"results_file": str(job), "heartbeat_file": str(heartbeat)},
                        check_mode=True)
    assert result["finished"] is False
    assert time.time() - heartbeat.stat().st_mtime > 45


def finish_later(job, seconds: float) -> threading.Timer:
    """The job's final result written SECONDS from now, as async_wrapper writes it when the module returns."""
    timer = threading.Timer(seconds, lambda: job.write_text(json.dumps({"changed": True, "msg": "done"})))
    timer.start()
    return timer


def test_a_wait_ends_as_soon_as_the_job_finishes_and_removes_the_heartbeat(run_module, job, tmp_path):
    heartbeat = tmp_path / "hb"
    timer = finish_later(job, 0.5)
    started = time.monotonic()
    try:
        result = run_module(async_watch.main, {"results_file": str(job), "heartbeat_file": str(heartbeat),
                                               "wait": 120})
    finally:
        timer.cancel()
    assert (result["failed"], result["finished"], result["progress"]) == (False, True, "finished")
    assert time.monotonic() - started < 60, "it returned long before its wait ran out"
    assert not heartbeat.exists()


def test_a_wait_on_a_job_that_goes_on_returns_its_progress_after_the_wait(run_module, job, tmp_path):
    heartbeat = tmp_path / "hb"
    heartbeat.write_text("")
    set_age(heartbeat, 50)
    progress = tmp_path / "progress.json"
    started = time.monotonic()
    timer = threading.Timer(0.3, lambda: progress.write_text(json.dumps(
        {"stage": "SIGTERM", "line": "SIGTERM sent: waiting for the job to exit", "updated": time.time()})))
    timer.start()
    try:
        result = run_module(async_watch.main, {"results_file": str(job), "heartbeat_file": str(heartbeat),
                                               "progress_file": str(progress), "wait": 1})
    finally:
        timer.cancel()
    assert time.monotonic() - started >= 1
    assert (result["finished"], result["stage"]) == (False, "SIGTERM"), "the progress as it is after the wait"
    assert heartbeat.stat().st_mtime > time.time() - 5, "the heartbeat was refreshed as the look began"


def test_a_wait_looks_every_quarter_second_until_it_runs_out():
    clock = [100.0]
    looks = []

    def sleep(seconds):
        looks.append(seconds)
        clock[0] += seconds

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(async_watch, "job_status", lambda path: (False, 3.0))
        assert async_watch.wait_for_job("results", 1.1, (False, 3.0), sleep=sleep,
                                        clock=lambda: clock[0]) == (False, 3.0)
    assert looks == pytest.approx([0.25, 0.25, 0.25, 0.25, 0.1])


def test_a_negative_wait_is_refused(run_module, job):
    result = run_module(async_watch.main, {"results_file": str(job), "wait": -1})
    assert result["failed"] is True
    assert "wait must be 0 (look once) or more seconds" in result["msg"]
