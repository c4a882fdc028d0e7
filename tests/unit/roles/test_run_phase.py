"""pivot.ops.run_phase on this machine, without the lab: phases of a stand-in role run on localhost, each recorded in
the report under its role's name, a failure re-raised with the phase's name and written to the report first."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK_TIMEOUT_S = 300

# A phase role: it publishes <role name>_findings, as every phase role does.
ROLE_TASKS = {
    "main": [{"name": "Find something", "ansible.builtin.set_fact": {"stand_in_findings": {"entry": "main"}}}],
    "other": [{"name": "Find something else", "ansible.builtin.set_fact": {"stand_in_findings": {"entry": "other"}}}],
    "failing": [
        {"name": "Find what went wrong", "ansible.builtin.set_fact": {"stand_in_findings": {"entry": "failing"}}},
        {"name": "Fail", "ansible.builtin.fail": {"msg": "the stand-in failed"}},
    ],
}


def phase(**options: str) -> dict:
    return {"name": "Run a phase", "ansible.builtin.include_role": {"name": "pivot.ops.run_phase"},
            "vars": {"run_phase_role": "stand_in", "run_phase_run_id": "t1", "run_phase_report_dir": "{{ report_dir }}",
                     "run_phase_report_playbook": "phases", **options}}


PLAY = {
    "name": "Phases of a stand-in role",
    "hosts": "localhost",
    "connection": "local",
    "gather_facts": False,
    "tasks": [
        phase(),
        phase(run_phase_tasks_from="other"),
        phase(run_phase_name="named_by_hand"),
        {"name": "A failing phase", "block": [phase(run_phase_tasks_from="failing")],
         "rescue": [{"name": "Keep the message", "ansible.builtin.copy": {
             "content": "{{ ansible_failed_result.msg }}", "dest": "{{ report_dir }}/failure.txt", "mode": "0644"}}]},
    ],
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("run_phase")
    for entry, tasks in ROLE_TASKS.items():
        path = root / "roles" / "stand_in" / "tasks" / f"{entry}.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(tasks, sort_keys=False))
    (root / "play.yml").write_text(yaml.safe_dump([PLAY], sort_keys=False))
    reports = root / "reports"
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", str(root / "play.yml"),
         "-e", f"report_dir={reports}", "-e", f"ansible_python_interpreter={REPO / '.venv' / 'bin' / 'python'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT_S, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return {"report": json.loads((reports / "phases-t1.json").read_text()),
            "markdown": (reports / "phases-t1.md").read_text(),
            "failure": (reports / "failure.txt").read_text(), "reports": reports}


def test_a_phase_is_named_after_its_role_and_entry_point(run: dict) -> None:
    phases = run["report"]["phases"]
    assert [p["phase"] for p in phases] == ["stand_in", "stand_in_other", "named_by_hand", "stand_in_failing"]
    assert [p["status"] for p in phases] == ["ok", "ok", "ok", "failed"]
    assert [p["findings"]["entry"] for p in phases] == ["main", "other", "main", "failing"]
    assert {p["host"] for p in phases} == {"localhost"}
    assert all(float(p["seconds"]) >= 0 and p["started"].endswith("Z") for p in phases)
    assert "error" not in phases[0] and phases[3]["error"] == "the stand-in failed"
    assert run["report"]["status"] == "failed"
    assert "### stand_in_other (localhost)" in run["markdown"]


def test_a_failure_names_the_phase_and_the_report_written_before_it(run: dict) -> None:
    assert " ".join(run["failure"].split()) == (
        f"Phase 'stand_in_failing' failed on localhost: the stand-in failed (report: {run['reports']}/phases-t1.md)")
