"""Every ExecStart the sglang_release role renders for SGLang 0.5.23 parses with its own parser (plugin loaded).

The units are rendered for real: ansible-playbook runs the role's own ``render`` tasks on localhost with the
production group_vars, the role variables of playbooks/vars/roles.yml and those pivot.yml adds (read from the playbook,
not copied), into a temporary root. render.yml itself runs ``systemd-analyze verify`` and the role's
``check_server_args.py`` with the release venv's python (here .venv-sglang, real SGLang 0.5.23); the tests then parse
each ExecStart again. The production NEXTN baseline keeps the user's SGLang 0.5.11 flag names, which 0.5.23 rejects:
rendering it for a 0.5.23 venv must fail before anything would stop.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from contract_support import REPO, SGLANG_VENV, ProbeRunner, probe_env

RELEASE_ROLE = "pivot.ops.sglang_release"


def phase5_release_vars() -> dict[str, Any]:
    """The ``sglang_release_*`` variables pivot.yml adds to playbooks/vars/roles.yml (Jinja left for Ansible)."""
    for play in yaml.safe_load((REPO / "playbooks" / "pivot.yml").read_text()):
        for task in play.get("tasks", []):
            task_vars = task.get("vars", {})
            if task_vars.get("run_phase_role") == RELEASE_ROLE:
                return {key: value for key, value in task_vars.items() if key.startswith("sglang_release_")}
    raise AssertionError(f"playbooks/pivot.yml no longer runs {RELEASE_ROLE}")


def render_task(name: str, algorithm: str, common: str, flags: str) -> dict[str, Any]:
    """One include of the role's render tasks for a release run from .venv-sglang (real SGLang 0.5.23)."""
    release_vars = phase5_release_vars() | {"sglang_release_api_key": ""}
    return {
        "name": f"Render {name}",
        "ansible.builtin.include_role": {"name": RELEASE_ROLE, "tasks_from": "render"},
        "vars": release_vars | {
            "__sglang_release_render_name": name,
            "__sglang_release_render_description": f"contract test: {name}",
            "__sglang_release_render_algorithm": algorithm,
            "__sglang_release_render_common": common,
            "__sglang_release_render_flags": flags,
            "__sglang_release_render_environment": "{{ sglang_release_environment }}",
            "__sglang_release_render_venv": str(SGLANG_VENV),
        },
    }


def run_render(work: Path, tasks: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    group_vars = REPO / "inventory" / "production" / "group_vars"
    playbook = work / "render.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Render the releases the roles deploy",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars_files": [str(group_vars / "all.yml"), str(group_vars / "serving.yml"),
                       str(REPO / "playbooks" / "vars" / "roles.yml")],
        "vars": {"sglang_release_root": str(work / "etc-sglang")},
        "tasks": tasks,
    }], sort_keys=False))
    return subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", str(playbook)],
                          capture_output=True, text=True, cwd=REPO, timeout=600, check=False)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, sglang_python: Path) -> Path:
    work = tmp_path_factory.mktemp("render")
    completed = run_render(work, [
        render_task("ddtree", "DDTREE", "{{ sglang_release_common_args }}", "{{ sglang_release_speculative_args }}"),
        # NEXTN for a user whose own venv already has 0.5.23 (shared flags under 0.5.23's names).
        render_task("nextn-baseline", "NEXTN", "{{ sglang_release_common_args }}",
                    "{{ sglang_release_baseline_args }}"),
    ])
    assert completed.returncode == 0, f"rendering failed:\n{completed.stdout[-6000:]}\n{completed.stderr[-3000:]}"
    return work / "etc-sglang"


def test_the_users_0_5_11_baseline_flags_are_refused_by_0_5_23_before_anything_stops(
    tmp_path: Path, sglang_python: Path
) -> None:
    """Why the baseline keeps its own venv: upgrading it to 0.5.23 would make every rollback crash-loop."""
    completed = run_render(tmp_path, [render_task(
        "nextn-baseline", "NEXTN", "{{ sglang_release_baseline_common_args }}", "{{ sglang_release_baseline_args }}")])
    assert completed.returncode != 0
    assert "release nextn-baseline would not start" in completed.stdout
    assert "unrecognized arguments: --mamba-scheduler-strategy extra_buffer" in completed.stdout
    assert "Nothing was stopped" in completed.stdout


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


def load_unit_file_reader() -> ModuleType:
    """plugins/plugin_utils/unit_file.py (standard library only), the reader pivot.ops.unit_command runs."""
    path = REPO / "plugins" / "plugin_utils" / "unit_file.py"
    spec = importlib.util.spec_from_file_location("pivot_unit_file", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("release", ["ddtree", "nextn-baseline"])
def test_the_unit_file_reader_reads_each_rendered_unit_as_rendered(rendered: Path, release: str) -> None:
    """What the baseline check reads from a unit file is what systemd would run: Pivot's own units read back exactly."""
    release_dir = rendered / "releases" / release
    command = load_unit_file_reader().unit_command((release_dir / "sglang.service").read_text())
    assert command["problem"] == ""
    assert command["argv"] == json.loads((release_dir / "release.json").read_text())["argv"]


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


def test_the_ddtree_unit_states_every_setting_the_plugin_decides(rendered: Path, run_probe: ProbeRunner) -> None:
    """`systemctl cat` shows what serves: each field the plugin sets or overrides at start is on the unit's command
    line with the value SGLang holds once its argument resolution (the plugin's handler included) has run."""
    release_dir = rendered / "releases" / "ddtree"
    argv = exec_start_argv(release_dir / "sglang.service")
    outcome = run_probe("handle-changes", argv[3:], env=environment_of(release_dir))
    assert outcome["changed"] == {}, "the plugin decides settings the unit does not state"
    for field, value in outcome["resolved"].items():
        flag = "--" + field.replace("_", "-")
        assert flag in argv, f"{flag} is not on the unit's command line"
        assert argv[argv.index(flag) + 1] == str(value), (flag, argv[argv.index(flag) + 1], value)


def test_a_command_line_that_leaves_them_open_serves_with_the_plugins_values(run_probe: ProbeRunner) -> None:
    """Why the unit states them: on a bare DDTREE command line SGLang ends with the plugin's values (triton attention
    for the target and the drafter, page size 1, one draft step, the tree's topk), none of which the line says."""
    outcome = run_probe("handle-changes", ["--model-path", "/m", "--speculative-algorithm", "DDTREE",
                                           "--speculative-draft-model-path", "/d"], env={"SGLANG_PLUGINS": "ddtree"})
    assert outcome["changed"] == {
        "speculative_num_draft_tokens": [None, 16], "speculative_num_steps": [None, 1],
        "speculative_eagle_topk": [None, 2], "max_running_requests": [None, 48], "page_size": [None, 1],
        "attention_backend": [None, "triton"], "speculative_draft_attention_backend": [None, "triton"],
        "linear_attn_verify_backend": [None, "triton"]}, outcome


def test_a_misspelt_flag_is_caught_by_the_same_parser(run_probe: ProbeRunner) -> None:
    failed = run_probe("parse", ["--model-path", "/m", "--speculative-algorithm", "DDTREE",
                                 "--mamba-scheduler-strategy", "extra_buffer"], expect_rc=2)
    assert "unrecognized arguments" in failed["stderr"]


CHECK_ARGS = REPO / "roles" / "sglang_release" / "files" / "check_server_args.py"


def check_args(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SGLANG_VENV / "bin" / "python3"), str(CHECK_ARGS), "sglang.launch_server", *args],
                          capture_output=True, text=True, env=probe_env(env), timeout=300, check=False)


def test_the_api_key_reaches_sglang_0_5_23_through_the_config_file_not_argv(
    tmp_path: Path, sglang_python: Path
) -> None:
    """The role writes ``api-key: KEY`` to a root-only YAML file and passes ``--config FILE``: SGLang merges it."""
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(yaml.safe_dump({"api-key": "s3cret-key"}))
    probe = ("import sys; from sglang.srt.server_args import prepare_server_args; "
             "print(prepare_server_args(sys.argv[1:]).api_key)")
    completed = subprocess.run([str(SGLANG_VENV / "bin" / "python3"), "-c", probe, "--model-path", "/m",
                                "--config", str(secrets)], capture_output=True, text=True, env=probe_env(),
                               timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip().splitlines()[-1] == "s3cret-key"


def test_check_server_args_reports_the_plugins_refusal_from_real_sglang(sglang_python: Path) -> None:
    args = ["--model-path", "/m", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/d",
            "--speculative-num-draft-tokens", "1"]
    completed = check_args(args)
    assert completed.returncode == 2
    assert "must be in 2..16 for DDTREE, got 1" in completed.stderr


@pytest.mark.parametrize(("selection", "loaded"), [
    (None, {"ddtree": "ddtree_runtime"}),  # unset: every installed plugin
    ("", {"ddtree": "ddtree_runtime"}),  # empty restricts nothing either
    (",", {}),  # a selection naming no installed plugin loads none
    ("ddtree", {"ddtree": "ddtree_runtime"}),
])
def test_check_server_args_reports_the_plugins_sglang_0_5_23_loads(
    sglang_python: Path, selection: str | None, loaded: dict[str, str]
) -> None:
    """Why the NEXTN baseline is validated for DDTree code rather than given an empty SGLANG_PLUGINS: SGLang 0.5.23
    treats an empty selection as none at all, and loads ddtree_runtime's plugin wherever it is installed."""
    env = probe_env({"SGLANG_PLUGINS": selection} if selection is not None else None)
    if selection is None:
        env.pop("SGLANG_PLUGINS")
    completed = subprocess.run([str(SGLANG_VENV / "bin" / "python3"), str(CHECK_ARGS), "sglang.launch_server",
                                "--model-path", "/m"], capture_output=True, text=True, env=env, timeout=300,
                               check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
    reported = json.loads(completed.stdout.strip().splitlines()[-1])
    assert reported["plugin_distributions"] == loaded and reported["plugins"] == sorted(loaded)
