# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The rule an unwatched stop follows (cancel only before anything that ends the job), the host lock, the records."""

from __future__ import annotations

import json
import os
import signal

import pytest
from ansible_collections.pivot.ops.plugins.module_utils.stop_record import (
    CommitState,
    HostLock,
    HostLockBusy,
    ensure_state_dir,
    record_path,
    should_cancel,
    write_record,
)


def test_a_watched_stop_is_never_cancelled():
    assert should_cancel(CommitState(), heartbeat_stale=False) is False


def test_an_unwatched_stop_is_cancelled_until_something_ends_the_job():
    commit = CommitState()
    assert should_cancel(commit, heartbeat_stale=True) is True
    commit.note_signal(signal.SIGUSR1, "checkpoint request by SIGUSR1")
    assert should_cancel(commit, heartbeat_stale=True) is True, "a checkpoint request does not end the job"
    commit.note_ending("SIGTERM")
    assert should_cancel(commit, heartbeat_stale=True) is False
    assert commit.first_action == "SIGTERM" and commit.committed_at.endswith("Z")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGKILL])
def test_a_checkpoint_request_by_a_signal_that_may_end_the_job_commits(signum):
    commit = CommitState()
    commit.note_signal(signum, f"checkpoint request by {signal.Signals(signum).name}")
    assert commit.committed and should_cancel(commit, heartbeat_stale=True) is False


def test_the_first_ending_action_is_kept():
    commit = CommitState()
    commit.note_ending("systemctl stop trainer.service")
    first = commit.committed_at
    commit.note_ending("SIGTERM")
    assert (commit.first_action, commit.committed_at) == ("systemctl stop trainer.service", first)


def test_one_stop_at_a_time_and_the_waiter_learns_who_holds_the_host(tmp_path):
    first, second = HostLock(str(tmp_path)), HostLock(str(tmp_path))
    first.try_acquire({"pid": 11, "run_id": "run-a"})
    with pytest.raises(HostLockBusy) as busy:
        second.try_acquire({"pid": 12, "run_id": "run-b"})
    assert busy.value.holder == {"pid": 11, "run_id": "run-a"}
    first.release()
    second.try_acquire({"pid": 12, "run_id": "run-b"})
    assert json.loads((tmp_path / "lock").read_text()) == {"pid": 12, "run_id": "run-b"}
    second.release()


def test_who_holds_the_lock_is_read_without_taking_it(tmp_path):
    lock = HostLock(str(tmp_path))
    assert lock.held_by() is None, "no lock file yet"
    holder = HostLock(str(tmp_path))
    holder.try_acquire({"pid": 11})
    assert lock.held_by() == {"pid": 11}
    holder.release()
    assert lock.held_by() is None
    assert json.loads((tmp_path / "lock").read_text()) == {"pid": 11}, "the probe wrote nothing"


def test_waiting_for_the_lock_reports_and_gives_up_at_its_limit(tmp_path):
    holder = HostLock(str(tmp_path))
    holder.try_acquire({"pid": 11})
    now = {"t": 0.0}
    waits = []

    def sleep(seconds):
        now["t"] += seconds

    with pytest.raises(HostLockBusy):
        HostLock(str(tmp_path)).acquire({"pid": 12}, 3.0, lambda other, waited: waits.append((other, waited)),
                                        poll_interval=1.0, clock=lambda: now["t"], sleep=sleep)
    assert waits == [({"pid": 11}, 0.0), ({"pid": 11}, 1.0), ({"pid": 11}, 2.0)]
    holder.release()


def test_the_lock_is_taken_once_the_earlier_stop_ends(tmp_path):
    holder = HostLock(str(tmp_path))
    holder.try_acquire({"pid": 11})
    waiter = HostLock(str(tmp_path))
    waiter.acquire({"pid": 12}, 10.0, lambda _other, _waited: holder.release(), clock=lambda: 0.0,
                   sleep=lambda _s: None)
    assert json.loads((tmp_path / "lock").read_text()) == {"pid": 12}
    waiter.release()


def test_records_are_root_only_and_named_by_start_time_and_pid(tmp_path):
    ensure_state_dir(str(tmp_path / "state"))
    assert oct(os.stat(tmp_path / "state" / "records").st_mode & 0o777) == "0o700"
    path = record_path(str(tmp_path / "state"), "2026-11-30T15:34:01Z", 4242)
    assert path == str(tmp_path / "state" / "records" / "20261130T153401Z-4242.json")
    write_record(path, {"outcome": "stopped"})
    with open(path) as handle:
        assert json.load(handle) == {"outcome": "stopped"}
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert os.listdir(tmp_path / "state" / "records") == ["20261130T153401Z-4242.json"], "no temporary file left"
