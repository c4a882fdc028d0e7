"""The controller-side test equipment in tests/support/controller_site: an ansible-playbook the tests start loads a
host's connection plugin once, in the parent, instead of in every forked worker, and parses a play's vars_files once
per version of the file instead of for every task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "tests" / "support" / "controller_site"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"

sys.path.insert(0, str(SITE))
import pivot_ansible_speedups  # noqa: E402 - from the site directory above

sys.path.remove(str(SITE))

# A connection plugin in a collection of its own (as community.proxmox's is) that runs like `local` and notes each
# process that loads it: Ansible's workers send their own output nowhere, so what they import cannot be read from it.
COUNTING_CONNECTION = """
import os
from ansible.plugins.connection.local import Connection as LocalConnection

with open(os.environ["LOADED_BY"], "a") as log:
    log.write("%d\\n" % os.getpid())


class Connection(LocalConnection):
    transport = "probe.counting.counting"
"""


def processes_that_loaded_the_connection(tmp_path: Path, hosts: str, tasks: int, *, site: bool) -> set[str]:
    """The processes in which a playbook of TASKS tasks on HOSTS loaded the counting connection plugin."""
    collection = tmp_path / "collections" / "ansible_collections" / "probe" / "counting"
    (collection / "plugins" / "connection").mkdir(parents=True)
    (collection / "galaxy.yml").write_text("namespace: probe\nname: counting\nversion: 1.0.0\n")
    (collection / "plugins" / "connection" / "counting.py").write_text(COUNTING_CONNECTION)
    (tmp_path / "inventory").write_text(
        "container ansible_connection=probe.counting.counting\nlocalhost ansible_connection=local\n")
    play = "".join(f"    - ansible.builtin.command: echo task {n}\n      changed_when: false\n" for n in range(tasks))
    (tmp_path / "play.yml").write_text(f"- hosts: {hosts}\n  gather_facts: false\n  tasks:\n{play}")
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != SITE]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), *path] if site else path),
           "LOADED_BY": str(tmp_path / "loaded-by"), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": f"{tmp_path / 'collections'}{os.pathsep}{REPO / '.cache' / 'collections'}",
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    completed = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(tmp_path / "inventory"), str(tmp_path / "play.yml")],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"ok={tasks}" in completed.stdout
    loaded_by = tmp_path / "loaded-by"
    return set(loaded_by.read_text().split()) if loaded_by.exists() else set()


def test_the_workers_inherit_the_connection_plugin_the_parent_loaded_once(tmp_path: Path) -> None:
    assert len(processes_that_loaded_the_connection(tmp_path / "plain", "container", 3, site=False)) == 3
    assert len(processes_that_loaded_the_connection(tmp_path / "site", "container", 3, site=True)) == 1


def test_a_play_without_such_a_host_never_loads_it(tmp_path: Path) -> None:
    assert processes_that_loaded_the_connection(tmp_path, "localhost", 2, site=True) == set()


def test_each_connection_is_loaded_once_and_a_failure_is_left_to_the_worker() -> None:
    loaded: set[str] = set()
    calls: list[str] = []

    def load(name: str) -> None:
        calls.append(name)
        if name == "broken":
            raise ImportError("No module named 'paramiko'")

    for name in ("ssh", "ssh", "broken", "broken", "{{ templated }}", None, ""):
        pivot_ansible_speedups.preload_connection(name, loaded, load)
    assert calls == ["ssh", "broken"]


def test_the_strategy_is_patched_once_and_passes_everything_through() -> None:
    queued: list[tuple] = []
    loads: list[str] = []

    class Strategy:
        def _queue_task(self, host: str, task: object, task_vars: dict, play_context: object) -> str:
            queued.append((host, task_vars, play_context))
            return "queued"

    assert pivot_ansible_speedups.patch_strategy(Strategy, loads.append)
    assert not pivot_ansible_speedups.patch_strategy(Strategy, loads.append)
    assert Strategy()._queue_task("ct200", object(), {"ansible_connection": "pct"}, "pc") == "queued"
    assert Strategy()._queue_task("ct200", object(), {"ansible_connection": "pct"}, "pc") == "queued"
    assert loads == ["pct"]
    assert [host for host, _vars, _pc in queued] == ["ct200", "ct200"]


def test_another_ansible_without_the_method_runs_unpatched() -> None:
    class Strategy:
        pass

    assert not pivot_ansible_speedups.patch_strategy(Strategy, lambda name: None)


def test_the_installed_ansible_is_patched_as_it_is_imported() -> None:
    """An ansible-core that renames what is wrapped would make the suite slower, not wrong: this says so."""
    probe = """
import sys
sys.path.insert(0, sys.argv[1])
import pivot_ansible_speedups
pivot_ansible_speedups.install()
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.strategy import StrategyBase
print(DataLoader.load_from_file._pivot_remembers, StrategyBase._queue_task._pivot_preloads)
"""
    completed = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", probe, str(SITE)],
                               capture_output=True, text=True, timeout=120, check=False)
    assert completed.stdout.strip() == "True True", completed.stderr


class CountingLoader:
    """DataLoader's load_from_file as far as the patch uses it: counts the parses it is asked for."""

    def __init__(self) -> None:
        self.parses: list[tuple[str, str]] = []

    def path_dwim(self, file_name: str) -> str:
        return file_name

    def load_from_file(self, file_name: str, cache: str = "all", unsafe: bool = False, json_only: bool = False,
                       trusted_as_template: bool = False) -> dict:
        self.parses.append((file_name, cache))
        return {"value": Path(file_name).read_text().strip(), "nested": {"list": [1]}}


def test_a_vars_file_is_parsed_once_until_it_changes(tmp_path: Path) -> None:
    class Loader(CountingLoader):
        pass

    assert pivot_ansible_speedups.remember_vaulted_parses(Loader)
    assert not pivot_ansible_speedups.remember_vaulted_parses(Loader)
    loader = Loader()
    vars_file = tmp_path / "roles.yml"
    vars_file.write_text("one")
    first = loader.load_from_file(str(vars_file), cache="vaulted", unsafe=True)
    assert loader.load_from_file(str(vars_file), cache="vaulted", unsafe=True) is first
    copied = loader.load_from_file(str(vars_file), cache="vaulted")
    assert copied == first and copied is not first and copied["nested"] is not first["nested"]
    assert len(loader.parses) == 1
    vars_file.write_text("two, longer")
    assert loader.load_from_file(str(vars_file), cache="vaulted", unsafe=True)["value"] == "two, longer"
    loader.load_from_file(str(vars_file), cache="all")
    loader.load_from_file(str(vars_file), cache="all")
    assert [cache for _name, cache in loader.parses] == ["vaulted", "vaulted", "all", "all"]
    with pytest.raises(FileNotFoundError):
        loader.load_from_file(str(tmp_path / "missing.yml"), cache="vaulted")


def test_a_vars_file_edited_during_a_run_is_read_anew(tmp_path: Path) -> None:
    """What ansible-core does without the patch: a task after the edit sees the new value."""
    (tmp_path / "vars.yml").write_text("value: one\n")
    (tmp_path / "play.yml").write_text(f"""
- hosts: localhost
  gather_facts: false
  vars_files:
    - {tmp_path / "vars.yml"}
  tasks:
    - ansible.builtin.debug:
        msg: "before: {{{{ value }}}}"
    - ansible.builtin.copy:
        dest: {tmp_path / "vars.yml"}
        content: "value: two, and longer\\n"
    - ansible.builtin.debug:
        msg: "after: {{{{ value }}}}"
""")
    env = {**os.environ, "PYTHONPATH": str(SITE), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    completed = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "before: one" in completed.stdout
    assert "after: two, and longer" in completed.stdout and "after: one" not in completed.stdout
