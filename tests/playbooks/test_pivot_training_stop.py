"""The training side when things do not go to plan: a job whose checkpoint never lands is left running, GPUs that
another process still holds after the stop end the pivot there (in both cases the serving host is not touched), and
a job that ignores SIGTERM is killed after the grace period (the pivot goes on, and the report says so)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import labctl
import pivotlab
import pytest
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

PRODUCTION_TRAINING_VARS = pivotlab.REPO / "inventory" / "production" / "group_vars" / "training.yml"
CHECKPOINT_TIMEOUT_S = 5


def checkpoint_settings_with_timeout(seconds: int) -> str:
    """The production checkpoint settings with a short timeout, as one JSON -e (it replaces the whole dict)."""
    settings = yaml.safe_load(PRODUCTION_TRAINING_VARS.read_text())["pivot_training_checkpoint"]
    return json.dumps({"pivot_training_checkpoint": {**settings, "timeout": seconds}})


def test_checkpoint_that_never_lands_leaves_the_job_running(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    job = training("--checkpoint-on", "never")

    run = pivotlab.run_playbook("pivot.yml", checkpoint_settings_with_timeout(CHECKPOINT_TIMEOUT_S))

    assert run.rc != 0, run.summary()
    assert "Phase 'stop_training' failed on ct200" in run.message, run.summary()
    assert (f"No new complete checkpoint matching /root/train/checkpoints/step_* appeared within "
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
    # The serving host was not touched: the baseline serves on, as it did.
    serving = pivotlab.serving_state()
    pivotlab.assert_serving_untouched(baseline, serving)


@pytest.fixture
def stray_gpu_process(lab_up: None) -> Iterator[int]:
    """Someone else's process on ct200 holding memory on GPU 3 (through the lab's GPU double), not part of the job."""
    started = labctl.pct_exec(["sh", "-c", "cd /usr/local/lib/pivot-lab && setsid nohup python3 -m fake_gpu hold "
                               "--gpus 3:4096 >/dev/null 2>&1 </dev/null & echo $!"])
    assert started.rc == 0, started.stderr
    pid = int(started.stdout)
    try:
        yield pid
    finally:
        labctl.pct_exec(["kill", "-KILL", str(pid)])


def test_gpus_still_held_after_the_stop_leave_the_serving_host_alone(
    stray_gpu_process: int, training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    training()

    run = pivotlab.run_playbook("pivot.yml", "pivot_training_gpu_timeout=4")

    assert run.rc != 0, run.summary()
    assert "Phase 'training_gpu_release' failed on ct200" in run.message, run.summary()
    # It names the process that holds the GPU, with its command line and how to end it.
    assert f"PID {stray_gpu_process} 'python3 -m fake_gpu hold" in run.message, run.summary()
    assert f"kill {stray_gpu_process}" in run.message, run.summary()
    assert run.report is not None and run.report["status"] == "failed"
    assert run.phase_names()[-1] == "training_gpu_release", "nothing after the failed GPU check may run"
    findings = run.phase("training_gpu_release")["findings"]
    assert findings["released"] is False and stray_gpu_process in findings["processes_before"], findings
    assert run.phase("stop_training")["status"] == "ok"
    pivotlab.assert_serving_untouched(baseline, pivotlab.serving_state())


def test_job_ignoring_sigterm_is_killed_and_the_pivot_completes(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    job = training("--on-sigterm", "ignore")

    run = pivotlab.run_playbook("pivot.yml", "pivot_training_grace_period=3")

    assert run.rc == 0, run.summary()
    assert run.report is not None and run.report["status"] == "ok"
    stopped = run.phase("stop_training")["findings"]
    assert stopped["sigkill_needed"] is True, stopped
    assert stopped["signals_sent"].get("SIGKILL", 0) > 0 and stopped["signals_sent"].get("SIGTERM", 0) > 0, stopped
    assert "SIGKILL was needed" in stopped["result"]
    checkpoint = stopped["checkpoint_path"].rsplit("/", 1)[-1]

    after = pivotlab.training_state()
    assert after.pids == set(), f"the job survived: {after.processes}"
    assert after.checkpoints.get(checkpoint) is True, "the checkpoint was confirmed before the job was ended"
    assert any("SIGTERM ignored" in line for line in after.signal_lines[len(job.signal_lines):])
    serving = pivotlab.serving_state()
    assert serving.current == pivotlab.DDTREE and serving.active and serving.algorithm == "DDTREE", serving
    assert run.phase("switch_service")["findings"]["release"] == "ddtree-d16-b64-k8"
