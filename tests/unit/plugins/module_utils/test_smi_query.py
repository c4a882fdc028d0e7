# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The nvidia-smi runner against a fake module: finding the program, the compute-capability query (the GPU and
process queries are tested through gpu_release with the real captures), and failures worded once."""

from __future__ import annotations

import pytest
from ansible_collections.pivot.ops.plugins.module_utils.nvidia_smi import (
    CSV_FORMAT,
    SEARCH_DIRS,
    SmiError,
    SmiQuery,
    find_nvidia_smi,
)

SMI = "/usr/bin/nvidia-smi"
DRIVER_FAILURE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
                  "latest NVIDIA driver is installed and running.\n")


class FakeModule:
    """``get_bin_path`` finds ``found`` (or nothing); ``run_command`` gives ``answer`` or raises it."""

    def __init__(self, found: str | None = SMI, answer=(0, "", "")) -> None:
        self.found = found
        self.answer = answer
        self.lookups = []
        self.calls = []

    def get_bin_path(self, name: str, required: bool = False, opt_dirs: list | None = None) -> str | None:
        self.lookups.append((name, required, opt_dirs))
        return self.found

    def run_command(self, cmd: list) -> tuple:
        self.calls.append(cmd)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


# --- finding nvidia-smi -------------------------------------------------------------------------------------------

def test_by_default_it_is_looked_up_on_the_path_and_in_the_driver_directories():
    module = FakeModule()
    assert find_nvidia_smi(module, None, "nvidia_smi_path") == SMI
    assert module.lookups == [("nvidia-smi", False, SEARCH_DIRS)]


def test_a_name_is_looked_up_the_same_way():
    module = FakeModule(found="/opt/nvidia/bin/nvidia-smi")
    assert find_nvidia_smi(module, "nvidia-smi", "nvidia_smi") == "/opt/nvidia/bin/nvidia-smi"


def test_not_found_says_where_it_looked_and_which_option_to_set():
    with pytest.raises(SmiError) as raised:
        find_nvidia_smi(FakeModule(found=None), None, "nvidia_smi_path")
    looked = ", ".join(SEARCH_DIRS)
    assert str(raised.value) == (f"nvidia-smi was not found on the PATH or in {looked}. Install the NVIDIA driver "
                                 "utilities on this host, or set nvidia_smi_path (in Pivot's inventory: "
                                 "pivot_nvidia_smi_path).")


def test_a_path_is_taken_as_it_is_when_it_is_executable(tmp_path):
    program = tmp_path / "nvidia-smi"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    module = FakeModule(found=None)
    assert find_nvidia_smi(module, str(program), "nvidia_smi_path") == str(program)
    assert module.lookups == []


@pytest.mark.parametrize("mode", [None, 0o644])
def test_a_path_that_is_missing_or_not_executable_is_refused(tmp_path, mode):
    program = tmp_path / "nvidia-smi"
    if mode is not None:
        program.write_text("#!/bin/sh\n")
        program.chmod(mode)
    with pytest.raises(SmiError) as raised:
        find_nvidia_smi(FakeModule(), str(program), "nvidia_smi")
    assert str(raised.value) == (f"nvidia_smi {program} does not exist or is not executable; point it at the "
                                 "nvidia-smi binary.")


def test_for_module_runs_the_found_program_and_reports_one_that_cannot_run():
    module = FakeModule(answer=PermissionError(13, "Permission denied"))
    query = SmiQuery.for_module(module, None, "nvidia_smi_path")
    with pytest.raises(SmiError) as raised:
        query.gpus()
    assert str(raised.value) == f"Cannot run {SMI}: [Errno 13] Permission denied. Check nvidia_smi_path."
    assert module.calls[0][0] == SMI


# --- compute capabilities -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("stdout", "expected"), [
    ("12.0\n12.0\n", ["12.0"]),
    ("9.0\n12.0\n9.0\n", ["12.0", "9.0"]),
    ("\n 9.0 \n", ["9.0"]),
])
def test_compute_capabilities(stdout, expected):
    module = FakeModule(answer=(0, stdout, ""))
    assert SmiQuery.for_module(module, None, "nvidia_smi").compute_capabilities() == expected
    assert module.calls == [[SMI, "--query-gpu=compute_cap", CSV_FORMAT]]


@pytest.mark.parametrize(("answer", "message"), [
    ((9, DRIVER_FAILURE, ""), "nvidia-smi cannot communicate with the NVIDIA driver (exit 9): NVIDIA-SMI has failed"),
    ((0, DRIVER_FAILURE, ""), "nvidia-smi cannot communicate with the NVIDIA driver (exit 9)"),
    ((6, "No devices were found\n", ""), "nvidia-smi found no GPUs (exit 6: No devices were found). Check that"),
    ((0, "No devices were found\n", ""), "nvidia-smi found no GPUs (exit 0: No devices were found)."),
    ((2, 'Field "compute_cap" is not a valid field to query.\n', ""),
     'nvidia-smi failed (exit 2): Field "compute_cap" is not a valid field to query.'),
    ((0, "[N/A]\n", ""), "nvidia-smi reported no compute capability ([N/A]). Check 'nvidia-smi --query-gpu="),
    ((0, "", ""), "nvidia-smi reported no compute capability (no output)."),
])
def test_compute_capabilities_failures(answer, message):
    with pytest.raises(SmiError) as raised:
        SmiQuery.for_module(FakeModule(answer=answer), None, "nvidia_smi").compute_capabilities()
    assert str(raised.value).startswith(message)
    assert raised.value.cmd == [SMI, "--query-gpu=compute_cap", CSV_FORMAT]
