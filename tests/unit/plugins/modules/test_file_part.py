"""pivot.ops.file_part: a file copied one part at a time by a real ansible-playbook (local connection, action plugin
and module), and the module's own refusals."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.pivot.ops.plugins.filter.file_parts import file_parts
from ansible_collections.pivot.ops.plugins.modules import file_part
from conftest import run_playbook_json

REPO = Path(__file__).resolve().parents[4]
PART_BYTES = 1000
PLAYBOOK_TIMEOUT_S = 120


def copy_task(src: Path, dest: Path, parts: list[int] | None = None, **extra: Any) -> dict:
    """A loop over the parts of ``src`` as the filter lists them; ``parts`` picks some by index instead."""
    size = src.stat().st_size
    loop: Any = f"{{{{ [{{'name': 'f', 'bytes': {size}}}] | pivot.ops.file_parts({PART_BYTES}) }}}}"
    if parts is not None:
        every = file_parts([{"name": "f", "bytes": size}], PART_BYTES)
        loop = [every[index] for index in parts]
    arguments = {"src": str(src), "dest": str(dest), "offset": "{{ item.offset }}", "size": "{{ item.size }}", **extra}
    return {"name": "Copy", "pivot.ops.file_part": arguments, "loop": loop}


def play(tmp_path: Path, tasks: list[dict], *args: str) -> list[dict]:
    """Each task's per-part results (one dict per loop item), and the run's exit status last."""
    (tmp_path / "play.yml").write_text(yaml.safe_dump(
        [{"hosts": "here", "gather_facts": False, "tasks": tasks}], sort_keys=False))
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(REPO / ".venv" / "bin" / "python")}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"here": local}}}))
    _rc, result = run_playbook_json(str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"), *args,
                                    timeout=PLAYBOOK_TIMEOUT_S)
    return [task["hosts"]["here"] for play in result["plays"] for task in play["tasks"]]


@pytest.fixture
def controller_file(tmp_path: Path) -> Path:
    path = tmp_path / "controller" / "big.whl"
    path.parent.mkdir()
    path.write_bytes(os.urandom(2 * PART_BYTES + 500))
    return path


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    path = tmp_path / "host"
    path.mkdir()
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_crosses_in_parts_each_its_own_result_and_lands_whole(tmp_path, controller_file, host_dir) -> None:
    dest = host_dir / "big.whl"
    [copy] = play(tmp_path, [copy_task(controller_file, dest, mode="0640")])
    parts = copy["results"]
    assert [(part["item"]["part"], part["copied"], part["complete"], part["changed"]) for part in parts] == [
        (1, 1000, False, True), (2, 2000, False, True), (3, 2500, True, True)]
    assert dest.read_bytes() == controller_file.read_bytes()
    assert parts[-1]["sha256"] == sha256(controller_file)
    assert oct(dest.stat().st_mode & 0o777) == "0o640"
    assert sorted(os.listdir(host_dir)) == ["big.whl"]


def test_a_file_already_there_is_not_copied_again(tmp_path, controller_file, host_dir) -> None:
    dest = host_dir / "big.whl"
    play(tmp_path, [copy_task(controller_file, dest)])
    before = dest.stat().st_mtime_ns
    [again] = play(tmp_path, [copy_task(controller_file, dest)])
    assert [part["changed"] for part in again["results"]] == [False, False, False]
    assert all(part["complete"] for part in again["results"])
    assert dest.stat().st_mtime_ns == before


def test_check_mode_says_what_it_would_copy_and_writes_nothing(tmp_path, controller_file, host_dir) -> None:
    [copy] = play(tmp_path, [copy_task(controller_file, host_dir / "big.whl")], "--check")
    assert [part["changed"] for part in copy["results"]] == [True, True, True]
    assert os.listdir(host_dir) == []


def test_a_file_that_changed_on_the_controller_during_the_copy_is_refused_and_removed(
        tmp_path, controller_file, host_dir) -> None:
    dest = host_dir / "big.whl"
    changed = tmp_path / "controller" / "changed.whl"
    changed.write_bytes(os.urandom(controller_file.stat().st_size))
    first_parts = copy_task(controller_file, dest, parts=[0, 1])
    last_part_of_other = copy_task(changed, dest, parts=[2])
    _first, last = play(tmp_path, [first_parts, last_part_of_other])
    [failure] = last["results"]
    assert last["failed"] and not failure["complete"]
    assert "does not match the controller's file" in failure["msg"] and "run the task again" in failure["msg"]
    assert os.listdir(host_dir) == []


def test_a_part_that_does_not_continue_the_copy_is_refused(tmp_path, controller_file, host_dir) -> None:
    dest = host_dir / "big.whl"
    [skipping] = play(tmp_path, [copy_task(controller_file, dest, parts=[0, 2])])
    first, third = skipping["results"]
    # per part, ansible's JSON output keeps "failed" only for the task
    assert skipping["failed"] and "msg" not in first and not third["changed"]
    assert "does not continue the copy" in third["msg"] and "from the first part" in third["msg"]
    assert not dest.exists()


@pytest.mark.parametrize("size", [0, PART_BYTES - 300, PART_BYTES])
def test_a_file_no_larger_than_a_part_is_one_part(tmp_path, host_dir, size) -> None:
    small = tmp_path / "small.txt"
    small.write_bytes(os.urandom(size))
    [copy] = play(tmp_path, [copy_task(small, host_dir / "small.txt")])
    assert [(part["complete"], part["copied"]) for part in copy["results"]] == [(True, size)]
    assert (host_dir / "small.txt").read_bytes() == small.read_bytes()


def test_a_part_outside_the_file_is_refused_before_anything_is_shipped(tmp_path, controller_file, host_dir) -> None:
    task = {"name": "Copy", "pivot.ops.file_part": {"src": str(controller_file), "dest": str(host_dir / "x"),
                                                    "offset": 2000, "size": 1000}}
    [outcome] = play(tmp_path, [task])
    assert outcome["failed"] and "not within the 2500-byte file" in outcome["msg"]
    assert os.listdir(host_dir) == []


def test_the_parts_cover_each_file_in_order() -> None:
    files = [{"name": "a", "bytes": 2500}, {"name": "b", "bytes": 1000}, {"name": "c", "bytes": 0}]
    assert [(item["name"], item["offset"], item["size"], item["part"], item["parts"])
            for item in file_parts(files, 1000)] == [
        ("a", 0, 1000, 1, 3), ("a", 1000, 1000, 2, 3), ("a", 2000, 500, 3, 3), ("b", 0, 1000, 1, 1),
        ("c", 0, 0, 1, 1)]


@pytest.mark.parametrize(("files", "part_bytes", "problem"), [
    ([{"name": "a", "bytes": 1}], 0, "part_bytes must be a whole number of bytes above 0"),
    ([{"name": "a"}], 10, "each file needs its size in bytes as 'bytes'"),
    ([{"name": "a", "bytes": -1}], 10, "each file needs its size in bytes as 'bytes'"),
])
def test_the_parts_filter_refuses_what_it_cannot_split(files, part_bytes, problem) -> None:
    from ansible.errors import AnsibleFilterError  # noqa: PLC0415

    with pytest.raises(AnsibleFilterError, match=problem):
        file_parts(files, part_bytes)


def test_the_module_refuses_a_part_that_arrived_short(run_module, tmp_path) -> None:
    part = tmp_path / "part"
    part.write_bytes(b"x" * 10)
    result = run_module(file_part.main, {"src": str(part), "dest": str(tmp_path / "d"), "offset": 0, "size": 20,
                                         "_total": 20, "_sha256": "0" * 64})
    assert result["failed"] and "arrived with 10 bytes, not 20" in result["msg"]
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.pivot-part").exists()


def test_the_module_alone_without_its_action_plugin_says_how_to_call_it(run_module, tmp_path) -> None:
    part = tmp_path / "part"
    part.write_bytes(b"x")
    result = run_module(file_part.main, {"src": str(part), "dest": str(tmp_path / "d")})
    assert result["failed"] and "call the module by that name" in result["msg"]
