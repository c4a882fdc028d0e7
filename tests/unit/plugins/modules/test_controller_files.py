# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""pivot.ops.controller_files: files and links written on the controller by a real ansible-playbook (the action
plugin, for a host whose connection is never used), and its refusals."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from ansible_collections.pivot.ops.plugins.modules import controller_files
from conftest import run_playbook_json

PLAYBOOK_TIMEOUT_S = 120


def write_task(directory: Path, files: dict[str, str], links: dict[str, str] | None = None, **extra: Any) -> dict:
    arguments = {"path": str(directory), "files": [{"name": name, "content": text} for name, text in files.items()],
                 "links": [{"name": name, "target": target} for name, target in (links or {}).items()], **extra}
    return {"name": "Write", "pivot.ops.controller_files": arguments}


def play(tmp_path: Path, tasks: list[dict], *args: str) -> list[dict]:
    """Each task's result, for a host whose connection would be refused (a closed port on loopback): the action must
    not use it."""
    (tmp_path / "play.yml").write_text(yaml.safe_dump(
        [{"hosts": "elsewhere", "gather_facts": False, "tasks": tasks}], sort_keys=False))
    unreachable = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9,
                   "ansible_ssh_timeout": 2}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"elsewhere": unreachable}}}))
    _rc, result = run_playbook_json(str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"), *args,
                                    timeout=PLAYBOOK_TIMEOUT_S)
    return [task["hosts"]["elsewhere"] for play in result["plays"] for task in play["tasks"]]


def test_files_and_links_are_written_on_the_controller_in_one_step_and_a_rerun_changes_nothing(tmp_path: Path) -> None:
    reports = tmp_path / "artifacts" / "reports"
    files = {"pivot-r1.json": '{"status": "ok"}\n', "pivot-r1.md": "# Pivot run r1\n\nü\n"}
    links = {"pivot-latest.json": "pivot-r1.json", "pivot-latest.md": "pivot-r1.md"}
    first, second = play(tmp_path, [write_task(reports, files, links), write_task(reports, files, links)])
    assert first["changed"] is True and not first.get("failed")
    assert sorted(first["written"]) == [str(reports / name) for name in sorted(files)]
    assert sorted(first["linked"]) == [str(reports / name) for name in sorted(links)]
    for name, text in files.items():
        assert (reports / name).read_text(encoding="utf-8") == text
        assert (reports / name).stat().st_mode & 0o777 == 0o644
    for name, target in links.items():
        assert os.readlink(reports / name) == target
    assert reports.stat().st_mode & 0o777 == 0o755
    assert (second["changed"], second["written"], second["linked"]) == (False, [], [])
    assert sorted(path.name for path in reports.iterdir()) == sorted([*files, *links]), "no temporary file left"


def test_a_new_content_replaces_the_file_and_a_link_is_pointed_at_the_new_run(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "pivot-r1.md").write_text("old\n")
    os.symlink("pivot-r0.md", reports / "pivot-latest.md")
    inode = (reports / "pivot-r1.md").stat().st_ino
    [result] = play(tmp_path, [write_task(reports, {"pivot-r1.md": "new\n"}, {"pivot-latest.md": "pivot-r1.md"},
                                          mode="0600")])
    assert result["changed"] is True
    assert (reports / "pivot-r1.md").read_text() == "new\n"
    assert (reports / "pivot-r1.md").stat().st_ino != inode, "written beside and renamed over, never in place"
    assert (reports / "pivot-r1.md").stat().st_mode & 0o777 == 0o600
    assert os.readlink(reports / "pivot-latest.md") == "pivot-r1.md"


def test_check_mode_says_what_it_would_write_and_writes_nothing(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    [result] = play(tmp_path, [write_task(reports, {"a.json": "{}\n"}, {"latest.json": "a.json"})], "--check")
    assert result["changed"] is True
    assert (result["written"], result["linked"]) == ([str(reports / "a.json")], [str(reports / "latest.json")])
    assert not reports.exists()


def test_a_name_that_is_not_a_plain_file_name_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    bad_name, bad_target, bad_mode = play(tmp_path, [
        {**write_task(reports, {"ok.md": "x", "../escape.md": "x"}), "ignore_errors": True},
        {**write_task(reports, {"ok.md": "x"}, {"latest.md": "/etc/passwd"}), "ignore_errors": True},
        {**write_task(reports, {"ok.md": "x"}, mode="rw-r--r--"), "ignore_errors": True},
    ])
    assert bad_name["failed"] is True
    assert "file name '../escape.md' is not a plain file name" in bad_name["msg"]
    assert "link target '/etc/passwd' is not a plain file name" in bad_target["msg"]
    assert "mode 'rw-r--r--' is not an octal mode such as '0644'" in bad_mode["msg"]
    assert not reports.exists()


def test_a_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    taken = tmp_path / "reports"
    taken.write_text("not a directory")
    [result] = play(tmp_path, [{**write_task(taken, {"a.md": "x"}), "ignore_errors": True}])
    assert result["failed"] is True
    assert f"{taken} exists and is not a directory" in result["msg"]


def test_the_module_alone_says_it_needs_its_action_plugin(run_module) -> None:
    result = run_module(controller_files.main, {"path": "/tmp/reports", "files": [{"name": "a", "content": "b"}]})
    assert result["failed"] is True
    assert "is an action that writes on the controller" in result["msg"]
