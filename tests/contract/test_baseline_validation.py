"""The NEXTN baseline's unit file, the one a rollback starts, is checked before anything stops, with real SGLang 0.5.23.

The sglang_release role's own ``baseline`` tasks run on localhost: systemd is the host's ``systemd-analyze`` with a
stand-in ``systemctl`` that reports a user's unit as loaded (its file, its ExecStart as systemd prints it, a
MainPID), and the unit runs SGLang from .venv-sglang, where ddtree_runtime is installed, as in a user's venv that
was given the plugin. What is validated is the unit file's ExecStart= (not the running process's command line);
``systemd-analyze verify`` must have nothing to say about it; and, because SGLang 0.5.23 loads every installed plugin
when SGLANG_PLUGINS is unset or empty, a baseline whose SGLang would load ddtree_runtime's plugin is refused. A refused
unit is not recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from contract_support import REPO, SGLANG_VENV

PLAYBOOK_TIMEOUT_S = 600
PYTHON = str(SGLANG_VENV / "bin" / "python3")
USER_ARGV = [PYTHON, "-m", "sglang.launch_server", "--model-path", "/root/models/Qwen3.6-27B", "--port", "30000",
             "--tp-size", "2", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


class ServingHost:
    """A user's unit file, what a stand-in systemctl says about it, and a play running the role's baseline tasks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.unit = root / "etc" / "systemd" / "system" / "sglang.service"
        self.unit.parent.mkdir(parents=True)
        self.releases = root / "etc" / "sglang" / "releases"
        self.baseline = self.releases / "nextn-baseline"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        systemctl = bin_dir / "systemctl"
        systemctl.write_text(f'#!/bin/sh\n[ "$1" = show ] || exit 1\ncat {root / "show.txt"}\n')
        systemctl.chmod(0o755)
        self.env = {key: value for key, value in os.environ.items() if not key.startswith(("SGLANG_", "DDTREE_"))}
        self.env |= {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "",
                     "PYTHONWARNINGS": "ignore", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
                     "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "NO_COLOR": "1"}
        (root / "play.yml").write_text(yaml.safe_dump([{
            "name": "Record and check the baseline", "hosts": "localhost", "connection": "local",
            "gather_facts": False,
            "tasks": [{"name": "Record the baseline and validate it",
                       "ansible.builtin.include_role": {"name": "pivot.ops.sglang_release", "tasks_from": "baseline"},
                       "vars": {"sglang_release_root": str(root / "etc" / "sglang")}}],
        }], sort_keys=False))

    def write_unit(self, environment: str = "", argv: list[str] | None = None, extra: str = "") -> None:
        lines = ["[Unit]", "Description=SGLang server (NEXTN)", "After=network-online.target",
                 "Wants=network-online.target", "", "[Service]", "Type=simple", "Environment=CUDA_VISIBLE_DEVICES=0,1"]
        lines += [f"Environment={environment}"] if environment else []
        words = argv or USER_ARGV
        lines += ["ExecStart=" + " ".join(words[:5]) + " \\", "    " + " ".join(words[5:])]
        lines += [extra] if extra else []
        lines += ["Restart=on-failure", "", "[Install]", "WantedBy=multi-user.target", ""]
        self.unit.write_text("\n".join(lines))

    def systemd_loads(self, argv: list[str] | None = None, main_pid: int = 0) -> None:
        """What `systemctl show sglang.service` prints: the unit loaded from its file, running argv (or USER_ARGV)."""
        shown = " ".join(argv or USER_ARGV)
        (self.root / "show.txt").write_text("\n".join([
            "Id=sglang.service", "LoadState=loaded", "ActiveState=active", "SubState=running",
            f"FragmentPath={self.unit}", f"MainPID={main_pid}",
            f"ExecStart={{ path={(argv or USER_ARGV)[0]} ; argv[]={shown} ; ignore_errors=no ; start_time=[n/a] ; "
            "stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }", "Environment=CUDA_VISIBLE_DEVICES=0,1", ""]))

    def run(self, *args: str) -> tuple[int, str]:
        """The play's exit status and the message of its failure ('' when it passed)."""
        proc = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,",
                               str(self.root / "play.yml"), "-e", f"ansible_python_interpreter={REPO}/.venv/bin/python",
                               *args], cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=PLAYBOOK_TIMEOUT_S, check=False)
        try:
            result: dict[str, Any] = json.loads(proc.stdout)
        except ValueError as exc:
            raise AssertionError(f"no JSON: {proc.stdout[-3000:]} {proc.stderr[-3000:]}") from exc
        failed = [host.get("msg", "") for play in result["plays"] for task in play["tasks"]
                  for host in task["hosts"].values() if host.get("failed")]
        return proc.returncode, " ".join(str(failed[-1]).split()) if failed else ""

    def recorded(self) -> dict[str, Any]:
        return json.loads((self.baseline / "release.json").read_text())


@pytest.fixture
def host(tmp_path: Path, sglang_python: Path) -> ServingHost:
    return ServingHost(tmp_path)


@pytest.mark.parametrize("environment", ["", "SGLANG_PLUGINS="])
def test_a_baseline_whose_sglang_would_load_ddtree_is_refused_before_it_is_recorded(
    host: ServingHost, environment: str
) -> None:
    """SGLang 0.5.23 loads every installed plugin when SGLANG_PLUGINS is unset or empty: the NEXTN server would load
    DDTree's hooks. The pivot stops there, naming the plugin, the venv and the unit."""
    host.write_unit(environment)
    host.systemd_loads()
    rc, message = host.run()
    assert rc != 0
    assert f"the baseline release nextn-baseline ({host.unit}) would load DDTree code" in message, message
    assert f"the SGLang in {SGLANG_VENV} loads the plugin(s) ddtree of ddtree_runtime" in message
    assert "its unit sets no SGLANG_PLUGINS, so SGLang loads every plugin installed there" in message
    assert "Nothing was stopped." in message and f"{SGLANG_VENV}/bin/python -m pip uninstall ddtree_runtime" in message
    assert not host.baseline.exists(), "a refused unit is not recorded"


def test_a_selection_naming_another_plugin_is_said_to_select_ddtree_only_when_it_does(host: ServingHost) -> None:
    host.write_unit("SGLANG_PLUGINS=ddtree,mine")
    host.systemd_loads()
    rc, message = host.run()
    assert rc != 0 and "(SGLANG_PLUGINS=ddtree,mine selects it)" in message, message


def test_the_baseline_is_recorded_and_validated_from_its_unit_files_exec_start(host: ServingHost) -> None:
    """The record's argv is the file's ExecStart= (what a rollback runs), not the running process's command line."""
    host.write_unit("SGLANG_PLUGINS=mine")
    with subprocess.Popen(["sleep", "300"]) as other:
        try:
            host.systemd_loads(main_pid=other.pid)
            rc, message = host.run()
        finally:
            other.kill()
    assert rc == 0, message
    recorded = host.recorded()
    assert recorded["source"] == "recorded" and recorded["recorded_from"] == str(host.unit)
    assert recorded["argv"] == USER_ARGV and recorded["argv_source"] == f"ExecStart= of {host.unit}"
    assert recorded["running_argv"] == ["sleep", "300"]
    assert recorded["environment"] == {"SGLANG_PLUGINS": "mine"}
    assert (host.baseline / "sglang.service").read_text() == host.unit.read_text()


def test_the_recorded_copy_is_what_later_runs_validate(host: ServingHost) -> None:
    """Once recorded, the copy a rollback starts is read again on every run: an edit to it that its SGLang rejects, or
    that systemd-analyze finds fault with, is refused, in check mode too."""
    host.write_unit("SGLANG_PLUGINS=mine")
    host.systemd_loads()
    assert host.run()[0] == 0
    copy = host.baseline / "sglang.service"
    good = copy.read_text()
    copy.write_text(good.replace("--port 30000", "--port 30000 --mamba-scheduler-strategy extra_buffer"))
    rc, message = host.run()
    assert rc != 0
    assert (f"the baseline release nextn-baseline ({copy}, recorded from {host.unit}) would not start: the SGLang in "
            f"{SGLANG_VENV} rejects its command line") in message, message
    assert "unrecognized arguments: --mamba-scheduler-strategy extra_buffer" in message
    copy.write_text(good.replace("Restart=on-failure", "Restart=on-failure\nRestartSecs=10"))
    rc, message = host.run("--check")
    assert rc != 0
    assert f"`systemd-analyze verify {copy}` says: {copy}:" in message, message
    assert "RestartSecs" in message
    assert f"Correct {copy} (the file a rollback starts; Pivot never overwrites it)" in message


def test_systemd_analyze_findings_in_the_users_unit_refuse_it_before_it_is_recorded(host: ServingHost) -> None:
    host.write_unit("SGLANG_PLUGINS=mine", extra="RestartSecs=10")
    host.systemd_loads()
    rc, message = host.run()
    assert rc != 0
    assert f"the baseline release nextn-baseline ({host.unit}) would not start as it is" in message, message
    assert f"`systemd-analyze verify {host.unit}` says:" in message and "RestartSecs" in message
    assert f"Correct your unit {host.unit} (then run systemctl daemon-reload)" in message
    assert "or set pivot_validate_baseline=false to accept it unchecked." in message
    assert not host.baseline.exists()


def test_a_unit_systemd_runs_otherwise_than_its_file_says_is_refused(host: ServingHost) -> None:
    """A drop-in overriding ExecStart (or an edit not yet reloaded): the file Pivot would record is not what runs."""
    host.write_unit("SGLANG_PLUGINS=mine")
    host.systemd_loads([*USER_ARGV, "--enable-metrics"])
    rc, message = host.run()
    assert rc != 0
    assert f"Cannot validate the baseline release nextn-baseline ({host.unit}): systemd runs" in message, message
    assert "--enable-metrics" in message and "but the unit file says" in message
    assert "a drop-in or an edit not yet loaded (systemctl daemon-reload) changes it" in message
    assert not host.baseline.exists()
