"""pivot.ops.cuda_toolchain with stand-in nvcc and nvidia-smi programs on PATH."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from ansible_collections.pivot.ops.plugins.module_utils import nvidia_smi
from ansible_collections.pivot.ops.plugins.modules import cuda_toolchain


def program(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setattr(cuda_toolchain, "DEFAULT_CUDA_BIN", str(tmp_path / "no-cuda"))
    return directory


NVCC = "echo 'nvcc: NVIDIA (R) Cuda compiler driver'; echo 'Cuda compilation tools, release 13.0, V13.0.88'\n"


def test_a_host_with_nvcc_and_two_blackwell_gpus_can_build(run_module, bin_dir: Path) -> None:
    program(bin_dir, "nvcc", NVCC)
    program(bin_dir, "nvidia-smi", "printf '12.0\\n12.0\\n'\n")
    result = run_module(cuda_toolchain.main, {})
    assert result["build_possible"] and result["why_not"] == ""
    assert result["nvcc"] == str(bin_dir / "nvcc")
    assert result["nvcc_release"] == "Cuda compilation tools, release 13.0, V13.0.88"
    assert result["compute_capabilities"] == ["12.0"] and result["arch_list"] == "12.0"
    assert result["changed"] is False


def test_the_toolkit_is_where_nvcc_says_it_is_not_beside_a_wrapper(run_module, bin_dir: Path) -> None:
    # this development machine's nvcc: /usr/local/bin/nvcc is `exec /usr/local/cuda-13.0/bin/nvcc "$@"`; torch's
    # guess from its place (/usr/local) linked -lcudart against /usr/local/lib64 and failed in the real build
    program(bin_dir, "nvcc", "case \"$1\" in --dryrun) echo '#$ _NVVM_BRANCH_=nvvm' >&2; "
                             "echo '#$ TOP=/opt/cuda-13.0/bin/..' >&2 ;; *) " + NVCC.strip() + " ;; esac\n")
    program(bin_dir, "nvidia-smi", "echo 9.0\n")
    result = run_module(cuda_toolchain.main, {})
    assert result["cuda_home"] == "/opt/cuda-13.0"
    assert result["nvcc_release"] == "Cuda compilation tools, release 13.0, V13.0.88"


def test_without_a_dry_run_answer_the_toolkit_is_above_the_real_nvcc(run_module, bin_dir: Path,
                                                                     tmp_path: Path) -> None:
    toolkit = tmp_path / "cuda-13.1"
    (toolkit / "bin").mkdir(parents=True)
    program(toolkit / "bin", "nvcc", NVCC)
    (bin_dir / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
    program(bin_dir, "nvidia-smi", "echo 9.0\n")
    assert run_module(cuda_toolchain.main, {})["cuda_home"] == str(toolkit)


def test_mixed_gpus_give_every_architecture(run_module, bin_dir: Path) -> None:
    program(bin_dir, "nvcc", NVCC)
    program(bin_dir, "nvidia-smi", "printf '9.0\\n12.0\\n'\n")
    assert run_module(cuda_toolchain.main, {})["arch_list"] == "12.0;9.0"


def test_nvcc_outside_path_is_found_in_the_search_paths(run_module, bin_dir: Path, tmp_path: Path) -> None:
    cuda = tmp_path / "cuda-13" / "bin"
    cuda.mkdir(parents=True)
    program(cuda, "nvcc", NVCC)
    program(bin_dir, "nvidia-smi", "echo 9.0\n")
    result = run_module(cuda_toolchain.main, {"search_paths": [str(cuda)]}, check_mode=True)
    assert result["nvcc"] == str(cuda / "nvcc") and result["build_possible"]


def test_without_nvcc_it_says_where_it_looked(run_module, bin_dir: Path) -> None:
    program(bin_dir, "nvidia-smi", "echo 9.0\n")
    result = run_module(cuda_toolchain.main, {})
    assert not result["failed"] and not result["build_possible"]
    assert result["nvcc"] is None and result["why_not"].startswith("no nvcc found (looked on PATH")


def test_a_driver_failure_is_reported_not_raised(run_module, bin_dir: Path) -> None:
    program(bin_dir, "nvcc", NVCC)
    program(bin_dir, "nvidia-smi", "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                   "driver.\"; exit 9\n")
    result = run_module(cuda_toolchain.main, {})
    assert not result["build_possible"] and "couldn't communicate with the NVIDIA driver" in result["why_not"]


def test_nvidia_smi_outside_path_is_found_where_the_driver_puts_it(run_module, bin_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    driver_bin = tmp_path / "nvidia" / "bin"
    driver_bin.mkdir(parents=True)
    program(bin_dir, "nvcc", NVCC)
    program(driver_bin, "nvidia-smi", "echo 9.0\n")
    monkeypatch.setattr(nvidia_smi, "SEARCH_DIRS", [str(driver_bin)])
    result = run_module(cuda_toolchain.main, {})
    assert result["build_possible"] and result["compute_capabilities"] == ["9.0"]


def test_without_nvidia_smi_it_says_where_it_looked(run_module, bin_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    program(bin_dir, "nvcc", NVCC)
    monkeypatch.setattr(nvidia_smi, "SEARCH_DIRS", [str(tmp_path / "nowhere")])
    result = run_module(cuda_toolchain.main, {})
    assert not result["failed"] and not result["build_possible"] and result["compute_capabilities"] == []
    # A phrase the roles put inside their own sentences: no full stop of its own.
    assert result["why_not"] == (f"nvidia-smi was not found on the PATH or in {tmp_path / 'nowhere'}. Install the "
                                 "NVIDIA driver utilities on this host, or set nvidia_smi (in Pivot's inventory: "
                                 "pivot_nvidia_smi_path)")


def test_an_nvidia_smi_path_that_is_not_executable_is_named(run_module, bin_dir: Path, tmp_path: Path) -> None:
    program(bin_dir, "nvcc", NVCC)
    (tmp_path / "nvidia-smi").write_text("not a program")
    result = run_module(cuda_toolchain.main, {"nvidia_smi": str(tmp_path / "nvidia-smi")})
    assert not result["failed"] and not result["build_possible"]
    assert result["why_not"].startswith(f"nvidia_smi {tmp_path / 'nvidia-smi'} does not exist or is not executable")


def test_nvcc_of_torch_s_major_cuda_version_can_build_against_it(run_module, bin_dir: Path) -> None:
    program(bin_dir, "nvcc", NVCC)
    program(bin_dir, "nvidia-smi", "echo 9.0\n")
    # 13.0 against a torch of CUDA 13.2: PyTorch only warns about a minor difference
    result = run_module(cuda_toolchain.main, {"torch_cuda": "13.2"})
    assert result["build_possible"] and result["why_not"] == ""
    assert result["nvcc_version"] == "13.0"


def test_nvcc_of_another_major_cuda_version_than_torch_s_cannot_build(run_module, bin_dir: Path) -> None:
    program(bin_dir, "nvcc", "echo 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    program(bin_dir, "nvidia-smi", "echo 12.0\n")
    result = run_module(cuda_toolchain.main, {"torch_cuda": "13.0"})
    assert not result["build_possible"]
    assert result["why_not"] == (f"{bin_dir / 'nvcc'} is CUDA 12.8, but the release's torch was built with CUDA 13.0, "
                                 "and PyTorch's extension build refuses a different major version")
    # without torch's version nothing is compared: the preflight's probe
    assert run_module(cuda_toolchain.main, {})["build_possible"]


def test_a_cpu_torch_or_an_unreadable_nvcc_cannot_build(run_module, bin_dir: Path) -> None:
    program(bin_dir, "nvidia-smi", "echo 9.0\n")
    program(bin_dir, "nvcc", NVCC)
    cpu = run_module(cuda_toolchain.main, {"torch_cuda": "cpu"})
    assert not cpu["build_possible"] and "CPU build" in cpu["why_not"]
    program(bin_dir, "nvcc", "echo 'nvcc: something else'\n")
    silent = run_module(cuda_toolchain.main, {"torch_cuda": "13.0"})
    assert not silent["build_possible"] and silent["nvcc_version"] is None
    assert "does not report its CUDA release" in silent["why_not"]
