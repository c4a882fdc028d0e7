"""pivot.ops.run_phase on this machine, without the lab: phases of a stand-in role run on two local hosts, each recorded
in the report under its role's name, a failure on one host re-raised with the phase's name after the report, with
both hosts' phases, was written."""

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
        {"name": "Fail on one host", "ansible.builtin.fail": {"msg": "the stand-in failed"},
         "when": "inventory_hostname == 'twin'"},
    ],
}


def phase(**options: str) -> dict:
    return {"name": "Run a phase", "ansible.builtin.include_role": {"name": "pivot.ops.run_phase"},
            "vars": {"run_phase_role": "stand_in", "run_phase_run_id": "t1", "run_phase_report_dir": "{{ report_dir }}",
                     "run_phase_report_playbook": "phases", **options}}


PLAY = {
    "name": "Phases of a stand-in role",
    "hosts": "all",
    "connection": "local",
    "gather_facts": False,
    "tasks": [
        phase(),
        phase(run_phase_tasks_from="other"),
        phase(run_phase_name="named_by_hand"),
        {"name": "A phase that fails on twin", "block": [phase(run_phase_tasks_from="failing")],
         "rescue": [{"name": "Keep the message",
                     "ansible.builtin.copy": {"content": "{{ ansible_failed_result.msg }}", "mode": "0644",
                                              "dest": "{{ report_dir }}/failure-{{ inventory_hostname }}.txt"}}]},
    ],
}


def run_play(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The stand-in role and the play in root, run on localhost and twin (both local)."""
    for entry, tasks in ROLE_TASKS.items():
        path = root / "roles" / "stand_in" / "tasks" / f"{entry}.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(tasks, sort_keys=False))
    (root / "play.yml").write_text(yaml.safe_dump([PLAY], sort_keys=False))
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,twin,", str(root / "play.yml"),
         "-e", f"report_dir={root / 'reports'}", "-e", f"ansible_python_interpreter={REPO / '.venv/bin/python'}",
         *args],
        cwd=REPO, env={**os.environ, "ANSIBLE_NOCOLOR": "1"}, capture_output=True, text=True,
        timeout=PLAYBOOK_TIMEOUT_S, check=False,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("run_phase")
    proc = run_play(root)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    reports = root / "reports"
    return {"report": json.loads((reports / "phases-t1.json").read_text()),
            "markdown": (reports / "phases-t1.md").read_text(),
            "failures": {path.name: path.read_text() for path in reports.glob("failure-*.txt")}, "reports": reports}


def test_a_phase_is_named_after_its_role_and_entry_point(run: dict) -> None:
    for host in ("localhost", "twin"):
        phases = [p for p in run["report"]["phases"] if p["host"] == host]
        assert [p["phase"] for p in phases] == ["stand_in", "stand_in_other", "named_by_hand", "stand_in_failing"]
        assert [p["findings"]["entry"] for p in phases] == ["main", "other", "main", "failing"]
        assert all(float(p["seconds"]) >= 0 and p["started"].endswith("Z") for p in phases)
    assert "### stand_in_other (twin)" in run["markdown"]


def test_a_failure_on_one_host_is_recorded_with_the_other_hosts_phase(run: dict) -> None:
    last = {p["host"]: p for p in run["report"]["phases"] if p["phase"] == "stand_in_failing"}
    assert (last["localhost"]["status"], last["twin"]["status"]) == ("ok", "failed")
    assert "error" not in last["localhost"] and last["twin"]["error"] == "the stand-in failed"
    assert [p["status"] for p in run["report"]["phases"]].count("failed") == 1
    assert run["report"]["status"] == "failed"


def test_a_failure_names_the_phase_and_the_report_written_before_it(run: dict) -> None:
    assert list(run["failures"]) == ["failure-twin.txt"]
    assert " ".join(run["failures"]["failure-twin.txt"].split()) == (
        f"Phase 'stand_in_failing' failed on twin: the stand-in failed (report: {run['reports']}/phases-t1.md)")


def test_a_phase_under_a_tag_filter_is_refused_and_recorded_nowhere(tmp_path: Path) -> None:
    """--skip-tags would run the phase's role with a step left out, and the phase would be recorded as passed."""
    proc = run_play(tmp_path, "--skip-tags", "stand_in_step")
    assert proc.returncode != 0
    message = " ".join(proc.stdout.split())
    assert ("pivot.ops.run_phase runs no phase (stand_in) under --skip-tags stand_in_step: a "
            "phase whose steps a tag filter left out would be recorded as passed.") in message, proc.stdout[-3000:]
    assert not (tmp_path / "reports").exists()
