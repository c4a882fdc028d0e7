"""The run report's summary of a resume_training phase (resume_training.yml, or rollback_nextn.yml with
resume_training_after_rollback=true)."""

from __future__ import annotations

from test_run_report_template import render as render_report


def render(phases: list[dict], playbook: str = "resume_training") -> str:
    return render_report(phases, playbook)


def resume_phase(**findings: object) -> dict:
    base = {"result": "Started the training job from checkpoint /c/step_000005400 (step 5400): PID 42: 9 processes, "
                      "step 5403 logged, GPUs in use 8 of 8.",
            "checkpoint": "/c/step_000005400", "checkpoint_step": 5400,
            "resumed_from": "confirmed by the stop of run r0 at 2026-12-01T09:00:00Z", "first_step": 5401,
            "last_step": 5403}
    return {"phase": "resume_training", "host": "ct200", "status": "ok", "seconds": 30.1, "started": 1,
            "findings": {**base, **findings}}


def test_the_summary_names_the_resume_its_checkpoint_and_the_steps_logged() -> None:
    summary = render([resume_phase()]).split("## Summary", 1)[1].split("## Phases", 1)[0]
    assert "| training resumed | Started the training job from checkpoint /c/step_000005400 (step 5400)" in summary
    assert ("| resumed from | /c/step_000005400 (step 5400), confirmed by the stop of run r0 at "
            "2026-12-01T09:00:00Z |") in summary
    assert "| first / last step logged since the start | 5401 / 5403 |" in summary


def test_a_resume_that_logged_nothing_says_so_and_a_run_without_one_has_no_rows() -> None:
    summary = render([resume_phase(first_step=None, last_step=None, checkpoint_step=None)])
    assert "| first / last step logged since the start | - / - |" in summary
    assert "(step -)" in summary
    rollback = {"phase": "sglang_release_rollback", "host": "pro6000", "status": "ok", "seconds": 1, "started": 1,
                "findings": {"release": "nextn-baseline", "switched": True}}
    rolled_back = render([rollback], playbook="rollback_nextn")
    assert "training resumed" not in rolled_back
    assert "| release | nextn-baseline (switched to it now) |" in rolled_back, "the rollback phase fills the release"


def test_a_resumed_job_started_otherwise_than_the_stopped_one_is_a_summary_row() -> None:
    said = ("The resumed job does not run the way the stopped one had been started: the stop recorded python3 t.py "
            "--gpus 0,1, the resumed job runs python3 t.py --gpus 0 --resume /c/step_000005400 (...)")
    summary = render([resume_phase(command_difference=said)]).split("## Summary", 1)[1].split("## Phases", 1)[0]
    assert f"| command line vs the stopped job's | **differs**: {said} |" in summary
    piped = render([resume_phase(command_difference="a | b")])
    assert "| command line vs the stopped job's | **differs**: a / b |" in piped, "a | would break the table"
    same = render([resume_phase(command_difference=None)])
    assert "command line vs the stopped job's" not in same
