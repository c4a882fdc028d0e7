"""Build hook: the CUDA extension ``ddtree_runtime._C`` is compiled only when ``DDTREE_BUILD_CUDA=1``.

``TORCH_CUDA_ARCH_LIST`` (for example ``9.0`` for H200, ``12.0`` for RTX PRO 6000 Blackwell) selects the GPU
architectures; torch's extension builder reads it. Without ``DDTREE_BUILD_CUDA=1`` this is a pure-Python
package and neither torch's build helpers nor CUDA are imported. Metadata lives in pyproject.toml.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from setuptools import setup

CSRC = Path("csrc")
SOURCES = ["ops.cpp", "topk.cu", "tree.cu", "verify.cu"]


def cuda_build_requested() -> bool:
    return os.environ.get("DDTREE_BUILD_CUDA", "0") == "1"


def extension_options() -> dict[str, Any]:
    if not cuda_build_requested():
        return {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: PLC0415 - only for CUDA builds

    extension = CUDAExtension(
        name="ddtree_runtime._C",
        sources=[str(CSRC / name) for name in SOURCES],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--expt-relaxed-constexpr"]},
    )
    return {"ext_modules": [extension], "cmdclass": {"build_ext": BuildExtension}}


setup(**extension_options())
