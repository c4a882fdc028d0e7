"""The controller-side test equipment in tests/support/controller_site: an ansible-playbook the tests start loads a
host's connection plugin once, in the parent, instead of in every forked worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "tests" / "support" / "controller_site"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"

sys.path.insert(0, str(SITE))
import pivot_connection_preload  # noqa: E402 - from the site directory above

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
        pivot_connection_preload.preload_connection(name, loaded, load)
    assert calls == ["ssh", "broken"]


def test_the_strategy_is_patched_once_and_passes_everything_through() -> None:
    queued: list[tuple] = []
    loads: list[str] = []

    class Strategy:
        def _queue_task(self, host: str, task: object, task_vars: dict, play_context: object) -> str:
            queued.append((host, task_vars, play_context))
            return "queued"

    assert pivot_connection_preload.patch_strategy(Strategy, loads.append)
    assert not pivot_connection_preload.patch_strategy(Strategy, loads.append)
    assert Strategy()._queue_task("ct200", object(), {"ansible_connection": "pct"}, "pc") == "queued"
    assert Strategy()._queue_task("ct200", object(), {"ansible_connection": "pct"}, "pc") == "queued"
    assert loads == ["pct"]
    assert [host for host, _vars, _pc in queued] == ["ct200", "ct200"]


def test_another_ansible_without_the_method_runs_unpatched() -> None:
    class Strategy:
        pass

    assert not pivot_connection_preload.patch_strategy(Strategy, lambda name: None)


def test_the_installed_ansible_has_what_the_patch_wraps() -> None:
    """An ansible-core that renames it would make the suite slower, not wrong: this says so."""
    probe = ("import inspect, ansible.plugins.strategy as m; "
             "print(list(inspect.signature(m.StrategyBase._queue_task).parameters))")
    completed = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", probe],
                               capture_output=True, text=True, timeout=120, check=False)
    assert completed.stdout.strip() == "['self', 'host', 'task', 'task_vars', 'play_context']", completed.stderr
