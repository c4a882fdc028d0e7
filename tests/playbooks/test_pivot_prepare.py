"""Phase 3 (sglang_release_prepare) refuses a NEXTN baseline that could not come back, before anything stops: the
baseline's unit file (the recorded copy, or before the first pivot the user's own unit) must pass `systemd-analyze
verify`. The training keeps running, the baseline keeps serving, and a unit refused before it was recorded is not
recorded. (The refusal of a baseline whose SGLang would load DDTree code is in the sglang_release molecule scenario,
and against real SGLang 0.5.23 in tests/contract/test_baseline_validation.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import labctl
import pivotlab
import pytest

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

RECORDED_UNIT = "/etc/sglang/releases/nextn-baseline/sglang.service"
USER_UNIT = "/etc/systemd/system/sglang.service"
KEPT = "/root/baseline-unit.kept"


@pytest.fixture
def baseline_unit_with_an_unknown_key(baseline: pivotlab.Serving) -> Iterator[str]:
    """The baseline's unit file with a key systemd does not know (RestartSecs=); put back afterwards as it was,
    content and mtime (systemd would otherwise want a daemon-reload for the user's unit)."""
    path = RECORDED_UNIT if baseline.current == pivotlab.BASELINE else USER_UNIT
    made = labctl.ssh("pro6000", f"cp -p {path} {KEPT} && sed -i 's/^Restart=.*/&\\nRestartSecs=10/' {path}")
    assert made.rc == 0, made.stderr
    try:
        yield path
    finally:
        restored = labctl.ssh("pro6000", f"cp -p {KEPT} {path} && rm {KEPT}")
        assert restored.rc == 0, restored.stderr


def test_a_baseline_unit_systemd_analyze_finds_fault_with_stops_the_pivot_before_the_training(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving, baseline_unit_with_an_unknown_key: str
) -> None:
    unit = baseline_unit_with_an_unknown_key
    job = training()

    run = pivotlab.run_playbook("pivot.yml")

    assert run.rc != 0, run.summary()
    assert "Phase 'sglang_release_prepare' failed on pro6000" in run.message, run.summary()
    assert "the baseline release nextn-baseline (" in run.message
    assert f"`systemd-analyze verify {unit}` says:" in run.message and "RestartSecs" in run.message, run.message
    assert "Nothing was stopped." in run.message
    assert run.phase_names()[-1] == "sglang_release_prepare", "nothing after the refusal may run"
    pivotlab.assert_training_untouched(job, pivotlab.training_state())
    serving = pivotlab.serving_state()
    assert (serving.current, serving.unit, serving.server) == (baseline.current, baseline.unit, baseline.server)
    if unit == USER_UNIT:
        assert RECORDED_UNIT not in serving.files, "a unit refused before it was recorded is not recorded"
