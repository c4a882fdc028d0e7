"""A pivot in progress holds both hosts' locks: a second pivot started meanwhile refuses and leaves them alone. The
first run is then killed (SIGKILL to it and all it started, as when the operator's machine dies) after it stopped the
training job, in the middle of the switch, with no server running. A re-run takes over its stale locks and converges
to the DDTree release; the job is not restarted, and the checkpoint the killed run confirmed stays on disk.

Ctrl-C during the training stop never leaves a stop running unwatched: pressed while the stop waits for the
checkpoint, the stop on ct200 cancels itself once the controller's heartbeat is gone (the job runs on, nothing was
killed), also when the checkpoint lands before that (no SIGTERM without a look of the controller after it); pressed
after SIGTERM went out, the stop finishes by itself and the next run records it as finished unattended."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import labctl
import pivotlab
import pytest
import stopwatch

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

# Printed once every host has written its lock (run_lock runs before the preflight phase starts).
LOCKS_TAKEN = r"TASK \[pivot\.ops\.run_phase : Name the phase after its role and note when it starts\]"
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
    assert [p["phase"] for p in report["phases"]][-1] == "gpu_release", "killed during the switch"
    # The report the killed run left behind never says OK: it did not finish, and it says what to run.
    assert report["status"] == "running" and not report["finished"], report["result"]
    assert report["result"].startswith("RUNNING: this run has not finished; the last phase recorded is gpu_release "
                                       "on ct200 (ok)"), report["result"]
    assert "ansible-playbook playbooks/rollback_nextn.yml brings the baseline back" in report["result"]
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
    assert run.report is not None and run.report["status"] == "ok" and run.report["finished"]
    # judged at the end by what the controller saw on the serving host, not by the absence of a failure
    served = run.report["served"]["pro6000"]
    assert served["reachable"] and served["healthy"] and served["release"] == "ddtree-d16-b64-k8", served
    assert served["active_state"] == "active" and served["algorithm"] == "DDTREE", served
    training_checks = {c["name"]: c for c in run.phase("preflight", "ct200")["findings"]["checks"]}
    assert "already gone" in training_checks["training_job"]["detail"]
    assert run.phase("stop_training")["findings"]["result"].startswith("No process of the job is running")
    markdown = Path(run.report["report"]).read_text()
    assert "| checkpoint | - (step -) |" in markdown and "(step )" not in markdown, "a stop that found no job"
    switch = run.phase("sglang_release")["findings"]
    assert switch["switched"] is True and switch["algorithm"] == "DDTREE" and switch["draft_tokens"] == 16

    training, serving = pivotlab.training_state(), pivotlab.serving_state()
    assert training.pids == set(), "the job was restarted"
    assert training.checkpoints == interruption.training_after_kill.checkpoints
    assert serving.current == pivotlab.DDTREE and serving.active and serving.algorithm == "DDTREE"
    assert training.lock is None and serving.lock is None, "the re-run released the locks it took over"


# --- a serving host lost in the middle of a switch ------------------------------------------------------------------

# How long pro6000 takes no SSH connection (its sshd stopped, every session ended: as a network partition would) once
# the NEXTN server has stopped: longer than the rest of the run, so its closing check cannot reach the host either.
OUTAGE_S = 25


def test_a_serving_host_lost_in_the_middle_of_a_switch_is_never_reported_ok(no_training: pivotlab.Training) -> None:
    """The pivot of the issue: from the NEXTN baseline, with the job already stopped, the serving host becomes
    unreachable right after the NEXTN server stopped. No phase records the switch's end and no rollback can reach the
    host; the closing check from the controller cannot reach it either: the run ends INCOMPLETE (it used to end "OK:
    switched ..." with the server down), says what it could not check, and fails."""
    pivotlab.ensure_baseline()
    run = pivotlab.BackgroundRun.start("pivot.yml")
    try:
        run.wait_for_line(SERVER_STOPPED, timeout=300)
        outage = labctl.ssh("pro6000", labctl.sshd_outage(OUTAGE_S))
        assert outage.rc == 0, outage.stderr
        run.wait_for_line(r"^PLAY RECAP", timeout=OUTAGE_S + 240)
    finally:
        run.kill()
    assert run.process.returncode != 0, run.output[-3000:]
    assert "UNREACHABLE!" in run.output, run.output[-3000:]
    report = json.loads((pivotlab.ARTIFACTS / "pivot-latest.json").read_text())
    assert report["status"] == "incomplete" and report["finished"], (report["result"], run.output[-3000:])
    assert report["result"].startswith("INCOMPLETE: no switch was recorded on pro6000 (the host was lost or the run "
                                       "stopped before it); what pro6000 serves could not be checked"), report["result"]
    assert report["served"]["pro6000"]["reachable"] is False
    assert "INCOMPLETE: no switch was recorded on pro6000" in run.output, "the run's last message says so"
    assert "OK: switched" not in run.output
    stopwatch.wait_until(lambda: labctl.ssh("pro6000", "true").rc == 0, OUTAGE_S + 60, "pro6000 reachable again")


# Printed when phase 5 starts on ct200: the job is stopped, its GPUs not yet proven free.
TRAINING_GPUS = r"TASK \[Prove the training GPUs are free\]"
TRAINING_OUTAGE_S = 15


def test_a_training_host_lost_before_its_gpus_are_proven_free_switches_nothing(
    no_training: pivotlab.Training,
) -> None:
    """ct200 is lost while phase 5 proves its GPUs free. Through its node a lost container either fails its task
    (`pct exec` exits 255: the phase fails and the run ends there) or comes back UNREACHABLE (Ansible then goes on to
    the next play, and phase 6 refuses to switch unless phases 4-5 ended on every training host), depending on the
    moment; both happen on the lab. Either way the NEXTN server serves on, never restarted, and the run is not OK."""
    baseline = pivotlab.ensure_baseline()
    run = pivotlab.BackgroundRun.start("pivot.yml")
    try:
        run.wait_for_line(TRAINING_GPUS, timeout=300)
        outage = labctl.pct_exec(["sh", "-c", labctl.sshd_outage(TRAINING_OUTAGE_S)])
        assert outage.rc == 0, outage.stderr
        run.wait_for_line(r"^PLAY RECAP", timeout=TRAINING_OUTAGE_S + 240)
    finally:
        run.kill()
    stopwatch.wait_until(lambda: labctl.pct_exec(["true"]).rc == 0, TRAINING_OUTAGE_S + 60, "ct200 reachable again")
    assert run.process.returncode != 0, run.output[-3000:]
    phase_failed = "Phase 'gpu_release' failed on ct200" in run.output
    switch_refused = ("Phases 4-5 did not end on ct200 (the host was lost, or the run stopped there): no "
                      "checkpoint-confirmed stop and free GPUs are proven, so the server is not switched") in run.output
    assert phase_failed or switch_refused, run.output[-3000:]
    assert "TASK [Switch the server to the DDTree release]" not in run.output, "the switch started"
    report = json.loads((pivotlab.ARTIFACTS / "pivot-latest.json").read_text())
    assert report["status"] in ("failed", "running"), report["result"]
    serving = pivotlab.serving_state()
    assert (serving.current, serving.active, serving.algorithm) == (baseline.current, True, "EAGLE"), serving
    assert serving.server == baseline.server, "the NEXTN server was not restarted"


# --- Ctrl-C during the training stop -----------------------------------------------------------------------------

# The stop's watch polls (and refreshes the heartbeat) every POLL_DELAY_S, so a heartbeat of several polls goes
# stale only once the controller is gone; both shorter than the roles' defaults (5 s, 60 s), so that the stop notices
# a Ctrl-C sooner.
POLL_DELAY_S = 2
HEARTBEAT_TIMEOUT_S = 10
GRACE_PERIOD_S = 45
# The job's torchrun agent SIGKILLs the workers that ignore SIGTERM this long after the stop's SIGTERM (torchrun's
# default is 30 s): longer than the heartbeat takes to go stale after the Ctrl-C, so the stop ends unattended, and
# shorter than the grace period, so the stop never needs SIGKILL itself.
TORCHRUN_SHUTDOWN_TIMEOUT_S = 20
WATCH_VARS = (f"stop_training_poll_delay={POLL_DELAY_S}", f"stop_training_heartbeat_timeout={HEARTBEAT_TIMEOUT_S}")
CHECKPOINT_WAIT = r"^ct200: waiting for a complete checkpoint newer than the request: "
SIGTERM_WAIT = r"^ct200: SIGTERM sent: waiting for the job to exit"


# Ctrl-C while the checkpoint is being written: it lands CHECKPOINT_SECONDS after the request, some seconds after the
# Ctrl-C (pressed at the first progress line, about 5 s after the request) and well before the heartbeat goes stale
# (CANCEL_HEARTBEAT_TIMEOUT_S after the last look). A fresh heartbeat is not taken for a watching controller: the stop
# waits for a look after the checkpoint landed, none comes, and it cancels.
CHECKPOINT_SECONDS = 12
CANCEL_HEARTBEAT_TIMEOUT_S = 25


def test_ctrl_c_while_the_stop_waits_for_its_checkpoint_cancels_it_and_the_job_runs_on(
    training: Callable[..., pivotlab.Training]
) -> None:
    job = training("--checkpoint-seconds", str(CHECKPOINT_SECONDS))
    run = stopwatch.TerminalRun.start("pivot.yml", f"stop_training_poll_delay={POLL_DELAY_S}",
                                      f"stop_training_heartbeat_timeout={CANCEL_HEARTBEAT_TIMEOUT_S}")
    try:
        run.wait_for_line(CHECKPOINT_WAIT, timeout=400)
    except AssertionError:
        run.kill()
        raise
    first_run_id = pivotlab.training_state().lock["run_id"]

    assert run.ctrl_c() != 0

    def cancelled() -> list[dict]:
        return [r for r in stopwatch.host_records() if r["run_id"] == first_run_id and r["outcome"] == "cancelled"]

    [record] = stopwatch.wait_until(cancelled, CANCEL_HEARTBEAT_TIMEOUT_S + CHECKPOINT_SECONDS + 40,
                                    "cancelled stop on ct200")
    # async_wrapper looks at its module every 5 s: it ends a few seconds after the module
    stopwatch.wait_until(lambda: not stopwatch.stop_processes(), 20, "end of the stop's processes")
    assert record["finished_unattended"] is True and record["committed_at"] is None
    assert record["msg"].startswith("Cancelled: the controller stopped watching this stop")
    assert "The job was left running; nothing was stopped." in record["msg"]
    # the checkpoint landed after the Ctrl-C, while the heartbeat was still fresh: kept, and no SIGTERM followed
    landed = record["checkpoint"]["path"].rsplit("/", 1)[-1]
    assert f"The checkpoint it had asked for is complete: {record['checkpoint']['path']}" in record["msg"]
    after = pivotlab.training_state()
    assert after.pids == job.pids, "every process of the job still runs"
    assert after.checkpoints == {**job.checkpoints, landed: True}
    new_lines = after.signal_lines[len(job.signal_lines):]
    assert new_lines and all("Checkpoint requested (SIGUSR1)" in line for line in new_lines), new_lines


def test_ctrl_c_after_sigterm_lets_the_stop_finish_and_the_next_run_records_it() -> None:
    job = pivotlab.start_training("--on-sigterm", "ignore", torchrun_shutdown_timeout=TORCHRUN_SHUTDOWN_TIMEOUT_S)
    run = stopwatch.TerminalRun.start("pivot.yml", *WATCH_VARS, f"pivot_training_grace_period={GRACE_PERIOD_S}")
    try:
        run.wait_for_line(SIGTERM_WAIT, timeout=400)
    except AssertionError:
        run.kill()
        raise
    first_run_id = pivotlab.training_state().lock["run_id"]

    assert run.ctrl_c() != 0
    assert pivotlab.training_state().pids, "the job ignores SIGTERM: it still runs when the controller is gone"

    def stopped() -> list[dict]:
        return [r for r in stopwatch.host_records() if r["run_id"] == first_run_id and r["outcome"] == "stopped"]

    [record] = stopwatch.wait_until(stopped, GRACE_PERIOD_S + 60, "finished stop on ct200")
    stopwatch.wait_until(lambda: not stopwatch.stop_processes(), 20, "end of the stop's processes")
    # (the torchrun agent SIGKILLs the workers that ignore SIGTERM after its own TORCHRUN_SHUTDOWN_TIMEOUT_S, within
    # the grace period)
    assert record["finished_unattended"] is True and record["committed_at"] is not None
    assert sorted(p["pid"] for p in record["job"]["processes"]) == sorted(job.pids - {_run_sh(job)})
    training_after = pivotlab.training_state()
    assert training_after.pids == set(), f"the stop did not finish the job: {training_after.processes}"
    checkpoint = record["checkpoint"]["path"].rsplit("/", 1)[-1]
    assert training_after.checkpoints.get(checkpoint) is True, "the checkpoint it confirmed is complete on disk"

    rerun = pivotlab.run_playbook("pivot.yml", f"stop_training_poll_delay={POLL_DELAY_S}")

    stop = rerun.phase("stop_training")
    assert stop["status"] == "ok", rerun.summary()
    assert stop["findings"]["result"].startswith("No process of the job is running")
    assert (first_run_id, "stopped") in [(e["run_id"], e["outcome"]) for e in stop["findings"]["earlier_stops"]]
    last = json.loads((pivotlab.REPO / "state" / "ct200" / "last-stop.json").read_text())
    assert (last["run_id"], last["outcome"], last["finished_unattended"]) == (first_run_id, "stopped", True)
    assert last["checkpoint"]["path"] == record["checkpoint"]["path"]
    assert last["imported_by_run_id"] == rerun.run_id
    history = (pivotlab.REPO / "state" / "ct200" / "stops.jsonl").read_text().splitlines()
    assert json.loads(history[-1])["run_id"] == first_run_id
    assert stopwatch.host_records() == [], "imported records are removed from the host"


def _run_sh(job: pivotlab.Training) -> int:
    """run.sh's bash: not part of what the stop signals (it matches train_dflash_pipeline.py, run.sh's child)."""
    return next(p["pid"] for p in job.processes if "/opt/trainsim/run.sh" in p["args"])
