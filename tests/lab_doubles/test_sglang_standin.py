"""The lab's SGLang stand-in, checked the way Pivot checks a release: the role's check_server_args.py, run with the
python of a venv holding the stand-in wheel, as on the lab's serving host.

0.5.11 (the user's venv) takes the user's unit with --mamba-scheduler-strategy and has no plugin system; 0.5.23 (the
release venv) refuses that flag (as real 0.5.23 does: tests/contract) and knows DDTREE only when ddtree_runtime's entry
point is installed and selected, judging it with the plugin's own rules. Each venv also holds the lab server's wheel,
as on the lab's serving host, and the launcher hands it the checked settings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "lab" / "files" / "sglang-standin" / "build_wheels.py"
LABSERVER = REPO / "lab" / "files" / "labserver"
CHECK = REPO / "roles" / "sglang_release" / "files" / "check_server_args.py"
TARGET = REPO / "ddtree_runtime" / "models" / "pivot-coder-tiny"
DRAFTER = REPO / "ddtree_runtime" / "models" / "pivot-coder-tiny-dflash"
USER_UNIT_ARGS = ["--model-path", str(TARGET), "--port", "30000", "--host", "0.0.0.0", "--tp-size", "2",
                  "--mem-fraction-static", "0.88", "--context-length", "131072", "--max-running-requests", "16",
                  "--mamba-full-memory-ratio", "0.5", "--mamba-scheduler-strategy", "extra_buffer",
                  "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder", "--speculative-algo", "NEXTN",
                  "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                  "--speculative-num-draft-tokens", "4"]
LAB_PYTHON = "/usr/bin/python3"  # Debian 12's 3.11, what the lab's hosts run


def pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--disable-pip-version-check", *args], check=True, capture_output=True, timeout=300)


def install_ddtree_from_checkout(venv: Path) -> None:
    """What ``pip install ddtree_runtime`` leaves that SGLang's plugin discovery reads: the distribution's metadata with
    its ``sglang.srt.plugins`` entry point, and the package on the path (here the checkout's, through a .pth)."""
    site = next((venv / "lib").glob("python3*/site-packages"))
    info = site / "ddtree_runtime-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddtree_runtime\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[sglang.srt.plugins]\nddtree = ddtree_runtime.sglang:register\n")
    (site / "ddtree_runtime_checkout.pth").write_text(f"{REPO / 'ddtree_runtime'}\n")


def labserver_wheel_name() -> str:
    project = tomllib.loads((LABSERVER / "pyproject.toml").read_text())["project"]
    return f"{project['name']}-{project['version']}-py3-none-any.whl"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, str(BUILD), str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("standin")
    # SGLang reads --config with PyYAML (the lab's hosts have it on their shared package path); the pure-Python
    # part of the controller's copy stands in for it here.
    shutil.copytree(Path(yaml.__file__).parent, root / "pylib" / "yaml")
    made = {}
    for name, version in (("0.5.11", "0.5.11"), ("0.5.23", "0.5.23"), ("0.5.23-ddtree", "0.5.23")):
        venv = root / name
        subprocess.run([LAB_PYTHON, "-m", "venv", str(venv)], check=True, timeout=120)
        pip(venv, str(wheels / f"sglang-{version}-py3-none-any.whl"), str(wheels / labserver_wheel_name()))
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "pylib.pth").write_text(f"{root / 'pylib'}\n")
        made[name] = venv
    with_plugin = made["0.5.23-ddtree"]
    install_ddtree_from_checkout(with_plugin)
    return made


def check(venv: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "DDTREE_"))} | env
    return subprocess.run([str(venv / "bin" / "python"), str(CHECK), "sglang.launch_server", *args],
                          capture_output=True, text=True, env=environ, timeout=120, check=False)


def test_0_5_11_takes_the_users_unit(venvs: dict[str, Path]) -> None:
    done = check(venvs["0.5.11"], USER_UNIT_ARGS)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True, "sglang_version": "0.5.11", "speculative_algorithm": "NEXTN",
                                       "plugins": None, "plugin_distributions": None}


def test_0_5_23_rejects_the_users_mamba_flag_as_real_sglang_does(venvs: dict[str, Path]) -> None:
    done = check(venvs["0.5.23"], USER_UNIT_ARGS)
    assert done.returncode == 2
    assert "unrecognized arguments: --mamba-scheduler-strategy extra_buffer" in done.stderr


def test_0_5_11_rejects_the_flag_that_replaced_it(venvs: dict[str, Path]) -> None:
    args = [a if a != "--mamba-scheduler-strategy" else "--mamba-radix-cache-strategy" for a in USER_UNIT_ARGS]
    assert check(venvs["0.5.11"], args).returncode == 2
    assert check(venvs["0.5.23"], args).returncode == 0


def ddtree_args(draft: int) -> list[str]:
    return ["--model-path", str(TARGET), "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path",
            str(DRAFTER), "--speculative-num-draft-tokens", str(draft)]


def test_ddtree_is_unknown_without_the_plugin(venvs: dict[str, Path]) -> None:
    done = check(venvs["0.5.23"], ddtree_args(16), SGLANG_PLUGINS="ddtree")
    assert done.returncode == 2 and "Unknown speculative algorithm name: DDTREE" in done.stderr


def test_ddtree_resolves_through_the_selected_plugin(venvs: dict[str, Path]) -> None:
    done = check(venvs["0.5.23-ddtree"], ddtree_args(16), SGLANG_PLUGINS="ddtree", DDTREE_BUDGET="64")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["plugins"] == ["ddtree"]


@pytest.mark.parametrize("selection", [None, ""])
def test_without_a_selection_every_installed_plugin_loads(venvs: dict[str, Path], selection: str | None) -> None:
    """As real SGLang 0.5.23 (tests/contract): SGLANG_PLUGINS unset or empty restricts nothing."""
    env = {} if selection is None else {"SGLANG_PLUGINS": selection}
    done = check(venvs["0.5.23-ddtree"], ddtree_args(16), **env)
    assert done.returncode == 0, done.stderr
    reported = json.loads(done.stdout)
    assert reported["plugins"] == ["ddtree"] and reported["plugin_distributions"] == {"ddtree": "ddtree_runtime"}


def test_a_selection_naming_no_installed_plugin_loads_none(venvs: dict[str, Path]) -> None:
    done = check(venvs["0.5.23-ddtree"], USER_UNIT_ARGS[:8], SGLANG_PLUGINS=",")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["plugins"] == [] and json.loads(done.stdout)["plugin_distributions"] == {}


def test_a_plugin_left_out_of_sglang_plugins_is_not_loaded(venvs: dict[str, Path]) -> None:
    done = check(venvs["0.5.23-ddtree"], ddtree_args(16), SGLANG_PLUGINS="something_else")
    assert done.returncode == 2 and "Unknown speculative algorithm name: DDTREE" in done.stderr


@pytest.mark.parametrize(("draft", "budget", "message"), [
    (1, "64", "must be in 2..16 for DDTREE, got 1"),
    (17, "64", "must be in 2..16 for DDTREE, got 17"),
    (16, "4096", "DDTREE_BUDGET must be at most 1024"),
])
def test_the_plugins_own_rules_refuse(venvs: dict[str, Path], draft: int, budget: str, message: str) -> None:
    done = check(venvs["0.5.23-ddtree"], ddtree_args(draft), SGLANG_PLUGINS="ddtree", DDTREE_BUDGET=budget)
    assert done.returncode == 2 and message in done.stderr


def test_the_plugins_server_args_rules_refuse_a_backend_it_cannot_verify_trees_on(venvs: dict[str, Path]) -> None:
    """The stand-in runs the plugin's own validate_server_args (as SGLang 0.5.23 does through the registration; on the
    H200 DDTREE with --attention-backend fa3 was refused at start), so the lab refuses what production refuses."""
    done = check(venvs["0.5.23-ddtree"], [*ddtree_args(16), "--attention-backend", "fa3"], SGLANG_PLUGINS="ddtree",
                 DDTREE_BUDGET="64")
    assert done.returncode == 2 and "--attention-backend fa3 cannot verify DDTree trees" in done.stderr
    allowed = check(venvs["0.5.23-ddtree"], [*ddtree_args(16), "--attention-backend", "triton"],
                    SGLANG_PLUGINS="ddtree", DDTREE_BUDGET="64")
    assert allowed.returncode == 0, allowed.stderr


def test_the_plugins_mamba_rule_refuses_a_tree_wider_than_the_track_interval(venvs: dict[str, Path]) -> None:
    """The lab refuses what the plugin refuses under real SGLang 0.5.23 (tests/contract): with the production mamba flag
    and SGLang's default interval (256) budget 256 is too wide, until the interval is raised."""
    mamba = [*ddtree_args(16), "--mamba-radix-cache-strategy", "extra_buffer"]
    done = check(venvs["0.5.23-ddtree"], mamba, SGLANG_PLUGINS="ddtree", DDTREE_BUDGET="256")
    assert done.returncode == 2 and "mamba_track_interval 256 is below the verify width 257" in done.stderr
    assert "pass --mamba-track-interval 512" in done.stderr
    raised = check(venvs["0.5.23-ddtree"], [*mamba, "--mamba-track-interval", "512"], SGLANG_PLUGINS="ddtree",
                   DDTREE_BUDGET="256")
    assert raised.returncode == 0, raised.stderr


def test_the_api_key_comes_from_a_config_file(venvs: dict[str, Path], tmp_path: Path) -> None:
    config = tmp_path / "secrets.yaml"
    config.write_text("api-key: s3cret\n")
    assert check(venvs["0.5.23"], ["--model-path", str(TARGET), "--config", str(config)]).returncode == 0
    wrong = tmp_path / "secrets.env"
    wrong.write_text("api-key: s3cret\n")
    done = check(venvs["0.5.23"], ["--model-path", str(TARGET), "--config", str(wrong)])
    assert done.returncode == 2 and "Config file must be YAML format" in done.stderr


def test_the_lab_server_wheel_holds_its_package_and_needs_nothing_offline(wheels: Path) -> None:
    with zipfile.ZipFile(wheels / labserver_wheel_name()) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(next(name for name in names if name.endswith(".dist-info/METADATA"))).decode()
    package = {path.relative_to(LABSERVER).as_posix() for path in (LABSERVER / "pivot_labserver").glob("*.py")}
    assert package and package <= names
    assert not [name for name in names if name.startswith("tests/")]
    # pip installs the release venv's wheelhouse offline before ddtree_runtime: a dependency would not resolve
    assert "Requires-Dist" not in metadata


LAB_SERVER_ARGV = (
    "import json, sys\n"
    "from pivot_labserver.cli import parse_args\n"
    "from sglang.launch_server import labserver_argv\n"
    "from sglang.srt.server_args import prepare_server_args\n"
    "print(json.dumps(vars(parse_args(labserver_argv(prepare_server_args(sys.argv[1:]))))))\n"
)


MAMBA_FLAGS = [("0.5.11", "--mamba-scheduler-strategy"), ("0.5.23", "--mamba-radix-cache-strategy")]


@pytest.mark.parametrize(("release", "mamba_flag"), MAMBA_FLAGS)
def test_the_launcher_hands_the_installed_lab_server_the_checked_settings(
    venvs: dict[str, Path], release: str, mamba_flag: str
) -> None:
    args = [mamba_flag if a == "--mamba-scheduler-strategy" else a for a in USER_UNIT_ARGS]
    done = subprocess.run([str(venvs[release] / "bin" / "python"), "-c", LAB_SERVER_ARGV, *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    served = json.loads(done.stdout)
    assert (served["model_path"], served["tp_size"], served["port"]) == (str(TARGET), 2, 30000)
    assert (served["speculative_algorithm"], served["speculative_num_steps"]) == ("NEXTN", 3)
    # the lab server takes SGLang 0.5.23's flag names; 0.5.11's mamba flag has no counterpart there
    assert served["mamba_radix_cache_strategy"] == ("extra_buffer" if release == "0.5.23" else None)
