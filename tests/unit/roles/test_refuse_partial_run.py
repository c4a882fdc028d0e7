"""Pivot's playbooks run whole or not at all: --limit, --tags and --skip-tags are refused by the first task of the first
play (playbooks/tasks/refuse_partial_run.yml), before the run is named, a lock taken or a host contacted. Runs on this
machine, without the lab: the inventory is localhost alone, which the refusal never gets past."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_playbook_json

REPO = Path(__file__).resolve().parents[3]


def run(playbook: str, *args: str) -> tuple[int, list[dict]]:
    returncode, result = run_playbook_json("localhost,", f"playbooks/{playbook}", *args)
    ran = [{"task": task["task"]["name"], **res} for play in result["plays"] for task in play["tasks"]
           for res in task["hosts"].values()]
    return returncode, ran


@pytest.mark.parametrize(("playbook", "args", "given"), [
    ("pivot.yml", ["--tags", "preflight"], "--tags preflight"),
    ("pivot.yml", ["--skip-tags", "release_venv_prune"], "--skip-tags release_venv_prune"),
    ("rollback_nextn.yml", ["--tags", "sglang_release"], "--tags sglang_release"),
    ("resume_training.yml", ["--skip-tags", "resume_training_checkpoint"], "--skip-tags resume_training_checkpoint"),
])
def test_a_tag_filter_is_refused_before_anything_runs(playbook: str, args: list[str], given: str) -> None:
    rc, ran = run(playbook, *args)
    assert rc != 0
    assert [(task["task"], task.get("failed", False)) for task in ran if not task.get("skipped")] == [
        ("Refuse --tags and --skip-tags", True)], ran
    message = " ".join(ran[-1]["msg"].split())
    assert given + " not supported: every phase runs whole." in message


def test_a_limit_is_still_refused_first() -> None:
    rc, ran = run("pivot.yml", "--limit", "localhost")
    assert rc != 0
    assert [task["task"] for task in ran if not task.get("skipped")] == ["Refuse --limit"], ran
    assert "--limit is not supported (given: localhost)" in ran[0]["msg"]


@pytest.mark.parametrize("args", [[], ["--skip-tags", "molecule-notest,notest"]])
def test_a_whole_run_gets_past_the_refusals(args: list[str]) -> None:
    """Without a filter the refusals are skipped (ansible_run_tags is ('all',), a tuple), and so they are when the
    skipped tags are none of Pivot's (molecule skips molecule-notest and notest): the run goes on, here to the check
    that finds no training host in this inventory."""
    rc, ran = run("resume_training.yml", *args)
    assert rc != 0
    assert [(task["task"], bool(task.get("skipped"))) for task in ran][:2] == [
        ("Refuse --limit", True), ("Refuse --tags and --skip-tags", True)], ran
    assert "'training' names no training host in the inventory" in " ".join(ran[-1]["msg"].split())
