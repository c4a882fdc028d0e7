"""A training-side failure ends the pivot there: a job whose checkpoint never lands is left running, no later phase
runs, the serving host is not touched, and the report says so. (The roles' other training-side paths, GPUs held by
another process and a job that ignores SIGTERM, are the failure paths of the stop_training and gpu_release molecule
scenarios.)"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable

import pivotlab
import pytest
import stopwatch
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

PRODUCTION_TRAINING_VARS = pivotlab.REPO / "inventory" / "production" / "group_vars" / "training.yml"
CHECKPOINT_TIMEOUT_S = 5
# What the pivot prepares on the serving host before it stops the training (release venvs, wheelhouse, sources, the
# rendered releases and the baseline's recorded answers); the running unit and server are not among it.
PREPARED_BEFORE_THE_STOP = ("/opt/pivot/", "/etc/sglang/releases")


def production_checkpoint_settings() -> dict:
    return yaml.safe_load(PRODUCTION_TRAINING_VARS.read_text())["pivot_training_checkpoint"]


def checkpoint_settings_with_timeout(seconds: int) -> str:
    """The production checkpoint settings with a short timeout, as one JSON -e (it replaces the whole dict)."""
    return json.dumps({"pivot_training_checkpoint": {**production_checkpoint_settings(), "timeout": seconds}})


def test_checkpoint_that_never_lands_leaves_the_job_running(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    job = training("--checkpoint-on", "never")

    run = pivotlab.run_playbook("pivot.yml", checkpoint_settings_with_timeout(CHECKPOINT_TIMEOUT_S))

    assert run.rc != 0, run.summary()
    assert "Phase 'stop_training' failed on ct200" in run.message, run.summary()
    checkpoints = production_checkpoint_settings()["path"]
    assert (f"No new complete checkpoint matching {checkpoints}/step_* appeared within "
            f"{CHECKPOINT_TIMEOUT_S}s") in run.message, run.summary()
    assert "The job was left running; nothing was stopped." in run.message
    assert run.report is not None and run.report["status"] == "failed"
    assert run.phase_names()[-1] == "stop_training", "nothing after the failed stop may run"
    assert run.phase("stop_training")["status"] == "failed"

    after = pivotlab.training_state()
    assert after.pids == job.pids, "every process of the job still runs"
    assert after.checkpoints == job.checkpoints
    new_lines = after.signal_lines[len(job.signal_lines):]
    assert new_lines and all("Checkpoint requested (SIGUSR1)" in line for line in new_lines), new_lines
    # The running server was not touched: the baseline serves on, as it did. The release prepared before the stop
    # (its venv, wheelhouse and rendered unit, beside the baseline) may be new; nothing else changed.
    serving = pivotlab.serving_state()
    assert (serving.current, serving.unit, serving.server) == (baseline.current, baseline.unit, baseline.server)
    changed = sorted(path for path in baseline.files.keys() | serving.files.keys()
                     if baseline.files.get(path) != serving.files.get(path))
    assert all(path.startswith(PREPARED_BEFORE_THE_STOP) for path in changed), [
        path for path in changed if not path.startswith(PREPARED_BEFORE_THE_STOP)]


def test_a_forced_stop_says_the_work_it_lost_in_the_result_and_the_last_message(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    """pivot_training_force=true over a checkpoint that never lands: the pivot goes through, and neither the report's
    result nor the run's last message reads as a plain OK."""
    training("--checkpoint-on", "never")

    run = pivotlab.run_playbook("pivot.yml", checkpoint_settings_with_timeout(CHECKPOINT_TIMEOUT_S),
                                "pivot_training_force=true")

    assert run.rc == 0, run.summary()
    lost = run.phase("stop_training", "ct200")["findings"]["work_lost"]
    assert lost, run.phase("stop_training", "ct200")
    said = (f"{lost['steps_lost']} steps of training lost" if lost["steps_lost"] is not None
            else "training work lost (steps unknown)") + " by a forced stop on ct200"
    assert run.report is not None and run.report["status"] == "ok"
    assert run.report["result"].startswith(f"OK: switched to ddtree-d16-b64-k8; {said}"), run.report["result"]
    markdown = (pivotlab.ARTIFACTS / f"pivot-{run.run_id}.md").read_text()
    assert f"**Result: {run.report['result']}**" in markdown
    closing = [result.get("msg", "") for task, host, result in run.host_results()
               if task == "Say how the run ended" and host == "localhost"]
    assert closing == [f"{run.report['result']} (report: {run.report['report']})"], closing


def test_a_checkpoint_that_fills_the_disk_is_named_as_a_full_disk(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    """The disk fills during the requested save (after the preflight found room): the trainer dies with ENOSPC. The
    stop says so from the training log, instead of only "no checkpoint"; nothing after it runs."""
    job = training("--disk-room-mib", "0.01")  # a lab checkpoint is about 25 KiB

    run = pivotlab.run_playbook("pivot.yml")

    assert run.rc != 0, run.summary()
    assert "Phase 'stop_training' failed on ct200" in run.message, run.summary()
    assert "Every process of the job exited during the checkpoint wait" in run.message, run.summary()
    checkpoints = production_checkpoint_settings()["path"]
    said = re.search(r"The training log says the disk is full: (.+)\. Free space where the checkpoints go "
                     rf"\({re.escape(checkpoints)}, [\d.]+ GiB free now\) before the next try\.", run.message)
    assert said, run.summary()
    assert "OSError: [Errno 28] No space left on device" in said.group(1)
    assert "Nothing was stopped by this module." in run.message
    assert run.phase_names()[-1] == "stop_training", "nothing after the failed stop may run"
    after = pivotlab.training_state()
    assert after.pids == set(), "the trainer died of the full disk"
    assert {name for name, complete in after.checkpoints.items() if complete} == {
        name for name, complete in job.checkpoints.items() if complete}, "no new complete checkpoint"
    serving = pivotlab.serving_state()
    assert (serving.current, serving.unit, serving.server) == (baseline.current, baseline.unit, baseline.server)


# --- progress ------------------------------------------------------------------------------------------------------

SLOW_CHECKPOINT_S = 40
PROGRESS_EVERY_S = 30
CHECKPOINT_PROGRESS = re.compile(
    r"^waiting for a complete checkpoint newer than the request: (?P<waited>\d+) s of (?P<timeout>\d+), "
    r"(?P<seen>no new one yet.*|newest step_\d{9} \((?P<state>.+), [\d.]+ (?:B|KiB|MiB|GiB)\))$"
)
STOP_DONE = r"TASK \[pivot\.ops\.stop_training : Publish what the stop found\]"


def test_a_slow_checkpoint_prints_progress_at_least_every_30_s(training: Callable[..., pivotlab.Training]) -> None:
    """A 40 s save: the default output (pivot.ops.progress, 15 s between lines of one stage) says what the stop waits
    for, how long it has waited and what it sees, while it waits. The run is ended once the stop is done: the serving
    side is not what this test is about."""
    training("--checkpoint-seconds", str(SLOW_CHECKPOINT_S))
    run = stopwatch.TerminalRun.start("pivot.yml")
    try:
        run.wait_for_line(STOP_DONE, timeout=400)
    finally:
        run.kill()

    waits = [(at, CHECKPOINT_PROGRESS.match(text)) for at, text in run.progress()
             if text.startswith("waiting for a complete checkpoint")]
    assert all(match for _at, match in waits), [text for _at, text in run.progress()]
    assert len(waits) >= SLOW_CHECKPOINT_S // PROGRESS_EVERY_S + 1, run.output[-4000:]
    assert {match["timeout"] for _at, match in waits} == {"900"}
    assert any(match["state"] == "growing" for _at, match in waits), "the save was seen growing"
    arrivals = [at for at, _match in waits]
    assert max(b - a for a, b in itertools.pairwise(arrivals)) <= PROGRESS_EVERY_S, arrivals
    waited = [int(match["waited"]) for _at, match in waits]
    assert waited == sorted(waited) and waited[-1] >= SLOW_CHECKPOINT_S - PROGRESS_EVERY_S
    assert "FAILED - RETRYING" not in run.output
