#!/usr/bin/python
# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: cuda_toolchain
short_description: Find the CUDA compiler and the GPUs' compute capabilities (what a CUDA extension build needs)
version_added: 0.1.0
description:
  - Looks for C(nvcc) on C(PATH), in C(/usr/local/cuda/bin) and in O(search_paths), reads its release line, and asks
    C(nvidia-smi) for every GPU's compute capability.
  - Returns C(build_possible) and the C(TORCH_CUDA_ARCH_LIST) value for the GPUs found, so the preflight and the
    release venv's build decide from one probe. Only reads; never fails because something is missing (the caller
    decides whether that matters).
  - Given O(torch_cuda), the CUDA version the torch to build against was made with, a build is possible only with an
    C(nvcc) of the same major version, since PyTorch's extension build refuses any other (a different minor version
    only warns), and finding that out after a multi-GB offline install is late.
author:
  - Pivot developers (@pivot)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only; it runs the same in check mode.
  diff_mode:
    support: none
  platform:
    platforms: linux
options:
  search_paths:
    description: Further directories to look for C(nvcc) in, after C(PATH) and C(/usr/local/cuda/bin).
    type: list
    elements: path
    default: []
  nvidia_smi:
    description: The C(nvidia-smi) to ask.
    type: str
    default: nvidia-smi
  torch_cuda:
    description:
      - C(torch.version.cuda) of the torch the extension is built against (V(13.0)), or V(cpu) for a CPU build of
        torch, which cannot build it at all. Unset, the versions are not compared.
    type: str
"""

EXAMPLES = r"""
- name: Find the CUDA toolchain
  pivot.ops.cuda_toolchain:
  register: cuda

- name: Find a toolchain that can build against a torch made with CUDA 13.0
  pivot.ops.cuda_toolchain:
    torch_cuda: "13.0"
  register: cuda

- name: Build the extension for the GPUs found
  ansible.builtin.command:
    argv: [/opt/venv/bin/pip, install, ./ddtree_runtime]
  environment:
    DDTREE_BUILD_CUDA: "1"
    TORCH_CUDA_ARCH_LIST: "{{ cuda.arch_list }}"
    PATH: "{{ cuda.nvcc | dirname }}:/usr/bin:/bin"
  when: cuda.build_possible
"""

RETURN = r"""
nvcc:
  description: Path of the first C(nvcc) found; null when there is none.
  returned: always
  type: str
  sample: /usr/local/cuda/bin/nvcc
cuda_home:
  description:
    - The CUDA toolkit C(nvcc) belongs to, as nvcc itself reports it (C(TOP) of a C(--dryrun)), for C(CUDA_HOME).
      PyTorch's extension build links C(CUDA_HOME/lib64), and without C(CUDA_HOME) guesses it from where C(nvcc) is
      found, which is wrong for a wrapper script or a symlink outside the toolkit (C(/usr/local/bin/nvcc)).
    - Two directories above the resolved C(nvcc) when the dry run says nothing; null without nvcc.
  returned: always
  type: str
  sample: /usr/local/cuda-13.0
nvcc_release:
  description: C(nvcc --version)'s release line; null without nvcc.
  returned: always
  type: str
  sample: Cuda compilation tools, release 13.0, V13.0.88
nvcc_version:
  description: The CUDA version C(nvcc) reports (C(major.minor) of its release line); null without nvcc.
  returned: always
  type: str
  sample: "13.0"
compute_capabilities:
  description: The distinct compute capabilities of the GPUs, as nvidia-smi prints them.
  returned: always
  type: list
  elements: str
  sample: ["12.0"]
arch_list:
  description: The value for C(TORCH_CUDA_ARCH_LIST) (the capabilities joined with C(;)).
  returned: always
  type: str
  sample: "12.0"
build_possible:
  description:
    - Whether nvcc and at least one GPU compute capability were found (and, with O(torch_cuda), nvcc's major CUDA
      version is torch's).
  returned: always
  type: bool
why_not:
  description: Why a build is not possible (empty when it is).
  returned: always
  type: str
  sample: no nvcc found (looked on PATH, in /usr/local/cuda/bin)
"""

import os
import re
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pivot.ops.plugins.module_utils.nvidia_smi import SmiError, SmiQuery

DEFAULT_CUDA_BIN = "/usr/local/cuda/bin"


def find_nvcc(search_paths: list) -> str | None:
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path
    for directory in [DEFAULT_CUDA_BIN, *search_paths]:
        candidate = os.path.join(directory, "nvcc")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def release_line(module: AnsibleModule, nvcc: str) -> str | None:
    rc, out, _err = module.run_command([nvcc, "--version"])
    lines = [line.strip() for line in out.splitlines() if "release" in line]
    return lines[0] if rc == 0 and lines else None


def toolkit_root(module: AnsibleModule, nvcc: str) -> str:
    """Where the toolkit is: nvcc's own ``TOP`` (it sees through wrapper scripts), else two levels above the real
    file (``.../bin/nvcc``)."""
    _rc, out, err = module.run_command([nvcc, "--dryrun", "-c", "pivot-probe.cu", "-o", os.devnull])
    for line in (out + "\n" + err).splitlines():
        match = re.match(r"#\$ TOP=(.+)$", line.strip())
        if match:
            return os.path.normpath(match.group(1).strip())
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def release_version(release: str | None) -> str | None:
    """``13.0`` from ``Cuda compilation tools, release 13.0, V13.0.88``."""
    match = re.search(r"release (\d+)\.(\d+)", release or "")
    return f"{match.group(1)}.{match.group(2)}" if match else None


def torch_mismatch(nvcc: str, nvcc_version: str | None, torch_cuda: str | None) -> str:
    """Why this nvcc cannot build against that torch ("" when it can, or when nothing is to be compared)."""
    if not torch_cuda:
        return ""
    if torch_cuda == "cpu":
        return "the release's torch is a CPU build, which cannot build CUDA extensions"
    if nvcc_version is None:
        return f"{nvcc} does not report its CUDA release, so it cannot be matched to torch's CUDA {torch_cuda}"
    if nvcc_version.split(".")[0] != torch_cuda.split(".")[0]:
        return (f"{nvcc} is CUDA {nvcc_version}, but the release's torch was built with CUDA {torch_cuda}, and "
                "PyTorch's extension build refuses a different major version")
    return ""


def compute_capabilities(module: AnsibleModule, nvidia_smi: str) -> tuple[list, str]:
    """(the capabilities, why there are none). ``why_not`` is a phrase the roles put inside their own sentences, so
    without the final full stop."""
    try:
        return SmiQuery.for_module(module, nvidia_smi, "nvidia_smi").compute_capabilities(), ""
    except SmiError as exc:
        return [], str(exc).rstrip(".")


def run_module() -> None:
    module = AnsibleModule(
        argument_spec={"search_paths": {"type": "list", "elements": "path", "default": []},
                       "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
                       "torch_cuda": {"type": "str"}},
        supports_check_mode=True,
    )
    nvcc = find_nvcc(module.params["search_paths"])
    release = release_line(module, nvcc) if nvcc else None
    capabilities, smi_problem = compute_capabilities(module, module.params["nvidia_smi"])
    looked = ", ".join(["PATH", DEFAULT_CUDA_BIN, *module.params["search_paths"]])
    if nvcc is None:
        why_not = f"no nvcc found (looked on {looked})"
    else:
        why_not = torch_mismatch(nvcc, release_version(release), module.params["torch_cuda"]) or smi_problem
    module.exit_json(
        changed=False, nvcc=nvcc, cuda_home=toolkit_root(module, nvcc) if nvcc else None,
        nvcc_release=release, nvcc_version=release_version(release),
        compute_capabilities=capabilities, arch_list=";".join(capabilities), build_possible=not why_not,
        why_not=why_not,
    )


def main() -> None:
    run_module()


if __name__ == "__main__":
    main()
