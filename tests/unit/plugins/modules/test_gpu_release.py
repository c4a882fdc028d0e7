# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpu_release with run_command mocked: real H200 captures from tests/fixtures/nvidia-smi/, plus constructed odd cases
(each labelled) for outputs the captures do not cover."""

from __future__ import annotations

import pytest
from ansible_collections.pivot.ops.plugins.module_utils.nvidia_smi import parse_int, parse_rows
from ansible_collections.pivot.ops.plugins.modules import gpu_release

SMI = "/usr/bin/nvidia-smi"
UUID = "GPU-1d5ec48f-8bbb-2444-2058-2e30e4383e79"
DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
    "driver is installed and running.\n"
)


class FakeSmi:
    """Answers the two queries with scripted (rc, stdout) pairs; the last pair repeats."""

    def __init__(self, gpu_answers: list, app_answers: list) -> None:
        self.gpu_answers = list(gpu_answers)
        self.app_answers = list(app_answers)
        self.calls = []

    @staticmethod
    def _next(answers: list) -> tuple:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def __call__(self, cmd: list) -> tuple:
        self.calls.append(cmd)
        query = cmd[1]
        if query.startswith("--query-gpu="):
            rc, out = self._next(self.gpu_answers)
        elif query.startswith("--query-compute-apps="):
            rc, out = self._next(self.app_answers)
        else:
            raise AssertionError(f"unexpected nvidia-smi call {cmd}")
        return rc, out, ""


@pytest.fixture
def fake_proc(tmp_path, monkeypatch):
    """A fake /proc holding PID 419 (the python3 process of the busy capture), an orphan whose parent is PID 1."""
    root = tmp_path / "proc"

    def add(pid: int, comm: str, argv: list, ppid: int = 1) -> None:
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(
            f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99\n"
        )
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")

    root.mkdir()
    monkeypatch.setattr(gpu_release, "PROC_ROOT", str(root))
    add(419, "python3", ["python3", "/root/train/train_dflash_pipeline.py", "--config", "a.yaml"])
    return add


@pytest.fixture
def smi(monkeypatch):
    def install(gpu_answers: list, app_answers: list | None = None, binary: str | None = SMI) -> FakeSmi:
        fake = FakeSmi(gpu_answers, app_answers or [(0, "")])
        monkeypatch.setattr(gpu_release.AnsibleModule, "run_command", lambda self, cmd, **kwargs: fake(cmd))
        monkeypatch.setattr(gpu_release.AnsibleModule, "get_bin_path", lambda self, *a, **k: binary)
        monkeypatch.setattr(gpu_release.time, "sleep", lambda seconds: None)
        return fake

    return install


def test_idle_capture_facts(run_module, smi, smi_fixture, fake_proc):
    fake = smi([(0, smi_fixture("smi_gpu_idle.csv"))], [(0, smi_fixture("smi_apps_idle.csv"))])
    result = run_module(gpu_release.main, {})
    assert result["failed"] is False, result["msg"]
    assert result["changed"] is False
    assert result["gpus"] == [
        {
            "index": 0,
            "uuid": UUID,
            "name": "NVIDIA H200",
            "memory_used_mib": 0,
            "memory_total_mib": 143771,
            "memory_free_mib": 143156,
            "utilization_gpu_percent": 0,
        }
    ]
    assert result["processes"] == []
    assert result["released"] is True
    assert result["selected"] == [0]
    assert fake.calls == [
        [SMI, "--query-gpu=index,uuid,name,memory.used,memory.total,memory.free,utilization.gpu",
         "--format=csv,noheader,nounits"],
        [SMI, "--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader,nounits"],
    ]  # fmt: skip


def test_busy_capture_processes_with_cmdline(run_module, smi, smi_fixture, fake_proc):
    smi([(0, smi_fixture("smi_gpu_busy.csv"))], [(0, smi_fixture("smi_apps_busy.csv"))])
    result = run_module(gpu_release.main, {}, check_mode=True)
    assert result["failed"] is False
    assert result["gpus"][0]["memory_used_mib"] == 19601
    assert result["gpus"][0]["memory_free_mib"] == 123556
    assert result["processes"] == [
        {
            "pid": 419,
            "name": "python3",
            "used_memory_mib": 19592,
            "gpu_uuid": UUID,
            "gpu_index": 0,
            "cmdline": "python3 /root/train/train_dflash_pipeline.py --config a.yaml",
            "ppid": 1,
            "visible": True,
        }
    ]
    assert result["released"] is False


def test_released_times_out_naming_the_orphan(run_module, smi, smi_fixture, fake_proc):
    smi([(0, smi_fixture("smi_gpu_busy.csv"))], [(0, smi_fixture("smi_apps_busy.csv"))])
    result = run_module(gpu_release.main, {"state": "released", "timeout": 0, "gpus": [0]})
    assert result["failed"] is True
    msg = result["msg"]
    assert "GPU(s) 0 not released" in msg
    assert "uses 19601 MiB (limit 1024 MiB)" in msg
    assert "PID 419 'python3 /root/train/train_dflash_pipeline.py --config a.yaml' (19592 MiB)" in msg
    assert "parent is PID 1" in msg
    assert "kill 419" in msg
    assert "nvidia-smi" in msg
    assert result["processes"][0]["pid"] == 419


def test_released_after_the_job_exits(run_module, smi, smi_fixture, fake_proc):
    fake = smi(
        [(0, smi_fixture("smi_gpu_busy.csv")), (0, smi_fixture("smi_gpu_idle.csv"))],
        [(0, smi_fixture("smi_apps_busy.csv")), (0, smi_fixture("smi_apps_idle.csv"))],
    )
    result = run_module(gpu_release.main, {"state": "released", "timeout": 60, "poll_interval": 0.01})
    assert result["failed"] is False, result["msg"]
    assert result["released"] is True
    assert result["attempts"] == 2
    assert len(fake.calls) == 4


def test_allowed_process_and_threshold(run_module, smi, smi_fixture, fake_proc):
    smi([(0, smi_fixture("smi_gpu_busy.csv"))], [(0, smi_fixture("smi_apps_busy.csv"))])
    by_pid = run_module(gpu_release.main, {"state": "released", "allowed_pids": [419], "max_used_mib": 20000})
    assert by_pid["failed"] is False, by_pid["msg"]
    by_name = run_module(
        gpu_release.main, {"state": "released", "allowed_process_names": ["python3"], "max_used_mib": 20000}
    )
    assert by_name["failed"] is False, by_name["msg"]
    over_threshold = run_module(
        gpu_release.main, {"state": "released", "allowed_pids": [419], "max_used_mib": 100, "timeout": 0}
    )
    assert over_threshold["failed"] is True
    assert "uses 19601 MiB (limit 100 MiB)" in over_threshold["msg"]
    assert "fuser -v /dev/nvidia*" in over_threshold["msg"]


def test_process_from_another_pid_namespace_is_not_attributed(run_module, smi, smi_fixture, fake_proc):
    # Constructed: nvidia-smi reports PID 77 as python3, but local PID 77 is an unrelated sshd.
    fake_proc(77, "sshd", ["sshd: root@pts/0"])
    smi(
        [(0, smi_fixture("smi_gpu_busy.csv"))],
        [(0, f"77, python3, 19592, {UUID}\n")],
    )
    result = run_module(gpu_release.main, {"state": "released", "timeout": 0})
    assert result["failed"] is True
    assert result["processes"][0]["visible"] is False
    assert result["processes"][0]["cmdline"] is None
    assert "PID 77 python3 (19592 MiB), not visible in this PID namespace" in result["msg"]


def test_header_and_after_captures_parse_with_units(smi_fixture):
    lines = smi_fixture("smi_gpu_busy_header.csv").splitlines()
    fields = ("index", "memory.used", "memory.total")
    rows = parse_rows("\n".join(lines[1:]), fields, [])
    assert [parse_int(rows[0][key]) for key in fields] == [0, 19601, 143771]
    after = parse_rows(smi_fixture("smi_gpu_after.csv"), fields, [])
    assert [parse_int(after[0][key]) for key in fields] == [0, 0, 143771]


def test_unavailable_fields_are_null_with_a_warning(run_module, smi, fake_proc):
    # Constructed: memory fields reported as [N/A] and utilisation as [Not Supported].
    gpu_line = f"0, {UUID}, NVIDIA H200, [N/A], [N/A], [N/A], [Not Supported]\n"
    smi([(0, gpu_line)], [(0, "")])
    result = run_module(gpu_release.main, {"state": "released"})
    assert result["failed"] is False, result["msg"]
    gpu = result["gpus"][0]
    assert gpu["memory_used_mib"] is None
    assert gpu["memory_total_mib"] is None
    assert gpu["utilization_gpu_percent"] is None
    assert any("does not report memory use for GPU 0" in warning for warning in result["warnings"])


def test_mig_processes_without_memory_still_block_release(run_module, smi, smi_fixture, fake_proc):
    # Constructed: under MIG per-process memory is [N/A]; one process sits on a MIG device UUID nvidia-smi does not
    # list as a GPU.
    apps = f"419, python3, [N/A], {UUID}\n512, python3, [N/A], MIG-5a1c7e2d-0000-1111-2222-333344445555\n"
    smi([(0, smi_fixture("smi_gpu_idle.csv"))], [(0, apps)])
    result = run_module(gpu_release.main, {"state": "released", "timeout": 0})
    assert result["failed"] is True
    assert [app["used_memory_mib"] for app in result["processes"]] == [None, None]
    assert result["processes"][1]["gpu_index"] is None
    assert "memory not reported" in result["msg"]
    assert "MIG-5a1c7e2d-0000-1111-2222-333344445555" in result["msg"]


def test_no_devices_fails_unless_expected(run_module, smi):
    # Constructed from errors.txt: nvidia-smi prints "No devices were found" and exits 6.
    smi([(6, "No devices were found\n")])
    result = run_module(gpu_release.main, {})
    assert result["failed"] is True
    assert "lists no GPUs" in result["msg"]
    none_expected = run_module(gpu_release.main, {"expected_count": 0})
    assert none_expected["failed"] is False, none_expected["msg"]
    assert none_expected["gpus"] == []


def test_driver_failure_is_reported_with_rc(run_module, smi):
    # Constructed: the driver-communication failure, exit 9.
    smi([(9, DRIVER_FAILURE)])
    result = run_module(gpu_release.main, {})
    assert result["failed"] is True
    assert "cannot communicate with the NVIDIA driver (exit 9)" in result["msg"]
    assert "lsmod | grep nvidia" in result["msg"]
    assert result["rc"] == 9
    assert result["stdout"] == DRIVER_FAILURE


def test_invalid_field_error_from_capture(run_module, smi, smi_fixture):
    errors = smi_fixture("errors.txt").splitlines()
    message = errors[errors.index(next(line for line in errors if "bogus.field --format" in line)) + 1]
    smi([(2, message + "\n")])
    result = run_module(gpu_release.main, {})
    assert result["failed"] is True
    assert result["msg"] == f"nvidia-smi failed (exit 2): {message}"
    assert result["rc"] == 2


def test_missing_binary(run_module, smi, tmp_path):
    smi([(0, "")], binary=None)
    result = run_module(gpu_release.main, {})
    assert result["failed"] is True
    assert "nvidia-smi was not found" in result["msg"]
    explicit = run_module(gpu_release.main, {"nvidia_smi_path": str(tmp_path / "nvidia-smi")})
    assert explicit["failed"] is True
    assert "does not exist or is not executable" in explicit["msg"]


def test_unknown_gpu_index_and_count_mismatch(run_module, smi, smi_fixture):
    smi([(0, smi_fixture("smi_gpu_idle.csv"))])
    missing = run_module(gpu_release.main, {"gpus": [0, 3]})
    assert missing["failed"] is True
    assert missing["msg"].startswith("GPU index 3 not found; nvidia-smi lists 0.")
    wrong_count = run_module(gpu_release.main, {"expected_count": 2})
    assert wrong_count["failed"] is True
    assert "Expected 2 GPU(s) but nvidia-smi lists 1 (0 NVIDIA H200)" in wrong_count["msg"]


def test_malformed_output_is_an_error_not_a_traceback(run_module, smi):
    # Constructed: a line with too few fields (for example an older nvidia-smi that ignores a field).
    smi([(0, "0, GPU-x, NVIDIA H200, 10\n")])
    result = run_module(gpu_release.main, {})
    assert result["failed"] is True
    assert "printed a line with 4 fields where 7" in result["msg"]


def test_multi_gpu_selection(run_module, smi, fake_proc):
    # Constructed: two GPUs (the serving host's shape); GPU 1 is busy, GPU 0 is idle.
    gpus = (
        "0, GPU-aaaa, NVIDIA RTX PRO 6000 Blackwell Server Edition, 3, 97887, 97395, 0\n"
        "1, GPU-bbbb, NVIDIA RTX PRO 6000 Blackwell Server Edition, 40000, 97887, 57398, 90\n"
    )
    smi([(0, gpus)], [(0, "419, python3, 39990, GPU-bbbb\n")])
    only_zero = run_module(gpu_release.main, {"state": "released", "gpus": [0]})
    assert only_zero["failed"] is False, only_zero["msg"]
    assert only_zero["selected"] == [0]
    both = run_module(gpu_release.main, {"state": "released", "timeout": 0})
    assert both["failed"] is True
    assert "GPU 1 (NVIDIA RTX PRO 6000 Blackwell Server Edition) uses 40000 MiB" in both["msg"]
    assert "GPU 0 (" not in both["msg"]
    assert both["processes"][0]["gpu_index"] == 1


@pytest.mark.parametrize("case", [
    # PID 419 is the unit's main process: a service to stop, not an orphan.
    ("MainPID=419\n", "/usr/bin/systemctl", "main process of systemd unit trainer.service: stop it with "
                                            "'systemctl stop trainer.service'"),
    # Another process is the unit's main one: 419 is a leftover in its cgroup.
    ("MainPID=77\n", "/usr/bin/systemctl", "parent is PID 1: probably an orphan of a stopped job; stop it with "
                                           "'kill 419'"),
    # No systemctl on the host: the process is described without its service.
    ("", None, "parent is PID 1: probably an orphan of a stopped job"),
])
def test_a_holder_in_a_service_cgroup_is_named_by_its_unit(run_module, monkeypatch, smi_fixture, fake_proc, case):
    """Constructed: PID 419 of the busy capture lives in trainer.service's cgroup; systemctl says whose main PID."""
    main_pid, systemctl, expected = case
    with open(f"{gpu_release.PROC_ROOT}/419/cgroup", "w") as handle:
        handle.write("0::/system.slice/trainer.service\n")
    fake = FakeSmi([(0, smi_fixture("smi_gpu_busy.csv"))], [(0, smi_fixture("smi_apps_busy.csv"))])
    calls = []

    def run_command(self, cmd, **kwargs):
        if cmd[0] == SMI:
            return fake(cmd)
        calls.append(cmd)
        return 0, main_pid, ""

    monkeypatch.setattr(gpu_release.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(gpu_release.AnsibleModule, "get_bin_path",
                        lambda self, name, *a, **k: SMI if name == "nvidia-smi" else systemctl)
    result = run_module(gpu_release.main, {"state": "released", "timeout": 0})
    assert result["failed"] is True
    assert expected in result["msg"]
    assert calls == ([[systemctl, "show", "-p", "MainPID", "trainer.service"]] if systemctl else [])
