"""The way back to training on the lab: pivot -> rollback (resume_training_after_rollback=true) -> the job runs again
from the checkpoint the pivot confirmed, its log continuing after that step; a preview before starts nothing and a
second resume_training.yml changes nothing. And the per-host lock: a resume refuses while another run holds ct200.
(Every other refusal of the resume is in the resume_training molecule scenario.)"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import labctl
import pivotlab
import pytest

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

HOLDER_PLAYBOOK = Path(__file__).resolve().parent / "files" / "hold.yml"
# The stop's and the resume's watches poll every second instead of the roles' 5 s, so that each run goes on as soon as
# its stop or resume on ct200 has ended (what they do and report is the same).
STOP_POLL = "stop_training_poll_delay=1"
RESUME_POLL = "resume_training_poll_delay=1"


def log_since(offset: int) -> str:
    result = labctl.pct_exec(["tail", "-c", f"+{offset + 1}", "/root/train/train.log"])
    assert result.rc == 0, result.stderr
    return result.stdout


def test_pivot_then_rollback_resumes_training_from_the_pivots_checkpoint(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    training()
    pivot = pivotlab.run_playbook("pivot.yml", STOP_POLL)
    assert pivot.rc == 0, pivot.summary()
    stop = pivot.phase("stop_training", "ct200")["findings"]
    checkpoint, step = stop["checkpoint_path"], int(stop["checkpoint_step"])
    stopped = pivotlab.training_state()
    assert not stopped.pids

    preview = pivotlab.run_playbook("resume_training.yml", check=True, diff=True)
    assert preview.rc == 0, preview.summary()
    checked = preview.phase("resume_training", "ct200")
    assert checked["status"] == "checked" and checked["findings"]["checkpoint"] == checkpoint, checked
    assert not pivotlab.training_state().pids, "the preview started the job"

    rollback = pivotlab.run_playbook("rollback_nextn.yml", "resume_training_after_rollback=true", RESUME_POLL)
    assert rollback.rc == 0, rollback.summary()
    assert rollback.phase_names()[-2:] == ["sglang_release_rollback", "resume_training"], rollback.phase_names()
    resumed = rollback.phase("resume_training", "ct200")["findings"]
    assert resumed["checkpoint"] == checkpoint and resumed["started"], resumed
    assert resumed["first_step"] == step + 1, resumed
    assert pivotlab.serving_state().algorithm == "EAGLE"
    running = pivotlab.training_state()
    assert len(running.pids) == pivotlab.JOB_PROCESSES, running.processes
    log = log_since(stopped.log_size)
    assert f"Resuming from checkpoint {checkpoint} (global step {step})" in log, log[-2000:]
    assert f" step={step + 1} " in log

    again = pivotlab.run_playbook("resume_training.yml", RESUME_POLL)
    assert again.rc == 0, again.summary()
    assert again.changed("ct200") == 0, again.changed_results("ct200")
    assert pivotlab.training_state().pids == running.pids
    assert " is running: " in again.phase("resume_training", "ct200")["findings"]["result"]


@pytest.fixture
def live_holder(lab_up: None) -> Iterator[dict]:
    """A live ansible-playbook on this controller holding ct200's lock, as a run in progress does."""
    holder = subprocess.Popen(["ansible-playbook", str(HOLDER_PLAYBOOK)], cwd=pivotlab.REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    record = {"run_id": "20260101T000000Z", "controller": pivotlab.controller_id(), "controller_pid": holder.pid,
              "acquired": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "acquired_epoch": int(time.time())}
    try:
        pivotlab.write_lock("ct200", record)
        yield record
    finally:
        pivotlab.kill_ansible_playbook(holder.pid)
        holder.wait(timeout=30)
        pivotlab.remove_lock("ct200")


def test_resume_refuses_while_another_run_holds_the_lock(no_training: pivotlab.Training, live_holder: dict) -> None:
    run = pivotlab.run_playbook("resume_training.yml")
    assert run.rc != 0, run.summary()
    assert "Another Pivot run holds ct200's lock" in run.message and live_holder["run_id"] in run.message, run.summary()
    after = pivotlab.training_state()
    assert not after.pids and after.lock == live_holder
