"""A new release that fails after the old server was stopped is rolled back automatically: the NEXTN baseline serves
again (EAGLE, healthy), the play fails saying what failed and that the baseline is back, and the report says so.
(A release below the acceptance gate takes the same path; the sglang_release molecule scenario covers it.)"""

from __future__ import annotations

from collections.abc import Iterator

import labctl
import pivotlab
import pytest

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

DRAFTER = "/root/models/Qwen3.6-27B-DFlash"
BROKEN_DRAFTER = "/root/models/Qwen3.6-27B-DFlash-broken"
HEALTH_TIMEOUT_S = 15
ROLLED_BACK = "Rolled back: nextn-baseline is serving again (EAGLE, healthy)."


@pytest.fixture(scope="module")
def broken_drafter(lab_up: None) -> Iterator[str]:
    """A drafter whose config is sound (preflight passes) but whose weights were cut short, like a copy that was
    interrupted: the server fails while loading it."""
    weights = f"{BROKEN_DRAFTER}/model.safetensors"
    made = labctl.ssh("pro6000", f"cp -a {DRAFTER} {BROKEN_DRAFTER} && truncate -s 4096 {weights}")
    assert made.rc == 0, made.stderr
    try:
        yield BROKEN_DRAFTER
    finally:
        labctl.ssh("pro6000", f"rm -rf {BROKEN_DRAFTER}")


def assert_rolled_back(run: pivotlab.PlaybookRun, before: pivotlab.Serving, release: str) -> pivotlab.Serving:
    """The play failed naming the release, the baseline serves again, and the report records the failed switch."""
    assert run.rc != 0, run.summary()
    assert f"The switch to {release} failed:" in run.message and ROLLED_BACK in run.message, run.summary()
    assert run.report is not None and run.report["status"] == "failed"
    switch = run.phase("sglang_release", "pro6000")
    assert switch["status"] == "failed" and ROLLED_BACK in " ".join(switch["error"].split())
    assert switch["findings"]["release"] == release and switch["findings"]["rolled_back_to"] == "nextn-baseline"
    after = pivotlab.serving_state()
    assert after.current == pivotlab.BASELINE and after.active and after.algorithm == "EAGLE", after
    assert after.unit["MainPID"] != before.unit["MainPID"], "the baseline was restarted after the failed release"
    assert f"/etc/sglang/releases/{release}/sglang.service" in after.files, "the failed release stays on disk"
    # The failed run's lock stays, naming its ansible-playbook, which has exited: the next run takes it over.
    assert after.lock is not None and after.lock["run_id"] == run.run_id
    return after


def test_release_that_never_becomes_healthy_is_rolled_back(
    broken_drafter: str, no_training: pivotlab.Training, baseline: pivotlab.Serving
) -> None:
    run = pivotlab.run_playbook("pivot.yml", f"pivot_serving_drafter_model={broken_drafter}",
                                "pivot_ddtree_draft_tokens=8", f"pivot_serving_health_timeout={HEALTH_TIMEOUT_S}")

    assert_rolled_back(run, baseline, "ddtree-d8-b64-k8")
    failure = " ".join(run.phase("sglang_release")["findings"]["failure"].split())
    assert f"sglang.service did not become healthy within {HEALTH_TIMEOUT_S} s" in failure, failure
    assert "Its log ends:" in failure and "SafetensorError" in failure, failure  # the cause, from its log
    # The earlier phases ran (the preflight does not read weights), and nothing on the training side changed.
    assert run.phase_names()[-5:] == ["release_venv", "sglang_release_prepare", "stop_training", "gpu_release",
                                      "sglang_release"]
    pivotlab.assert_training_untouched(no_training, pivotlab.training_state())
