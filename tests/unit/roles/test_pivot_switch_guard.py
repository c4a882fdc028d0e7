"""The first task of pivot.yml's phase 6, run as written (read from the playbook) on localhost against an inventory
whose training hosts carry the phase records a run would have left: the server is switched only after phases 4-5
recorded an end on every training host. (Ansible goes on to phase 6 after a training host was lost in a task that
fails the play: any_errors_fatal counts the lost host as failed, not only unreachable.)"""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import run_playbook_json

REPO = Path(__file__).resolve().parents[3]
GUARD = "Switch only after every training host stopped its job and proved its GPUs free"


def guard_task() -> dict:
    for play in yaml.safe_load((REPO / "playbooks" / "pivot.yml").read_text()):
        for task in play.get("tasks", []):
            if task.get("name") == GUARD:
                return task
    raise AssertionError(f"playbooks/pivot.yml has no task {GUARD!r}")


def record(host: str, phase: str, status: str) -> dict:
    return {"phase": phase, "host": host, "status": status}


def run_guard(tmp_path: Path, records: dict[str, list[dict]]) -> tuple[int, dict]:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {"localhost": {"ansible_connection": "local"}},
        "children": {"training": {"hosts": {host: {"ansible_connection": "local", "run_phase_records": host_records}
                                            for host, host_records in records.items()}}}}}))
    playbook = tmp_path / "guard.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Phase 6's guard", "hosts": "localhost", "gather_facts": False,
                                         "tasks": [guard_task()]}], sort_keys=False))
    return run_playbook_json(str(inventory), str(playbook))


def guard_message(result: dict) -> str:
    [task] = [t for play in result["plays"] for t in play["tasks"] if t["task"]["name"] == GUARD]
    return task["hosts"]["localhost"].get("msg", "")


def test_the_switch_goes_on_when_every_training_host_proved_its_gpus_free(tmp_path: Path) -> None:
    rc, result = run_guard(tmp_path, {
        "ct200": [record("ct200", "stop_training", "ok"), record("ct200", "gpu_release", "ok")],
        "ct201": [record("ct201", "stop_training", "checked"), record("ct201", "gpu_release", "checked")],
    })
    assert rc == 0, guard_message(result)


def test_the_switch_is_refused_naming_each_training_host_whose_phases_did_not_end(tmp_path: Path) -> None:
    rc, result = run_guard(tmp_path, {
        "ct200": [record("ct200", "stop_training", "ok"), record("ct200", "gpu_release", "ok")],
        "ct201": [record("ct201", "stop_training", "ok")],  # lost during phase 5: no record of it
        "ct202": [record("ct202", "stop_training", "ok"), record("ct202", "gpu_release", "failed")],
        "ct203": [],  # lost before its stop recorded anything
    })
    assert rc != 0
    message = guard_message(result)
    assert message.startswith("Phases 4-5 did not end on ct201, ct202, ct203 (the host was lost"), message
    assert "the server is not switched and serves on as it did" in message
