"""A pivot in progress holds both hosts' locks: a second pivot started meanwhile refuses and leaves them alone. The
first run is then killed (SIGKILL to it and all it started, as when the operator's machine dies) after it stopped the
training job, in the middle of the switch, with no server running. A re-run takes over its stale locks and converges
to the DDTree release; the job is not restarted, and the checkpoint the killed run confirmed stays on disk."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pivotlab
import pytest

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

# Printed once every host has written its lock (run_lock runs before the preflight phase starts).
LOCKS_TAKEN = r"TASK \[pivot\.ops\.run_phase : Note when the phase starts\]"
# Printed after "Stop the running server" has returned: the old server is down, the new one not yet started.
SERVER_STOPPED = r"TASK \[Prove the server's GPUs are free before starting another\]"


@dataclass(frozen=True)
class Interruption:
    first_pid: int
    locks_held: dict[str, dict | None]
    second: pivotlab.PlaybookRun
    locks_after_second: dict[str, dict | None]
    job: pivotlab.Training
    training_after_kill: pivotlab.Training
    serving_after_kill: pivotlab.Serving

    @property
    def first_run_id(self) -> str:
        lock = self.locks_held["pro6000"]
        assert lock is not None
        return lock["run_id"]

    def first_report(self) -> dict:
        return json.loads((pivotlab.ARTIFACTS / f"pivot-{self.first_run_id}.json").read_text())


def locks() -> dict[str, dict | None]:
    return {"ct200": pivotlab.training_state().lock, "pro6000": pivotlab.serving_state().lock}


@pytest.fixture(scope="module")
def interruption(lab_up: None) -> Interruption:
    pivotlab.ensure_baseline()
    job = pivotlab.ensure_training()
    first = pivotlab.BackgroundRun.start("pivot.yml")
    try:
        first.wait_for_line(LOCKS_TAKEN, timeout=60)
        held = locks()
        second = pivotlab.run_playbook("pivot.yml")
        after_second = locks()
        first.wait_for_line(SERVER_STOPPED, timeout=300)
    finally:
        first.kill()
    return Interruption(first.process.pid, held, second, after_second, job, pivotlab.training_state(),
                        pivotlab.serving_state())


def test_second_pivot_refuses_while_the_first_runs(interruption: Interruption) -> None:
    for host, lock in interruption.locks_held.items():
        assert lock is not None and lock["controller_pid"] == interruption.first_pid, f"{host}: {lock}"
    second = interruption.second
    assert second.rc != 0, second.summary()
    assert "Another Pivot run holds" in second.message, second.summary()
    assert interruption.first_run_id in second.message and f"PID {interruption.first_pid}" in second.message
    assert second.report is None, "a refused run starts no phase"
    assert interruption.locks_after_second == interruption.locks_held, "the refused run touched the first's locks"


def test_killed_run_stopped_the_job_after_a_checkpoint(interruption: Interruption) -> None:
    report = interruption.first_report()
    assert [p["phase"] for p in report["phases"]][-1] == "install_ddtree_runtime", "killed during the switch"
    stopped = next(p for p in report["phases"] if p["phase"] == "stop_training")
    assert stopped["status"] == "ok" and stopped["findings"]["sigkill_needed"] is False
    checkpoint = stopped["findings"]["checkpoint_path"].rsplit("/", 1)[-1]
    training = interruption.training_after_kill
    assert training.pids == set(), f"the job survived: {training.processes}"
    assert training.checkpoints.get(checkpoint) is True, f"{checkpoint} is not complete on disk"
    serving = interruption.serving_after_kill
    assert serving.server is None and not serving.active, "killed with the old server stopped and no new one"
    assert serving.current != pivotlab.DDTREE


def test_rerun_after_the_kill_converges(interruption: Interruption) -> None:
    stale = locks()
    assert stale == interruption.locks_held, "the killed run's locks are still there, naming its dead PID"

    run = pivotlab.run_playbook("pivot.yml")

    assert run.rc == 0, run.summary()
    assert run.report is not None and run.report["status"] == "ok"
    training_checks = {c["name"]: c for c in run.phase("preflight", "ct200")["findings"]["checks"]}
    assert "already gone" in training_checks["training_job"]["detail"]
    assert run.phase("stop_training")["findings"]["result"].startswith("No process of the job is running")
    switch = run.phase("switch_service")["findings"]
    assert switch["switched"] is True and switch["algorithm"] == "DDTREE" and switch["draft_tokens"] == 16

    training, serving = pivotlab.training_state(), pivotlab.serving_state()
    assert training.pids == set(), "the job was restarted"
    assert training.checkpoints == interruption.training_after_kill.checkpoints
    assert serving.current == pivotlab.DDTREE and serving.active and serving.algorithm == "DDTREE"
    assert training.lock is None and serving.lock is None, "the re-run released the locks it took over"
