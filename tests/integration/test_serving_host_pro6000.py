"""pivot.ops.gpu_release and pivot.ops.stop_training on pro6000 over SSH, against the user's real sglang.service unit
(the lab's stand-in server holds memory on both fake RTX PRO 6000s while it runs). Every test leaves the unit running,
as it found it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import labctl
import pytest
from integration_lab import run_playbook, signals_by_pid

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

HOST = "pro6000"
UNIT = "sglang.service"
QUERY = "Query GPU memory"


def unit_property(name: str) -> str:
    result = labctl.ssh(HOST, f"systemctl show -p {name} --value {UNIT}")
    assert result.rc == 0, result.stderr
    return result.stdout.strip()


def smi_rows(query: str) -> list[list[str]]:
    result = labctl.ssh(HOST, f"nvidia-smi --query-{query} --format=csv,noheader,nounits")
    assert result.rc == 0, result.stderr
    return [[field.strip() for field in line.split(",")] for line in result.stdout.splitlines() if line.strip()]


def gpu_holders() -> set[tuple[int, int]]:
    """(pid, gpu index) of the compute processes nvidia-smi lists on pro6000, read without the modules under test."""
    index_of = {uuid: int(index) for index, uuid in smi_rows("gpu=index,uuid")}
    return {(int(pid), index_of[uuid]) for pid, uuid in smi_rows("compute-apps=pid,gpu_uuid")}


def cmdline_of(pid: int) -> str:
    result = labctl.ssh(HOST, f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert result.rc == 0, result.stderr
    return result.stdout.strip()


def wait_until_serving(timeout: float = 60) -> int:
    """Starts the unit if needed; returns its MainPID once it holds memory on both GPUs."""
    assert labctl.ssh(HOST, f"systemctl start {UNIT}").rc == 0
    deadline = time.monotonic() + timeout
    while True:
        main_pid = int(unit_property("MainPID"))
        if main_pid and gpu_holders() == {(main_pid, 0), (main_pid, 1)}:
            return main_pid
        assert time.monotonic() < deadline, f"{UNIT} does not hold both GPUs after {timeout}s"
        time.sleep(0.2)


@pytest.fixture
def sglang() -> Iterator[int]:
    """sglang.service running and holding both GPUs (yields its MainPID); running again after the test."""
    main_pid = wait_until_serving()
    yield main_pid
    wait_until_serving()


def gpu_release(**variables: object) -> tuple[int, dict]:
    run = run_playbook("gpu_release.yml", {"target": HOST, **variables})
    return run.rc, run.result(QUERY, HOST)


def test_facts_show_the_sglang_memory_on_both_gpus(sglang: int) -> None:
    rc, facts = gpu_release(gpu_expected_count=2)

    assert rc == 0, facts
    assert facts["changed"] is False
    assert [gpu["index"] for gpu in facts["gpus"]] == [0, 1]
    assert {gpu["name"] for gpu in facts["gpus"]} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert {(app["pid"], app["gpu_index"]) for app in facts["processes"]} == {(sglang, 0), (sglang, 1)}
    server_cmdline = cmdline_of(sglang)
    for app in facts["processes"]:
        assert app["visible"] is True and app["cmdline"] == server_cmdline and app["ppid"] == 1
        gpu = facts["gpus"][app["gpu_index"]]
        assert 0 < app["used_memory_mib"] <= gpu["memory_used_mib"] <= gpu["memory_total_mib"]
        assert gpu["memory_used_mib"] > 1024  # far above the release threshold
    assert facts["released"] is False


def test_release_check_fails_while_sglang_runs_and_passes_after_it_stops(sglang: int) -> None:
    rc, busy = gpu_release(gpu_state="released", release_timeout=1, release_poll_interval=0.2)

    assert rc != 0
    assert busy["failed"] is True and busy["released"] is False
    assert busy["attempts"] >= 2  # it polled until the timeout
    for index in (0, 1):
        assert f"GPU {index} (NVIDIA RTX PRO 6000 Blackwell Server Edition)" in busy["msg"]
    assert f"PID {sglang} {cmdline_of(sglang)!r}" in busy["msg"]
    # Its parent is PID 1 because systemd runs it, not because it was orphaned: the hint names the unit.
    assert f"main process of systemd unit {UNIT}: stop it with 'systemctl stop {UNIT}'" in busy["msg"]
    assert "probably an orphan" not in busy["msg"]

    assert labctl.ssh(HOST, f"systemctl stop {UNIT}").rc == 0
    rc, free = gpu_release(gpu_state="released", release_timeout=10, release_poll_interval=0.2)

    assert rc == 0, free
    assert free["released"] is True and free["processes"] == [] and free["problems"] == []
    assert all(gpu["memory_used_mib"] <= 1024 for gpu in free["gpus"])


def test_stop_training_by_unit_stops_the_real_systemd_unit(sglang: int) -> None:
    variables = {"target": HOST, "job_unit": UNIT, "job_gpus": [0, 1], "job_grace_period": 10}
    run = run_playbook("stop_training.yml", variables)

    assert run.rc == 0, run.stdout[-3000:]
    stopped = run.result("Stop the training job", HOST)
    assert stopped["changed"] is True
    assert [(entry["pid"], entry["matched_by"]) for entry in stopped["pids"]] == [(sglang, "selected")]
    assert f"systemctl stop {UNIT}" in stopped["planned"]
    assert "systemctl_stop" in stopped["timings"]
    assert stopped["remaining"] == [] and stopped["sigkill_needed"] is False
    assert "SIGKILL" not in str(signals_by_pid(stopped))
    assert unit_property("ActiveState") == "inactive"
    assert labctl.ssh(HOST, f"kill -0 {sglang}").rc != 0
    assert run.result("Wait until the job's GPUs are released", HOST)["released"] is True

    again = run_playbook("stop_training.yml", variables).result("Stop the training job", HOST)
    assert again["changed"] is False and again["pids"] == []
