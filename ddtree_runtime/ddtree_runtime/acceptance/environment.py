"""What the suite runs on: versions, GPU, and why it skips where it cannot run."""

from __future__ import annotations

import json
import platform
import subprocess
from typing import Any

PROBE = r"""
import importlib.metadata as md, json
info = {}
for name in ("sglang", "sglang-kernel", "torch", "flashinfer-python", "triton", "transformers", "tokenizers",
             "xgrammar", "ddtree_runtime"):
    try:
        info[name] = md.version(name)
    except md.PackageNotFoundError:
        info[name] = None
try:
    import torch
    info["cuda_available"] = torch.cuda.is_available()
    info["torch_cuda"] = torch.version.cuda
    info["gpu_count"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        info["gpu"] = f"{torch.cuda.get_device_name()} (sm_{major}{minor})"
except Exception as error:
    info["cuda_available"] = False
    info["torch_error"] = repr(error)
try:
    from ddtree_runtime import ops
    info["ddtree_kernels"] = ops.extension_available()
    info["ddtree_kernels_error"] = ops.extension_error()
except Exception as error:
    info["ddtree_kernels"] = False
    info["ddtree_kernels_error"] = repr(error)
print(json.dumps(info))
"""


def describe_environment(python: str, left_out: list[str]) -> dict[str, Any]:
    """Versions and GPU as the interpreter that runs the servers sees them (a subprocess: SGLang is not
    imported into the suite's own process)."""
    environment: dict[str, Any] = {"python": python, "platform": platform.platform(), "left_out": list(left_out)}
    try:
        probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        environment["probe_error"] = repr(error)
        return environment
    if probe.returncode != 0:
        environment["probe_error"] = probe.stderr[-2000:]
        return environment
    environment.update(json.loads(probe.stdout.strip().splitlines()[-1]))
    environment["nvidia_smi"] = _nvidia_smi()
    return environment


def _nvidia_smi() -> str | None:
    try:
        answer = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return answer.stdout.strip() or None


def skip_reason(environment: dict[str, Any], tp_size: int = 1) -> str | None:
    """Why the suite cannot run here, or None."""
    if "probe_error" in environment:
        return f"the server interpreter {environment['python']} could not be probed: {environment['probe_error']}"
    if not environment.get("cuda_available"):
        return "no CUDA GPU visible to torch " + (f"({environment['torch_error']})" if "torch_error" in environment
                                                  else f"(torch {environment.get('torch')})")
    if environment.get("sglang") is None:
        return f"SGLang is not installed for {environment['python']}"
    if environment.get("gpu_count", 1) < tp_size:
        return f"--tp-size {tp_size} needs {tp_size} GPUs; torch sees {environment.get('gpu_count')}"
    return None
