#!/usr/bin/python
# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_release
short_description: Report GPU memory and compute processes, or wait until GPUs are released
version_added: 0.1.0
description:
  - Runs C(nvidia-smi --query-gpu) and C(nvidia-smi --query-compute-apps) in CSV mode and returns one entry per GPU
    and per compute process, with the process's command line read from C(/proc) when it is visible.
  - With O(state=released), polls until every selected GPU uses at most O(max_used_mib) and holds no compute process
    other than the allowed ones. On timeout the task fails and its message names every process still holding memory,
    with its command line and memory, and points out orphans (processes whose parent is PID 1 and that are not the
    main process of a systemd service; for those it names the service to stop instead).
  - Values that nvidia-smi reports as C([N/A]) or C([Not Supported]) are returned as null. Under MIG, per-process
    memory is not reported; a GPU whose memory use is unknown is judged by its compute processes alone, with a warning.
  - Read-only; check mode runs the same queries.
author:
  - Pivot developers (@pivot)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; check mode runs it normally, including the wait.
  diff_mode:
    support: none
  platform:
    platforms: linux
    details: Needs the NVIDIA driver's C(nvidia-smi) on the target.
options:
  state:
    description:
      - V(present) returns the facts once.
      - V(released) waits until the selected GPUs are released (see O(max_used_mib), O(allowed_pids),
        O(allowed_process_names)) or O(timeout) passes.
    type: str
    choices: [present, released]
    default: present
  gpus:
    description:
      - Indexes of the GPUs to check (as nvidia-smi numbers them). All GPUs when empty.
      - An index that nvidia-smi does not list fails the task.
    type: list
    elements: int
    default: []
  max_used_mib:
    description:
      - Highest memory use, in MiB, at which a GPU counts as released. The driver and persistence mode keep a small
        baseline, so zero is rarely right; measure the idle value per host.
    type: int
    default: 1024
  allowed_pids:
    description:
      - Compute processes with these PIDs do not keep a GPU from counting as released.
    type: list
    elements: int
    default: []
  allowed_process_names:
    description:
      - Compute processes with these names (as nvidia-smi prints them, or their base name) do not keep a GPU from
        counting as released.
    type: list
    elements: str
    default: []
  expected_count:
    description:
      - Number of GPUs nvidia-smi must list; any other number fails the task. V(0) accepts a host without GPUs.
      - Without it, a host where nvidia-smi finds no GPU fails the task.
    type: int
  timeout:
    description:
      - Seconds to wait with O(state=released).
    type: float
    default: 300
  poll_interval:
    description:
      - Seconds between two queries with O(state=released).
    type: float
    default: 5
  nvidia_smi_path:
    description:
      - Path of the nvidia-smi binary. By default it is searched on the PATH and in the usual system directories.
    type: path
notes:
  - nvidia-smi in a container can list PIDs of another PID namespace. The module only reports a command line when the
    local process with that PID has the name nvidia-smi reports; otherwise the process is marked as not visible.
seealso:
  - module: pivot.ops.stop_training
"""

EXAMPLES = r"""
- name: Read GPU memory facts
  pivot.ops.gpu_release:
  register: gpu

- name: Show memory per GPU
  ansible.builtin.debug:
    msg: "{{ gpu.gpus | map(attribute='memory_used_mib') | list }}"

- name: Preflight, the serving host must have exactly two GPUs
  pivot.ops.gpu_release:
    expected_count: 2

- name: Wait until GPUs 0 and 1 are free after stopping the trainer
  pivot.ops.gpu_release:
    state: released
    gpus: [0, 1]
    max_used_mib: 1024
    timeout: 120
    poll_interval: 2

- name: Released except for a monitoring agent that keeps a small context
  pivot.ops.gpu_release:
    state: released
    allowed_process_names:
      - dcgm-exporter
"""

RETURN = r"""
gpus:
  description: One entry per GPU nvidia-smi lists (all GPUs, not only the selected ones).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: GPU index.
      type: int
    uuid:
      description: GPU UUID.
      type: str
    name:
      description: Product name.
      type: str
    memory_used_mib:
      description: Memory in use, MiB; null when nvidia-smi reports it as unavailable.
      type: int
    memory_total_mib:
      description: Total memory, MiB; null when unavailable.
      type: int
    memory_free_mib:
      description: Free memory, MiB; null when unavailable.
      type: int
    utilization_gpu_percent:
      description: GPU utilisation in percent; null when unavailable.
      type: int
  sample:
    - {index: 0, uuid: GPU-1d5ec48f-8bbb-2444-2058-2e30e4383e79, name: NVIDIA H200, memory_used_mib: 19601,
       memory_total_mib: 143771, memory_free_mib: 123556, utilization_gpu_percent: 0}
processes:
  description: One entry per compute process and GPU (a process using two GPUs appears twice).
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID as nvidia-smi reports it.
      type: int
    name:
      description: Process name as nvidia-smi reports it.
      type: str
    used_memory_mib:
      description: GPU memory the process uses, MiB; null under MIG or when unavailable.
      type: int
    gpu_uuid:
      description: UUID of the GPU.
      type: str
    gpu_index:
      description: Index of the GPU; null if the UUID is not among the listed GPUs (for example a MIG device).
      type: int
    cmdline:
      description: Command line from C(/proc); null when the process is not visible here.
      type: str
    ppid:
      description: Parent PID from C(/proc); V(1) suggests an orphan. Null when not visible.
      type: int
    visible:
      description: Whether the process was found in this host's C(/proc) under the name nvidia-smi reports.
      type: bool
  sample:
    - {pid: 419, name: python3, used_memory_mib: 19592, gpu_uuid: GPU-1d5ec48f-8bbb-2444-2058-2e30e4383e79,
       gpu_index: 0, cmdline: python3 train.py, ppid: 1, visible: true}
selected:
  description: Indexes of the GPUs the checks applied to.
  returned: always
  type: list
  elements: int
  sample: [0, 1]
released:
  description: Whether the selected GPUs were released at the last query (always computed).
  returned: always
  type: bool
  sample: true
problems:
  description: Why the selected GPUs are not released, one sentence per GPU; empty when released.
  returned: always
  type: list
  elements: str
  sample: []
attempts:
  description: How many times nvidia-smi was queried.
  returned: always
  type: int
  sample: 1
elapsed:
  description: Seconds spent, including waiting.
  returned: always
  type: float
  sample: 0.12
rc:
  description: Exit status of the failing nvidia-smi call.
  returned: when nvidia-smi fails
  type: int
  sample: 9
stdout:
  description: Output of the failing nvidia-smi call.
  returned: when nvidia-smi fails
  type: str
  sample: "No devices were found"
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pivot.ops.plugins.module_utils.nvidia_smi import (
    SmiError,
    SmiQuery,
    release_problems,
    select_gpus,
)
from ansible_collections.pivot.ops.plugins.module_utils.procfs import ProcFS, service_of_cgroup
from ansible_collections.pivot.ops.plugins.module_utils.systemd_unit import SystemdError, SystemdUnit

PROC_ROOT = "/proc"


class GpuMemory:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.started = time.monotonic()
        self.attempts = 0
        self.warned = set()
        self.proc = ProcFS(PROC_ROOT)
        self.services = {}  # pid -> systemd service it is the main process of, or None
        try:
            self.query = SmiQuery.for_module(module, self.params["nvidia_smi_path"], "nvidia_smi_path", self.proc)
        except SmiError as exc:
            module.fail_json(msg=str(exc))

    def service_of(self, pid: int) -> str | None:
        """The systemd service whose main process ``pid`` is, so that a failure message does not call a service an
        orphan (both have parent PID 1). Asked once per PID; None without systemd."""
        if pid not in self.services:
            self.services[pid] = None
            service = service_of_cgroup(self.proc.cgroup(pid))
            try:
                if service and SystemdUnit(self.module, service).main_pid() == pid:
                    self.services[pid] = service
            except SystemdError:
                pass  # without systemctl, or when it fails, the process is described without its service
        return self.services[pid]

    def snapshot(self) -> dict:
        self.attempts += 1
        gpus = self.query.gpus()
        self.check_count(gpus)
        selected = select_gpus(gpus, self.params["gpus"])
        processes = self.query.apps(gpus) if gpus else []
        for gpu in selected:
            if gpu["memory_used_mib"] is None and gpu["index"] not in self.warned:
                self.warned.add(gpu["index"])
                self.module.warn(
                    "nvidia-smi does not report memory use for GPU %s (%s); it is judged by its compute processes only."
                    % (gpu["index"], gpu["name"])
                )
        problems = release_problems(
            selected,
            processes,
            self.params["max_used_mib"],
            self.params["allowed_pids"],
            self.params["allowed_process_names"],
            service_of=self.service_of,
        )
        return {
            "gpus": gpus,
            "processes": processes,
            "selected": [gpu["index"] for gpu in selected],
            "released": not problems,
            "problems": problems,
        }

    def check_count(self, gpus: list) -> None:
        expected = self.params["expected_count"]
        if expected is None:
            if not gpus:
                raise SmiError(
                    "nvidia-smi lists no GPUs. Check that the GPUs are passed through to this host or container; set "
                    "expected_count=0 if a host without GPUs is expected."
                )
            return
        if len(gpus) != expected:
            raise SmiError(
                "Expected %d GPU(s) but nvidia-smi lists %d (%s)."
                % (expected, len(gpus), ", ".join("%s %s" % (gpu["index"], gpu["name"]) for gpu in gpus) or "none")
            )

    def result(self, facts: dict) -> dict:
        facts.update(changed=False, attempts=self.attempts, elapsed=round(time.monotonic() - self.started, 3))
        return facts

    def run(self) -> None:
        try:
            facts = self.snapshot()
            if self.params["state"] == "released":
                facts = self.wait_released(facts)
        except SmiError as exc:
            details = {key: value for key, value in exc.details().items() if value not in (None, "", [])}
            self.module.fail_json(msg=str(exc), attempts=self.attempts, **details)
        self.module.exit_json(**self.result(facts))

    def wait_released(self, facts: dict) -> dict:
        deadline = self.started + self.params["timeout"]
        while not facts["released"]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.module.fail_json(
                    msg="GPU(s) %s not released after %gs: %s. Stop the processes named here (for an orphan: "
                    "'kill <pid>'), then check 'nvidia-smi'."
                    % (
                        ", ".join(str(index) for index in facts["selected"]),
                        self.params["timeout"],
                        " | ".join(facts["problems"]),
                    ),
                    **self.result(facts),
                )
            time.sleep(min(self.params["poll_interval"], remaining))
            facts = self.snapshot()
        return facts


def argument_spec() -> dict:
    return dict(
        state=dict(type="str", choices=["present", "released"], default="present"),
        gpus=dict(type="list", elements="int", default=[]),
        max_used_mib=dict(type="int", default=1024),
        allowed_pids=dict(type="list", elements="int", default=[]),
        allowed_process_names=dict(type="list", elements="str", default=[]),
        expected_count=dict(type="int"),
        timeout=dict(type="float", default=300),
        poll_interval=dict(type="float", default=5),
        nvidia_smi_path=dict(type="path"),
    )


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    for name in ("timeout", "poll_interval", "max_used_mib"):
        if module.params[name] < 0:
            module.fail_json(msg="%s must not be negative, got %s." % (name, module.params[name]))
    GpuMemory(module).run()


if __name__ == "__main__":
    main()
