"""The run report's Markdown, rendered the way the template module renders it (Jinja2, trim_blocks)."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

TEMPLATE = Path(__file__).resolve().parents[3] / "roles" / "run_report" / "templates" / "report.md.j2"


def render(phases: list[dict]) -> str:
    environment = jinja2.Environment(trim_blocks=True, undefined=jinja2.ChainableUndefined)
    environment.filters["to_json"] = json.dumps
    view = {"playbook": "pivot", "run_id": "r1", "check_mode": False, "written": "2026-12-01T00:00:00Z",
            "status": "ok", "phases": phases}
    return environment.from_string(TEMPLATE.read_text()).render(run_report_view=view)


def stop_phase(findings: dict) -> dict:
    return {"phase": "stop_training", "host": "ct200", "status": "ok", "seconds": 4.2, "started": 1,
            "findings": {"result": "Stopped 3 process(es).", "processes": 3, **findings}}


def test_a_forced_stop_heads_the_report_with_the_checkpoint_to_resume_from_and_the_steps_lost() -> None:
    lost = {"reason": "No new complete checkpoint matching /root/train/checkpoints/step_* appeared within 900s.",
            "last_checkpoint": "/root/train/checkpoints/step_4000", "last_checkpoint_step": 4000,
            "last_logged_step": 5381, "steps_lost": 1381}
    text = render([stop_phase({"work_lost": lost})])
    warning, summary = text.split("## Summary", 1)
    assert "**Training on ct200 was stopped WITHOUT a new checkpoint (force=true).**" in warning
    assert "/root/train/checkpoints/step_4000 (step 4000)" in warning
    assert "the log had reached step 5381: 1381 steps of training are lost." in warning
    assert "Why: No new complete checkpoint" in warning
    assert "| training job | Stopped 3 process(es). |" in summary


@pytest.mark.parametrize("lost", [
    {"reason": "r", "last_checkpoint": None, "last_checkpoint_step": None, "last_logged_step": None,
     "steps_lost": None},
    {"reason": "r", "last_checkpoint": "/c/step_0", "last_checkpoint_step": 0, "last_logged_step": 12,
     "steps_lost": 12},
])
def test_unknown_figures_are_said_to_be_unknown_and_step_zero_is_a_step(lost: dict) -> None:
    warning = render([stop_phase({"work_lost": lost})]).split("## Summary", 1)[0]
    if lost["last_checkpoint"] is None:
        assert "no checkpoint at all (step -)" in warning and "reached step -." in warning
    else:
        assert "/c/step_0 (step 0)" in warning and "12 steps of training are lost" in warning


def test_a_checkpointed_stop_carries_no_warning() -> None:
    text = render([stop_phase({"work_lost": None, "checkpoint_path": "/c/step_5400", "checkpoint_step": 5400})])
    assert "WITHOUT a new checkpoint" not in text
    assert "| checkpoint | /c/step_5400 (step 5400) |" in text


def switch_phase(findings: dict) -> dict:
    return {"phase": "sglang_release", "host": "pro6000", "status": "failed", "seconds": 80.0, "started": 2,
            "error": "The switch failed.", "findings": findings}


def release_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| release |"))


def test_the_report_tells_a_rollback_that_worked_from_one_that_left_the_server_down() -> None:
    rolled_back = render([switch_phase({"release": "ddtree-16", "failure": "x", "rolled_back_to": "nextn-baseline"})])
    assert release_line(rolled_back) == "| release | ddtree-16 FAILED, rolled back to nextn-baseline |"
    down = render([switch_phase({"release": "ddtree-16", "failure": "x", "rollback_to": "nextn-baseline",
                                 "rollback_failure": "y", "server_down": True})])
    assert release_line(down) == (
        "| release | ddtree-16 FAILED, and the rollback to nextn-baseline FAILED: **the server is DOWN** |")
    assert "rolled back to" not in down
