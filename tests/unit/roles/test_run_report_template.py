"""The run report's Markdown, rendered the way the template module renders it (Jinja2, trim_blocks), from the view the
run_report role builds (its outcome from pivot.ops.run_outcome)."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from ansible_collections.pivot.ops.plugins.filter.run_outcome import run_outcome

TEMPLATE = Path(__file__).resolve().parents[3] / "roles" / "run_report" / "templates" / "report.md.j2"


def report_view(phases: list[dict], playbook: str = "pivot", finished: bool = True,
                served: dict | None = None) -> dict:
    """run_report_data as roles/run_report builds it."""
    return {"playbook": playbook, "run_id": "r1", "check_mode": False, "written": "2026-12-01T00:00:00Z",
            "report": f"/a/{playbook}-r1.md", "phases": phases, "finished": finished, "served": served or {},
            **run_outcome(phases, finished=finished, served=served or {})}


def render(phases: list[dict], playbook: str = "pivot", finished: bool = True, served: dict | None = None) -> str:
    environment = jinja2.Environment(trim_blocks=True, undefined=jinja2.ChainableUndefined)
    environment.filters["to_json"] = json.dumps
    view = report_view(phases, playbook, finished, served)
    return environment.from_string(TEMPLATE.read_text()).render(run_report_view=view)


def result_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("**Result: "))


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


def test_a_forced_stop_is_in_the_result_line_not_a_plain_ok() -> None:
    lost = {"reason": "r", "last_checkpoint": "/root/train/checkpoints/step_4000", "last_checkpoint_step": 4000,
            "last_logged_step": 5381, "steps_lost": 1381}
    switched = {"phase": "sglang_release", "host": "pro6000", "status": "ok", "seconds": 90.0, "started": 2,
                "findings": {"release": "ddtree-d16-b64-k8", "switched": True}}
    line = result_line(render([stop_phase({"work_lost": lost}), switched]))
    assert line.startswith("**Result: OK: switched to ddtree-d16-b64-k8; 1381 steps of training lost by a forced stop "
                           "on ct200: resume from /root/train/checkpoints/step_4000 (step 4000); the log had reached "
                           "step 5381** (written ")
    checkpointed = result_line(render([stop_phase({"work_lost": None}), switched]))
    assert checkpointed.startswith("**Result: OK: switched to ddtree-d16-b64-k8** (written")
    assert "lost" not in checkpointed


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


def test_the_result_line_of_a_run_that_left_the_server_down_names_the_command_with_its_inventory() -> None:
    command = "ansible-playbook -i /srv/pivot/inventory/production playbooks/rollback_nextn.yml"
    down = render([switch_phase({"release": "ddtree-16", "failure": "x", "rollback_to": "nextn-baseline",
                                 "rollback_failure": "y", "server_down": True, "rollback_command": command})])
    assert result_line(down).startswith(
        "**Result: FAILED: ddtree-16 failed and the rollback to nextn-baseline failed too: the server on pro6000 is "
        f"DOWN (fix the cause, then run {command})**")
    rolled_back = render([switch_phase({"release": "ddtree-16", "failure": "x", "rolled_back_to": "nextn-baseline"})])
    assert result_line(rolled_back).startswith(
        "**Result: FAILED: ddtree-16 failed; rolled back to nextn-baseline, which serves again**")


def test_the_training_gpus_show_what_the_job_held_before_the_stop_and_after_the_release() -> None:
    preflight = [
        {"phase": "preflight", "host": "ct200", "status": "ok", "seconds": 1.0, "started": 0,
         "findings": {"side": "training", "checks": [], "gpu_used_mib": [61449, 61449]}},
        {"phase": "preflight", "host": "pro6000", "status": "ok", "seconds": 1.0, "started": 0,
         "findings": {"side": "serving", "checks": [], "gpu_used_mib": [90000, 90000]}},
    ]
    released = {"phase": "gpu_release", "host": "ct200", "status": "ok", "seconds": 3.0, "started": 2,
                "findings": {"used_mib_before": [4096, 0], "used_mib_after": [0, 0], "released": True}}
    text = render([*preflight, stop_phase({"work_lost": None}), released])
    row = "| training GPUs, MiB used: at preflight -> when the stop ended -> released |"
    assert f"{row} 61449 61449 -> 4096 0 -> 0 0 |" in text
    # check mode: nothing was stopped, so nothing was waited for
    unread = render([stop_phase({"work_lost": None}), {**released, "findings": {"used_mib_before": [0, 0]}}])
    assert f"{row} - -> 0 0 -> - |" in unread


def test_a_report_written_during_the_run_says_so_and_never_ok() -> None:
    text = render([stop_phase({})], finished=False)
    line = result_line(text)
    assert line.startswith("**Result: RUNNING: this run has not finished") and "OK" not in line.split("**")[1]
    assert "while the run was going on" in line


def test_the_closing_check_of_the_serving_host_is_a_table() -> None:
    served = {"pro6000": {"reachable": True, "active_state": "active", "release": "ddtree-d16-b64-k8",
                          "healthy": True, "algorithm": "DDTREE"},
              "pro6001": {"reachable": False, "error": "ssh: connect to host 10.0.0.2 port 22: timed out"}}
    switch = {"phase": "sglang_release", "host": "pro6000", "status": "ok", "seconds": 1, "started": 2,
              "findings": {"release": "ddtree-d16-b64-k8", "switched": True}}
    text = render([switch], served=served)
    assert "| pro6000 | active | ddtree-d16-b64-k8 | DDTREE, healthy |" in text
    assert "| pro6001 | **not reached**: ssh: connect to host 10.0.0.2 port 22: timed out | - | - |" in text
    assert result_line(text).startswith("**Result: INCOMPLETE: switched to ddtree-d16-b64-k8; what pro6001 serves "
                                        "could not be checked")


def test_a_rerun_whose_stop_found_no_job_has_no_empty_step() -> None:
    """A re-run after the stop: no process, no new checkpoint, so no step either."""
    text = render([stop_phase({"result": "No process of the job is running", "checkpoint_path": None,
                               "checkpoint_step": ""})])
    assert "(step )" not in text and "| checkpoint | - (step -) |" in text


def test_every_table_of_a_full_report_renders_as_a_table() -> None:
    """The Markdown renders with a CommonMark renderer (markdown-it-py, GFM tables): each block of `|` lines is one
    table, and every row has as many cells as its header (a row with more would lose its last cells unseen)."""
    from markdown_it import MarkdownIt  # noqa: PLC0415 - only this test renders

    checks = [{"name": "gpu_count", "ok": True, "detail": "8 GPUs | all visible"},
              {"name": "free_disk", "ok": False, "detail": "3 GiB free"}]
    phases = [
        {"phase": "preflight", "host": "ct200", "status": "ok", "seconds": 1.0, "started": 0,
         "findings": {"side": "training", "checks": checks, "gpu_used_mib": [61449]}},
        {"phase": "preflight", "host": "pro6000", "status": "ok", "seconds": 1.0, "started": 0,
         "findings": {"side": "serving", "checks": checks}},
        stop_phase({"work_lost": None, "checkpoint_path": "/c/step_9", "checkpoint_step": 9}),
        {"phase": "gpu_release", "host": "ct200", "status": "ok", "seconds": 3.0, "started": 2,
         "findings": {"used_mib_before": [4096], "used_mib_after": [0]}},
        {"phase": "sglang_release", "host": "pro6000", "status": "ok", "seconds": 90.0, "started": 3,
         "findings": {"release": "ddtree-d16-b64-k8", "switched": True, "algorithm": "DDTREE", "accept_length": 4.2,
                      "quality": {"mean": 0.97, "identical": 3, "per_prompt": [1, 1, 1, 0.88]}}},
    ]
    served = {"pro6000": {"reachable": True, "active_state": "active", "release": "ddtree-d16-b64-k8", "healthy": True,
                          "algorithm": "DDTREE"}}
    text = render(phases, served=served)
    blocks: list[list[str]] = []
    for line, previous in zip(text.splitlines(), ["", *text.splitlines()], strict=False):
        if line.startswith("|"):
            if previous.startswith("|"):
                blocks[-1].append(line)
            else:
                blocks.append([line])
    tables = sum(1 for token in MarkdownIt("commonmark").enable("table").parse(text) if token.type == "table_open")
    assert tables == len(blocks) == 5, (tables, len(blocks))  # served, summary, phases, two preflight check tables
    for block in blocks:
        cells = {line.replace("\\|", "").count("|") for line in block}
        assert len(cells) == 1, block
