"""How a run's end reads, on this machine without the lab: phases of a stand-in role recorded by pivot.ops.run_phase
under the names pivot.yml's phases have (a forced stop on ct200, then a switch on pro6000), and pivot.yml's closing task
(playbooks/tasks/say_outcome.yml). A forced stop is in the report's result, in the closing message of a run that
switched, and in the failure message of a run that did not; a failed rollback names the command that brings the
baseline back with the inventory the run used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_playbook_json

REPO = Path(__file__).resolve().parents[3]
WORK_LOST = {"reason": "No new complete checkpoint matching /data/ckpt/step_* appeared within 900s.",
             "last_checkpoint": "/data/ckpt/step_000004000", "last_checkpoint_step": 4000, "last_logged_step": 5381,
             "steps_lost": 1381}
LOST_SENTENCE = ("1381 steps of training lost by a forced stop on ct200: resume from /data/ckpt/step_000004000 "
                 "(step 4000); the log had reached step 5381")

ROLE_TASKS = {
    "stop": [{"name": "Stop by force", "ansible.builtin.set_fact": {
        "stand_in_findings": {"result": "FORCED STOP WITHOUT A NEW CHECKPOINT ...", "work_lost": WORK_LOST}}}],
    "switch": [
        {"name": "Switch", "ansible.builtin.set_fact": {"stand_in_findings": "{{ switch_findings }}"}},
        {"name": "Fail the switch when asked", "ansible.builtin.fail": {"msg": "The switch to ddtree-x failed: y"},
         "when": "fail_switch | default(false) | bool"},
    ],
}


def phase(name: str, tasks_from: str) -> dict:
    return {"name": f"Run {name}", "ansible.builtin.include_role": {"name": "pivot.ops.run_phase"},
            "vars": {"run_phase_role": "stand_in", "run_phase_tasks_from": tasks_from, "run_phase_name": name,
                     "run_phase_run_id": "t1", "run_phase_report_dir": "{{ report_dir }}",
                     "run_phase_report_playbook": "pivot"}}


def plays() -> list[dict]:
    local = {"gather_facts": False}
    return [
        {"name": "Stop", "hosts": "ct200", **local, "tasks": [phase("stop_training", "stop")]},
        {"name": "Switch", "hosts": "pro6000", **local, "tasks": [phase("sglang_release", "switch")]},
        {"name": "Say how the run ended", "hosts": "localhost", "connection": "local", **local,
         "vars": {"pivot_outcome_playbook": "pivot", "pivot_outcome_serving_hosts": [],
                  "pivot_outcome_switch_hosts": [], "pivot_run_id": "t1", "pivot_report_dir": "{{ report_dir }}"},
         "tasks": [{"name": "Say how the run ended",
                    "ansible.builtin.import_tasks": str(REPO / "playbooks" / "tasks" / "say_outcome.yml")}]},
        {"name": "The command that brings the baseline back", "hosts": "pro6000", **local,
         "vars_files": [str(REPO / "roles" / "sglang_release" / "vars" / "main.yml")],
         "tasks": [{"name": "Say the rollback command",
                    "ansible.builtin.debug": {"msg": "{{ __sglang_release_rollback_command }}"}}]},
    ]


def run(root: Path, *args: str) -> dict[str, Any]:
    for entry, tasks in ROLE_TASKS.items():
        path = root / "roles" / "stand_in" / "tasks" / f"{entry}.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(tasks, sort_keys=False))
    (root / "play.yml").write_text(yaml.safe_dump(plays(), sort_keys=False))
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(REPO / ".venv" / "bin" / "python")}
    inventory = {"all": {"hosts": {"ct200": local, "pro6000": local}}}
    (root / "hosts.yml").write_text(yaml.safe_dump(inventory))
    returncode, result = run_playbook_json(str(root / "hosts.yml"), str(root / "play.yml"),
                                           "-e", f"report_dir={root / 'reports'}", *args)
    messages = {(task["task"]["name"], host): outcome.get("msg")
                for play in result["plays"] for task in play["tasks"] for host, outcome in task["hosts"].items()}
    report = root / "reports" / "pivot-t1.json"
    return {"rc": returncode, "messages": messages,
            "report": json.loads(report.read_text()) if report.exists() else None,
            "markdown": (root / "reports" / "pivot-t1.md").read_text() if report.exists() else ""}


@pytest.fixture(scope="module")
def switched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("switched")
    outcome = run(root, "-e", json.dumps({"switch_findings": {"release": "ddtree-x", "switched": True}}))
    assert outcome["rc"] == 0, outcome["messages"]
    return outcome | {"root": root}


def test_a_forced_stop_is_in_the_reports_result_not_a_plain_ok(switched: dict[str, Any]) -> None:
    report = switched["report"]
    assert report["status"] == "ok" and report["finished"] and report["schema_version"] == 2
    assert report["result"] == f"OK: switched to ddtree-x; {LOST_SENTENCE}"
    assert report["work_lost"] == LOST_SENTENCE
    assert f"**Result: OK: switched to ddtree-x; {LOST_SENTENCE}**" in switched["markdown"]


def test_the_closing_message_says_the_result_and_where_the_report_is(switched: dict[str, Any]) -> None:
    said = switched["messages"][("Say how the run ended", "localhost")]
    assert said == f"OK: switched to ddtree-x; {LOST_SENTENCE} (report: {switched['root']}/reports/pivot-t1.md)"


def test_the_rollback_command_carries_the_inventory_the_run_used(switched: dict[str, Any]) -> None:
    said = switched["messages"][("Say the rollback command", "pro6000")]
    assert said == f"ansible-playbook -i {switched['root']}/hosts.yml playbooks/rollback_nextn.yml"


def test_the_rollback_command_carries_the_serving_host_pattern_when_one_was_given(tmp_path: Path) -> None:
    outcome = run(tmp_path, "-e", json.dumps({"switch_findings": {"release": "ddtree-x", "switched": True}}),
                  "-e", "pivot_serving_hosts=pro6000")
    said = outcome["messages"][("Say the rollback command", "pro6000")]
    assert said == (f"ansible-playbook -i {tmp_path}/hosts.yml -e pivot_serving_hosts=pro6000 "
                    "playbooks/rollback_nextn.yml")


def test_a_run_that_fails_after_a_forced_stop_ends_saying_what_the_stop_lost(tmp_path: Path) -> None:
    findings = {"release": "ddtree-x", "failure": "y", "rolled_back_to": "nextn-baseline"}
    outcome = run(tmp_path, "-e", json.dumps({"switch_findings": findings, "fail_switch": True}))
    assert outcome["rc"] != 0
    failure = " ".join(outcome["messages"][("pivot.ops.run_phase : Fail with the phase's message", "pro6000")].split())
    assert failure.startswith("Phase 'sglang_release' failed on pro6000: The switch to ddtree-x failed: y")
    assert failure.endswith(f"(report: {tmp_path}/reports/pivot-t1.md) Earlier in this run, {LOST_SENTENCE}.")
    assert outcome["report"]["result"] == (f"FAILED: ddtree-x failed; rolled back to nextn-baseline, which serves "
                                           f"again; {LOST_SENTENCE}")
    assert ("Say how the run ended", "localhost") not in outcome["messages"], "a failed run ends with its failure"
