"""A training-side failure ends the pivot there: a job whose checkpoint never lands is left running, no later phase
runs, the serving host is not touched, and the report says so. (The roles' other training-side paths, GPUs held by
another process and a job that ignores SIGTERM, are the failure paths of the stop_training and gpu_release molecule
scenarios.)"""

from __future__ import annotations

import json
from collections.abc import Callable

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
