"""The release_venv role's controller and host scripts: wheelhouse inspection and the pruning policy."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

FILES = Path(__file__).resolve().parents[3] / "roles" / "release_venv" / "files"
WHEELHOUSE = FILES / "wheelhouse.py"
PRUNE = FILES / "prune.py"


def run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60, check=False)


TORCH_VERSION_PY = "__version__ = '2.14.1+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\nhip = None\n"


def wheel(directory: Path, name: str, members: dict[str, str] | None = None) -> Path:
    path = directory / name
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.txt", name)
        for member, text in (members or {}).items():
            archive.writestr(member, text)
    return path


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    for name in ("sglang-0.5.23-py3-none-any.whl", "pip-26.3-py3-none-any.whl",
                 "Flash_Attn-2.0-1-cp312-cp312-linux_x86_64.whl"):
        wheel(tmp_path, name)
    wheel(tmp_path, "torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl", {"torch/version.py": TORCH_VERSION_PY})
    (tmp_path / "requirements.txt").write_text("# the release\nsglang==0.5.23\ntorch==2.14.1\nflash-attn==2.0\n")
    return tmp_path


def test_inspect_describes_a_complete_wheelhouse(wheelhouse: Path) -> None:
    done = run(WHEELHOUSE, "inspect", str(wheelhouse))
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["sglang_version"] == "0.5.23"
    assert info["python_tags"] == ["cp312"]
    assert info["pip_wheel"] == "pip-26.3-py3-none-any.whl"
    assert info["files"] == 4 and len(info["id"]) == 16
    assert info["torch_cuda"] == "13.0"


def test_inspect_says_a_cpu_torch_cannot_build_the_extension_and_refuses_a_fake_torch(wheelhouse: Path) -> None:
    torch = wheelhouse / "torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    wheel(wheelhouse, torch.name, {"torch/version.py": TORCH_VERSION_PY.replace("'13.0'", "None")})
    assert json.loads(run(WHEELHOUSE, "inspect", str(wheelhouse)).stdout)["torch_cuda"] == "cpu"
    wheel(wheelhouse, torch.name)
    done = run(WHEELHOUSE, "inspect", str(wheelhouse))
    assert done.returncode == 1
    assert f"{torch.name} is not a PyTorch wheel" in done.stderr


def test_abi3_wheels_do_not_make_an_older_python_fit(wheelhouse: Path) -> None:
    # the real lock's wheelhouse (2026-12-06): cp36-abi3 psutil, cp310-abi3 sglang-kernel, cp311-abi3 cryptography
    # beside cp312-only torch made python_tags cp310..cp312, so a Python 3.11 host passed the role's interpreter check
    # and failed only in the offline install ("No matching distribution found for torch==2.14.1")
    for name in ("psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
                 "sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl",
                 "cryptography-50.0.2-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
                 "interegular-0.3.3-py37-none-any.whl", "six-1.17.0-py2.py3-none-any.whl"):
        wheel(wheelhouse, name)
    lock = wheelhouse / "requirements.txt"
    lock.write_text(lock.read_text() + "psutil==7.2.2\nsglang-kernel==0.4.10\ncryptography==50.0.2\n"
                    "interegular==0.3.3\nsix==1.17.0\n")
    assert json.loads(run(WHEELHOUSE, "inspect", str(wheelhouse)).stdout)["python_tags"] == ["cp312"]


def test_a_wheelhouse_of_pure_and_abi3_wheels_names_no_python(tmp_path: Path) -> None:
    for name in ("pip-26.3-py3-none-any.whl", "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl"):
        wheel(tmp_path, name)
    (tmp_path / "requirements.txt").write_text("pip==26.3\nprotobuf==7.36.2\n")
    assert json.loads(run(WHEELHOUSE, "inspect", str(tmp_path)).stdout)["python_tags"] == []


def test_a_wheelhouse_no_one_python_can_install_is_refused(wheelhouse: Path) -> None:
    wheel(wheelhouse, "numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.whl")
    wheel(wheelhouse, "tml_renderers-0.1.0-cp313-abi3-manylinux2014_x86_64.whl")
    lock = wheelhouse / "requirements.txt"
    lock.write_text(lock.read_text() + "numpy==2.3.5\n")
    done = run(WHEELHOUSE, "inspect", str(wheelhouse))
    assert done.returncode == 1
    assert "no one CPython can install all of its wheels (cp311 only: numpy; cp312 only: flash-attn, torch)" in (
        done.stderr)
    # a second numpy for cp312 makes it fit again; an unpinned abi3 wheel from 3.13 on is not installed, so no matter
    wheel(wheelhouse, "numpy-2.3.5-cp312-cp312-manylinux_2_27_x86_64.whl")
    assert json.loads(run(WHEELHOUSE, "inspect", str(wheelhouse)).stdout)["python_tags"] == ["cp312"]


def test_inspect_lists_what_a_ship_copies_the_lock_first_with_sizes(wheelhouse: Path) -> None:
    info = json.loads(run(WHEELHOUSE, "inspect", str(wheelhouse)).stdout)
    shipped = info["shipped_files"]
    assert shipped[0]["name"] == "requirements.txt"
    assert sorted(entry["name"] for entry in shipped[1:]) == sorted(path.name for path in wheelhouse.glob("*.whl"))
    assert all(entry["bytes"] == (wheelhouse / entry["name"]).stat().st_size for entry in shipped)
    assert sum(entry["bytes"] for entry in shipped[1:]) == info["bytes"]


def test_the_id_changes_with_any_wheel(wheelhouse: Path) -> None:
    before = json.loads(run(WHEELHOUSE, "inspect", str(wheelhouse)).stdout)["id"]
    with zipfile.ZipFile(wheelhouse / "sglang-0.5.23-py3-none-any.whl", "a") as archive:
        archive.writestr("y.txt", "changed")
    assert json.loads(run(WHEELHOUSE, "inspect", str(wheelhouse)).stdout)["id"] != before


def test_a_pinned_package_without_its_wheel_is_named(wheelhouse: Path) -> None:
    (wheelhouse / "torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl").unlink()
    done = run(WHEELHOUSE, "inspect", str(wheelhouse))
    assert done.returncode == 1 and "lacks wheels for torch==2.14.1" in done.stderr


def test_a_wheelhouse_without_pip_cannot_bootstrap_a_venv(wheelhouse: Path) -> None:
    (wheelhouse / "pip-26.3-py3-none-any.whl").unlink()
    done = run(WHEELHOUSE, "inspect", str(wheelhouse))
    assert done.returncode == 1 and "no pip wheel" in done.stderr


def test_inspect_names_the_oldest_glibc_the_host_may_have(wheelhouse: Path) -> None:
    # the torch wheel's manylinux_2_28 is the newest need; linux_x86_64 and any say nothing about glibc
    assert json.loads(run(WHEELHOUSE, "inspect", str(wheelhouse)).stdout)["glibc"] == "2.28"
    wheel(wheelhouse, "nvidia_cuda_cupti-13.0.85-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")
    assert json.loads(run(WHEELHOUSE, "inspect", str(wheelhouse)).stdout)["glibc"] == "2.28"
    wheel(wheelhouse, "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl")
    assert json.loads(run(WHEELHOUSE, "inspect", str(wheelhouse)).stdout)["glibc"] == "2.34"


def load_wheelhouse_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wheelhouse", WHEELHOUSE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_download_platforms_are_every_manylinux_tag_up_to_the_hosts_glibc() -> None:
    # NVIDIA's CUDA 13 wheels are tagged only manylinux_2_25; a list with gaps made pip miss them
    # (the real build of 2026-12-04: "No matching distribution found for nvidia-cuda-cupti==13.0.85")
    tags = load_wheelhouse_module().linux_platforms("2.34")
    assert [f"manylinux_2_{minor}_x86_64" for minor in range(5, 35)] == tags[:30]
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "any"} <= set(tags)
    assert "manylinux_2_35_x86_64" not in tags
    assert "manylinux2014_x86_64" not in load_wheelhouse_module().linux_platforms("2.12")


@pytest.mark.parametrize("bad", ["2", "2.x", "3.1", "glibc 2.36"])
def test_a_malformed_glibc_is_refused_by_name(tmp_path: Path, bad: str) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text("pip==26.3\n")
    done = run(WHEELHOUSE, "build", str(lock), str(tmp_path / "wh"), "--python-version", "3.12", "--glibc", bad)
    assert done.returncode == 1 and f"glibc version {bad!r} must look like 2.34" in done.stderr


def test_a_directory_without_requirements_is_not_a_wheelhouse(tmp_path: Path) -> None:
    done = run(WHEELHOUSE, "inspect", str(tmp_path))
    assert done.returncode == 1 and "has no requirements.txt" in done.stderr and "wheelhouse.py build" in done.stderr


def test_a_lock_line_that_pins_nothing_is_refused(wheelhouse: Path) -> None:
    (wheelhouse / "requirements.txt").write_text("sglang>=0.5\n")
    done = run(WHEELHOUSE, "inspect", str(wheelhouse))
    assert done.returncode == 1 and "must pin one package as name==version" in done.stderr


def venv(root: Path, name: str, completed_at: float | None, wheelhouse: str = "wh1") -> Path:
    path = root / "venvs" / name
    (path / "bin").mkdir(parents=True)
    if completed_at is not None:
        marker = path / "pivot-release.json"
        marker.write_text(json.dumps({"id": name, "wheelhouse_id": wheelhouse}))
        os.utime(marker, (completed_at, completed_at))
    return path


def test_prune_keeps_the_newest_and_the_protected_and_their_wheelhouses(tmp_path: Path) -> None:
    old = venv(tmp_path, "a-old", 1000, "wh-old")
    middle = venv(tmp_path, "b-middle", 2000, "wh1")
    new = venv(tmp_path, "c-new", 3000, "wh2")
    in_use = venv(tmp_path, "d-in-use", 500, "wh-in-use")
    half_built = venv(tmp_path, "e-half", None)
    for name in ("wh-old", "wh1", "wh2", "wh-in-use", "wh-orphan"):
        (tmp_path / "wheelhouse" / name).mkdir(parents=True)
    done = run(PRUNE, str(tmp_path), "2", "--protect", str(in_use))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result["kept"]) == {str(in_use), str(new), str(middle)}
    assert set(result["removed"]) == {str(old), str(half_built), str(tmp_path / "wheelhouse" / "wh-old"),
                                      str(tmp_path / "wheelhouse" / "wh-orphan")}
    assert not old.exists() and not half_built.exists() and in_use.exists() and new.exists()
    assert sorted(p.name for p in (tmp_path / "wheelhouse").iterdir()) == ["wh-in-use", "wh1", "wh2"]


def test_prune_dry_run_removes_nothing(tmp_path: Path) -> None:
    old = venv(tmp_path, "a-old", 1000)
    venv(tmp_path, "b-new", 2000)
    result = json.loads(run(PRUNE, str(tmp_path), "1", "--dry-run").stdout)
    assert result["removed"] == [str(old)] and old.exists()


def test_prune_of_a_fresh_host_does_nothing(tmp_path: Path) -> None:
    assert json.loads(run(PRUNE, str(tmp_path / "missing"), "3").stdout) == {"removed": [], "kept": []}
