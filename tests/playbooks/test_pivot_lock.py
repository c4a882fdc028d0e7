"""The per-host run lock (/run/pivot/pivot.lock): a run refuses while another live run holds it, touching nothing,
and takes over a lock whose run is dead. (A real concurrent pivot is in test_pivot_interrupted.py.)"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pivotlab
import pytest

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

HOSTS = ("ct200", "pro6000")
HOLDER_PLAYBOOK = Path(__file__).resolve().parent / "files" / "hold.yml"
LOCK_MESSAGE = "Another Pivot run holds"


def lock_record(controller: str, pid: int, acquired_epoch: float, run_id: str) -> dict:
    return {
        "run_id": run_id,
        "controller": controller,
        "controller_pid": pid,
        "acquired": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(acquired_epoch)),
        "acquired_epoch": int(acquired_epoch),
    }


@pytest.fixture
def live_holder(lab_up: None) -> Iterator[dict]:
    """A live ansible-playbook on this controller whose lock both hosts hold, as a run in progress leaves them."""
    holder = subprocess.Popen(["ansible-playbook", str(HOLDER_PLAYBOOK)], cwd=pivotlab.REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    record = lock_record(pivotlab.controller_id(), holder.pid, time.time(), "20260101T000000Z")
    try:
        for host in HOSTS:
            pivotlab.write_lock(host, record)
        yield record
    finally:
        pivotlab.kill_ansible_playbook(holder.pid)
        holder.wait(timeout=30)
        for host in HOSTS:
            pivotlab.remove_lock(host)


@pytest.fixture
def foreign_holder(lab_up: None) -> Iterator[dict]:
    """A lock taken a minute ago by a run on another controller (whose process this one cannot see)."""
    record = lock_record("ops-laptop:6f1c0a52-8d5e-4c11-9a0e-2f7b1c3d4e5f", 4242, time.time() - 60, "20260101T000100Z")
    try:
        for host in HOSTS:
            pivotlab.write_lock(host, record)
        yield record
    finally:
        for host in HOSTS:
            pivotlab.remove_lock(host)


@pytest.mark.parametrize("holder", ["live_holder", "foreign_holder"])
def test_pivot_refuses_while_another_run_holds_the_lock(
    holder: str, request: pytest.FixtureRequest, training: Callable[..., pivotlab.Training]
) -> None:
    record = request.getfixturevalue(holder)
    job, serving = training(), pivotlab.serving_state()

    run = pivotlab.run_playbook("pivot.yml")

    assert run.rc != 0, run.summary()
    assert LOCK_MESSAGE in run.message, run.summary()
    for detail in (record["run_id"], record["controller"], f"ansible-playbook PID {record['controller_pid']}",
                   "-e pivot_break_lock=true"):
        assert detail in run.message, run.summary()
    assert run.report is None, "a refused run starts no phase"
    after_training, after_serving = pivotlab.training_state(), pivotlab.serving_state()
    pivotlab.assert_training_untouched(job, after_training)
    pivotlab.assert_serving_untouched(serving, after_serving)
    assert after_training.lock == record and after_serving.lock == record, "the holder's lock was overwritten"


def test_rollback_refuses_while_another_run_holds_the_lock(live_holder: dict) -> None:
    serving = pivotlab.serving_state()

    run = pivotlab.run_playbook("rollback_nextn.yml")

    assert run.rc != 0, run.summary()
    assert LOCK_MESSAGE in run.message and live_holder["run_id"] in run.message, run.summary()
    after = pivotlab.serving_state()
    pivotlab.assert_serving_untouched(serving, after)
    assert after.lock == live_holder


def dead_pid() -> int:
    """The PID of a process of this controller that has ended."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


STALE_LOCKS = {
    # The run's ansible-playbook on this controller is gone (killed, machine rebooted, ...).
    "dead-run-here": lambda: lock_record(pivotlab.controller_id(), dead_pid(), time.time() - 30, "20260101T000200Z"),
    # Another controller's run older than run_lock_max_age (4 h): its PID cannot be checked from here.
    "expired-elsewhere": lambda: lock_record("ops-laptop:6f1c0a52", 4242, time.time() - 5 * 3600, "20260101T000300Z"),
}


@pytest.fixture
def lock_removed_after(lab_up: None) -> Iterator[None]:
    yield
    pivotlab.remove_lock("pro6000")


@pytest.mark.parametrize("stale", STALE_LOCKS, ids=list(STALE_LOCKS))
@pytest.mark.usefixtures("lock_removed_after")
def test_stale_lock_is_taken_over(stale: str) -> None:
    pivotlab.write_lock("pro6000", STALE_LOCKS[stale]())

    run = pivotlab.run_playbook("rollback_nextn.yml")

    assert run.rc == 0, run.summary()
    assert run.report is not None and run.report["status"] == "ok"
    after = pivotlab.serving_state()
    assert after.current == pivotlab.BASELINE and after.algorithm == "EAGLE"
    assert after.lock is None, "the run released the lock it took over"
