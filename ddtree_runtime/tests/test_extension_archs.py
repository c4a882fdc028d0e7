"""The CUDA sources compile for every GPU architecture Pivot serves on (nvcc and a CUDA build of torch only).

The H200 (sm_90) runs the kernel tests; the RTX PRO 6000 Blackwell (sm_120) is not at hand, so its build is proven
here by compiling each source for it, as the release's build on that host would.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

CSRC = Path(__file__).parents[1] / "csrc"
ARCHITECTURES = {"H200": "90", "RTX PRO 6000 Blackwell": "120"}


def torch_cuda_include_dirs() -> list[str] | None:
    """torch's include directories with its CUDA headers, or None for a torch built without CUDA."""
    if torch.version.cuda is None:
        return None
    try:
        dirs = cpp_extension.include_paths(device_type="cuda")
    except TypeError:  # torch before 2.6 names the argument cuda
        dirs = cpp_extension.include_paths(cuda=True)
    return [str(d) for d in dirs]


NVCC = shutil.which("nvcc")
INCLUDE_DIRS = torch_cuda_include_dirs()
pytestmark = pytest.mark.skipif(
    NVCC is None or INCLUDE_DIRS is None, reason="needs nvcc and a CUDA build of torch (its headers)"
)


def nvcc_compile_only(source: Path, arch: str, output: Path) -> subprocess.Popen[str]:
    includes = [f"-I{d}" for d in [*(INCLUDE_DIRS or []), sysconfig.get_paths()["include"]]]
    command = [
        str(NVCC), "-c", str(source), "-o", str(output), *includes, "-DTORCH_EXTENSION_NAME=_C",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", "-std=c++20", "-O3",
        "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", "-gencode", f"arch=compute_{arch},code=sm_{arch}",
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("gpu", sorted(ARCHITECTURES))
def test_every_cuda_source_compiles_for_the_gpu(gpu: str, tmp_path: Path) -> None:
    arch = ARCHITECTURES[gpu]
    sources = sorted(CSRC.glob("*.cu"))
    assert sources, f"no CUDA sources under {CSRC}"
    builds = {source.name: nvcc_compile_only(source, arch, tmp_path / f"{source.stem}.o") for source in sources}
    failures = {}
    for name, process in builds.items():
        output, _unused = process.communicate(timeout=1200)
        if process.returncode != 0:
            failures[name] = output[-3000:]
    assert not failures, f"sm_{arch} ({gpu}) build failed: {failures}"
    assert all((tmp_path / f"{source.stem}.o").stat().st_size > 0 for source in sources)
