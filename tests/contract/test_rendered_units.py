"""Every ExecStart the sglang_release role renders parses with SGLang 0.5.23's own parser (plugin loaded).

The units are rendered for real: ansible-playbook runs the role's own ``render`` tasks on localhost with the
production group_vars, the role variables of playbooks/vars/roles.yml and those pivot.yml adds in phase 5
(read from the playbook, not copied), into a temporary root. render.yml itself runs ``systemd-analyze verify`` and
``ddtree_runtime.argcheck`` with .venv-sglang as the serving venv; the tests then parse each ExecStart again.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from contract_support import REPO, SGLANG_VENV, ProbeRunner

RELEASE_ROLE = "pivot.ops.sglang_release"


def phase5_release_vars() -> dict[str, Any]:
    """The ``sglang_release_*`` variables pivot.yml adds to playbooks/vars/roles.yml (Jinja left for Ansible)."""
    for play in yaml.safe_load((REPO / "playbooks" / "pivot.yml").read_text()):
        for task in play.get("tasks", []):
            task_vars = task.get("vars", {})
            if task_vars.get("run_phase_role") == RELEASE_ROLE:
                return {key: value for key, value in task_vars.items() if key.startswith("sglang_release_")}
    raise AssertionError(f"playbooks/pivot.yml no longer runs {RELEASE_ROLE}")


def render_playbook(root: Path) -> list[dict[str, Any]]:
    release_vars = phase5_release_vars() | {
        "sglang_release_root": str(root),
        "sglang_release_venv": str(SGLANG_VENV),
        "sglang_release_api_key": "",
    }
    group_vars = REPO / "inventory" / "production" / "group_vars"

    def render(name: str, algorithm: str, flags: str) -> dict[str, Any]:
        return {
            "name": f"Render {name}",
            "ansible.builtin.include_role": {"name": RELEASE_ROLE, "tasks_from": "render"},
            "vars": release_vars | {
                "__sglang_release_render_name": name,
                "__sglang_release_render_description": f"contract test: {name}",
                "__sglang_release_render_algorithm": algorithm,
                "__sglang_release_render_flags": flags,
                "__sglang_release_render_environment": "{{ sglang_release_environment }}",
            },
        }

    return [{
        "name": "Render the releases the roles deploy",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars_files": [str(group_vars / "all.yml"), str(group_vars / "serving.yml"),
                       str(REPO / "playbooks" / "vars" / "roles.yml")],
        "tasks": [
            render("ddtree", "DDTREE", "{{ sglang_release_speculative_args }}"),
            render("nextn-baseline", "NEXTN", "{{ sglang_release_baseline_args }}"),
        ],
    }]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, sglang_python: Path) -> Path:
    work = tmp_path_factory.mktemp("render")
    root = work / "etc-sglang"
    playbook = work / "render.yml"
    playbook.write_text(yaml.safe_dump(render_playbook(root), sort_keys=False))
    completed = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", str(playbook)],
        capture_output=True, text=True, cwd=REPO, timeout=600, check=False,
    )
    assert completed.returncode == 0, f"rendering failed:\n{completed.stdout[-6000:]}\n{completed.stderr[-3000:]}"
    return root


def exec_start_argv(unit: Path) -> list[str]:
    """ExecStart of a rendered unit as argv (continuation lines joined, as systemd reads them)."""
    text = unit.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def environment_of(release: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (release / "environment").read_text().splitlines()
             if line and not line.startswith("#"))
    return dict(pairs)


@pytest.mark.parametrize(("release", "algorithm"), [("ddtree", "DDTREE"), ("nextn-baseline", "NEXTN")])
def test_rendered_exec_start_parses_with_sglang(
    rendered: Path, run_probe: ProbeRunner, release: str, algorithm: str
) -> None:
    release_dir = rendered / "releases" / release
    argv = exec_start_argv(release_dir / "sglang.service")
    assert argv[:3] == [str(SGLANG_VENV / "bin" / "python3"), "-m", "sglang.launch_server"]
    parsed = run_probe("parse", argv[3:], env=environment_of(release_dir))
    assert parsed["speculative_algorithm"].upper() == algorithm
    assert parsed["model_path"] == "/root/models/Qwen3.6-27B"
    recorded = json.loads((release_dir / "release.json").read_text())
    assert recorded["argv"] == argv


def test_ddtree_release_selects_the_plugin_and_its_knobs(rendered: Path, run_probe: ProbeRunner) -> None:
    release_dir = rendered / "releases" / "ddtree"
    env = environment_of(release_dir)
    assert env["SGLANG_PLUGINS"] == "ddtree"
    argv = exec_start_argv(release_dir / "sglang.service")
    spec = run_probe("resolve-spec", argv[3:], env=env)
    production = yaml.safe_load((REPO / "inventory" / "production" / "group_vars" / "serving.yml").read_text())
    budget = production["pivot_ddtree_budget"]
    assert spec["resolved"]["speculative_num_draft_tokens"] == production["pivot_ddtree_draft_tokens"]
    assert spec["target_verify_width"] == budget + 1
    assert spec["max_draft_tokens"] == max(budget + 1, production["pivot_ddtree_draft_tokens"])


def test_a_misspelt_flag_is_caught_by_the_same_parser(run_probe: ProbeRunner) -> None:
    failed = run_probe("parse", ["--model-path", "/m", "--speculative-algorithm", "DDTREE",
                                 "--mamba-scheduler-strategy", "extra_buffer"], expect_rc=2)
    assert "unrecognized arguments" in failed["stderr"]
