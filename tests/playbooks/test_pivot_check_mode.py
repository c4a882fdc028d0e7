"""`pivot.yml --check --diff` on a fresh world (training running, the original NEXTN unit serving, no release
recorded yet): it succeeds, shows the switch it would make, and changes nothing on any host."""

from __future__ import annotations

from collections.abc import Callable

import pivotlab
import pytest

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

WOULD_SWITCH_TASK = "pivot.ops.sglang_release : Report the switch check mode would make"
WOULD_STOP_TASK = "pivot.ops.stop_training : Start the stop on the training host"
# Announced only on a host whose running unit has not been recorded as the baseline yet.
WOULD_RECORD_TASK = "pivot.ops.sglang_release : Report the baseline check mode would record"
WOULD_BUILD_TASK = "pivot.ops.release_venv : Report the venv check mode would build"


def test_check_mode_previews_the_pivot_and_changes_nothing(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    job = training()

    run = pivotlab.run_playbook("pivot.yml", check=True, diff=True)

    assert run.rc == 0, run.summary()
    report = run.report
    assert report is not None and report["check_mode"] is True and report["status"] == "ok"
    assert run.phase_names() == ["preflight", "preflight", "release_venv", "sglang_release_prepare", "stop_training",
                                 "gpu_release", "sglang_release"]
    assert {p["status"] for p in report["phases"]} == {"checked"}
    switch = run.phase("sglang_release")["findings"]
    assert switch["switched"] is True and switch["release"] == "ddtree-d16-b64-k8" and switch["check_mode"] is True
    stop = run.phase("stop_training")["findings"]["result"]
    assert stop.startswith(f"Would stop {len(job.pids) - 1} process(es)"), stop  # all but run.sh's bash

    # Every change it reports is one it would make: a task showing its diff, or the switch it announces.
    assert run.changed("pro6000") > 0, run.summary()
    for host in ("ct200", "pro6000"):
        for task, result in run.changed_results(host):
            announced = task in (WOULD_SWITCH_TASK, WOULD_RECORD_TASK, WOULD_BUILD_TASK)
            assert announced or result.get("diff"), f"{host}: {task} changed without a diff"
    assert [t for t, _unused in run.changed_results("pro6000") if t == WOULD_SWITCH_TASK], "the switch is not announced"
    assert [t for t, _unused in run.changed_results("ct200")] == [WOULD_STOP_TASK]

    after_training, after_serving = pivotlab.training_state(), pivotlab.serving_state()
    # Training still runs with the same processes; no checkpoint was requested (none written, no signal logged).
    pivotlab.assert_training_untouched(job, after_training)
    # No release written, package not installed, unit and server untouched, no lock left.
    pivotlab.assert_serving_untouched(baseline, after_serving)
    assert not any(path.startswith("/etc/sglang/releases/ddtree") for path in after_serving.files)
    assert after_training.lock is None and after_serving.lock is None
