"""The lab's nvidia-smi double against the real captures in tests/fixtures/nvidia-smi/."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from lab_doubles_support import (
    CAPTURE_MACHINE,
    CAPTURE_PID,
    CAPTURE_PROCESS_MIB,
    CAPTURE_UUID,
    FILES,
    NVIDIA_SMI,
    PYTHON,
    ProcessTracker,
    SmiEnvironment,
    capture_machine,
    fixture_text,
    proc_starttime,
    proc_state,
    wait_for,
)

GPU_QUERY = "--query-gpu=index,uuid,name,memory.used,memory.total,memory.free,utilization.gpu"
APPS_QUERY = "--query-compute-apps=pid,process_name,used_memory,gpu_uuid"
NOHEADER_NOUNITS = "--format=csv,noheader,nounits"


def start_holder(smi: SmiEnvironment, processes: ProcessTracker, gpus: str, *extra: str) -> subprocess.Popen:
    holder = processes.start(
        [PYTHON, "-m", "fake_gpu", "hold", "--gpus", gpus, *extra],
        env=smi.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = holder.stdout.readline()
    assert line.startswith("holding"), (line, holder.stderr.read() if holder.poll() is not None else "")
    return holder


def start_sleeper(processes: ProcessTracker) -> subprocess.Popen:
    return processes.start([PYTHON, "-c", "import time; time.sleep(600)"])


def with_pid(text: str, pid: int) -> str:
    """A capture's text with the captured PID replaced, keeping its column width."""
    return text.replace(f"{CAPTURE_PID:>16}", f"{pid:>16}").replace(f"{CAPTURE_PID}, ", f"{pid}, ")


def assert_plain_equals_capture(output: str, capture: str) -> None:
    produced, expected = output.split("\n"), capture.split("\n")
    assert produced[1:] == expected[1:]
    date_line = produced[0]
    assert len(date_line) == len(expected[0]) == 31
    assert date_line.endswith(" " * 7)
    parsed = time.strptime(date_line.rstrip(), "%a %b %d %H:%M:%S %Y")
    assert abs(time.mktime(parsed) - time.time()) < 120
    assert re.fullmatch(r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ 123]\d \d\d:\d\d:\d\d \d{4} {7}", date_line)


# --- byte-for-byte against the captures ----------------------------------------


def test_idle_gpu_query_matches_capture(smi):
    smi.configure(capture_machine())
    assert smi.smi_ok(GPU_QUERY, NOHEADER_NOUNITS) == fixture_text("smi_gpu_idle.csv")


def test_idle_compute_apps_is_empty_like_capture(smi):
    smi.configure(capture_machine())
    assert smi.smi_ok(APPS_QUERY, NOHEADER_NOUNITS) == fixture_text("smi_apps_idle.csv") == ""


def test_idle_plain_matches_capture(smi):
    smi.configure(capture_machine())
    assert_plain_equals_capture(smi.smi_ok(), fixture_text("smi_plain_idle.txt"))


def test_busy_outputs_match_captures(smi, processes):
    # The CSV capture was taken at a moment the GPU showed 0 % utilization, the plain one at 2 %.
    smi.configure(capture_machine(utilization_busy_pct=0))
    holder = start_holder(smi, processes, f"0:{CAPTURE_PROCESS_MIB}")
    assert smi.smi_ok(GPU_QUERY, NOHEADER_NOUNITS) == fixture_text("smi_gpu_busy.csv")
    header_query = ("--query-gpu=index,memory.used,memory.total", "--format=csv")
    assert smi.smi_ok(*header_query) == fixture_text("smi_gpu_busy_header.csv")
    assert smi.smi_ok(APPS_QUERY, NOHEADER_NOUNITS) == with_pid(fixture_text("smi_apps_busy.csv"), holder.pid)

    smi.configure(capture_machine(utilization_busy_pct=2))
    assert_plain_equals_capture(smi.smi_ok(), with_pid(fixture_text("smi_plain_busy.txt"), holder.pid))


def test_after_holder_exits_matches_capture(smi, processes):
    smi.configure(capture_machine())
    holder = start_holder(smi, processes, f"0:{CAPTURE_PROCESS_MIB}")
    holder.send_signal(signal.SIGTERM)
    holder.wait(timeout=10)
    query = ("--query-gpu=index,memory.used,memory.total", NOHEADER_NOUNITS)
    assert smi.smi_ok(*query) == fixture_text("smi_gpu_after.csv")


def test_used_free_reserved_are_rounded_separately_like_the_real_driver(smi, processes):
    smi.configure(capture_machine())
    idle = smi.smi_ok("--query-gpu=memory.used,memory.free,memory.reserved,memory.total", NOHEADER_NOUNITS)
    assert idle == "0, 143156, 615, 143771\n"
    start_holder(smi, processes, f"0:{CAPTURE_PROCESS_MIB}")
    busy = smi.smi_ok("--query-gpu=memory.used,memory.free,memory.reserved,memory.total", NOHEADER_NOUNITS)
    assert busy == "19601, 123556, 615, 143771\n"  # sums to 143772, as in the captures


# --- errors, exactly as errors.txt ---------------------------------------------


def error_cases() -> list[tuple[list[str], int, str]]:
    """(arguments, exit status, output) for each case documented in errors.txt."""
    cases = []
    for block in fixture_text("errors.txt").split("### ")[1:]:
        heading, output = block.split("\n", 1)
        command = heading.split("   ")[0].split()
        status = int(heading.rsplit("exit status", 1)[1])
        assert command[0] == "nvidia-smi"
        cases.append((command[1:], status, output.rstrip("\n") + "\n"))
    assert len(cases) == 3
    return cases


@pytest.mark.parametrize(("args", "status", "output"), error_cases(), ids=["bad-field", "bad-option", "no-gpu-7"])
def test_errors_match_capture(smi, args, status, output):
    smi.configure(capture_machine())
    result = smi.smi(*args)
    assert (result.returncode, result.stdout, result.stderr) == (status, output, "")


@pytest.mark.parametrize(
    "args",
    [["--bogus"], ["-Z"], ["--query-gpux=index", "--format=csv"], ["stray-word"]],
)
def test_unknown_options_fail_like_real_tool(smi, args):
    smi.configure(capture_machine())
    result = smi.smi(*args)
    assert result.returncode == 255
    assert result.stdout == f"ERROR: Option {args[0]} is not recognized. Please run 'nvidia-smi -h'.\n"


def test_invalid_compute_apps_field(smi):
    smi.configure(capture_machine())
    result = smi.smi("--query-compute-apps=pid,memory.used", "--format=csv")
    assert (result.returncode, result.stdout) == (2, 'Field "memory.used" is not a valid field to query.\n')


def test_invalid_field_reported_even_without_gpus(smi):
    smi.configure({**CAPTURE_MACHINE, "mode": "no-devices"})
    result = smi.smi("--query-gpu=index,bogus.field", "--format=csv")
    assert (result.returncode, result.stdout) == (2, 'Field "bogus.field" is not a valid field to query.\n')


def test_real_options_the_double_lacks_fail_loudly_on_stderr(smi):
    smi.configure(capture_machine())
    for option in ("-q", "--loop=1", "-x", "topo"):
        result = smi.smi(option)
        assert result.returncode == 3
        assert result.stdout == ""
        assert "not implemented" in result.stderr


@pytest.mark.parametrize(
    ("fmt", "message"),
    [(None, "'--format' is required"), ("--format=json", '"json" is not a valid format'),
     ("--format=noheader", '"noheader" is not a valid format')],
)
def test_bad_or_missing_format_is_an_error(smi, fmt, message):
    smi.configure(capture_machine())
    result = smi.smi("--query-gpu=index", *([fmt] if fmt else []))
    assert result.returncode == 2
    assert message in result.stdout


def test_missing_config_is_a_lab_error_not_a_gpu_answer(smi):
    result = smi.smi("--query-gpu=index", "--format=csv")
    assert result.returncode == 70
    assert result.stdout == ""
    assert "cannot read GPU config" in result.stderr


# --- failure modes --------------------------------------------------------------


@pytest.mark.parametrize("args", [[], ["-L"], ["--query-gpu=index", "--format=csv"], [APPS_QUERY, "--format=csv"]])
def test_no_devices_mode(smi, args):
    smi.configure({**CAPTURE_MACHINE, "mode": "no-devices"})
    result = smi.smi(*args)
    assert (result.returncode, result.stdout) == (6, "No devices were found\n")


@pytest.mark.parametrize("args", [[], ["-L"], ["--query-gpu=index", "--format=csv"], ["-i", "0"]])
def test_driver_failure_mode(smi, args):
    smi.configure({**CAPTURE_MACHINE, "mode": "driver-failure"})
    result = smi.smi(*args)
    assert result.returncode == 9
    assert result.stdout == (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )


def test_help_works_even_when_the_driver_fails(smi):
    smi.configure({**CAPTURE_MACHINE, "mode": "driver-failure"})
    for option in ("-h", "--help"):
        result = smi.smi(option)
        assert result.returncode == 0
        assert "--query-gpu=" in result.stdout
        assert "test double" in result.stdout


def test_empty_inventory_means_no_devices(smi):
    smi.configure({**CAPTURE_MACHINE, "gpus": []})
    result = smi.smi()
    assert (result.returncode, result.stdout) == (6, "No devices were found\n")


def test_mig_mode(smi, processes):
    smi.configure({**CAPTURE_MACHINE, "mode": "mig"})
    holder = start_holder(smi, processes, "0:4096")
    fields = smi.smi_ok("--query-gpu=mig.mode.current,utilization.gpu,memory.used", "--format=csv")
    assert fields == "mig.mode.current, utilization.gpu [%], memory.used [MiB]\nEnabled, [N/A], 4105 MiB\n"
    apps = smi.smi_ok("--query-compute-apps=pid,used_memory", "--format=csv")
    assert apps == f"pid, used_gpu_memory [MiB]\n{holder.pid}, [N/A]\n"
    assert smi.smi_ok("--query-compute-apps=used_memory", NOHEADER_NOUNITS) == "[N/A]\n"
    plain = smi.smi_ok().split("\n")
    assert plain[10] == "|                                         |                        |              Enabled |"
    assert plain[9].endswith("|     N/A      Default |")
    # Memory "N/A" sits where the real tool puts it (public 580-series outputs): 6 spaces after the name column.
    assert plain[18] == f"|    0     0    0{holder.pid:>16}      C   {'python3':<32}      N/A      |"


# --- fields, headers, units ------------------------------------------------------


ALL_GPU_FIELDS = (
    "index,uuid,name,memory.used,memory.total,memory.free,memory.reserved,utilization.gpu,utilization.memory,"
    "pci.bus_id,driver_version,count,compute_cap,persistence_mode,temperature.gpu,power.draw,power.limit,"
    "mig.mode.current,fan.speed,pstate,compute_mode"
)


def test_every_supported_gpu_field_with_header_and_units(smi):
    smi.configure(capture_machine())
    header, values = smi.smi_ok(f"--query-gpu={ALL_GPU_FIELDS}", "--format=csv").splitlines()
    assert header == (
        "index, uuid, name, memory.used [MiB], memory.total [MiB], memory.free [MiB], memory.reserved [MiB], "
        "utilization.gpu [%], utilization.memory [%], pci.bus_id, driver_version, count, compute_cap, "
        "persistence_mode, temperature.gpu, power.draw [W], power.limit [W], mig.mode.current, fan.speed [%], "
        "pstate, compute_mode"
    )
    assert values == (
        f"0, {CAPTURE_UUID}, NVIDIA H200, 0 MiB, 143771 MiB, 143156 MiB, 615 MiB, 0 %, 0 %, 00000000:00:06.0, "
        "580.159.04, 1, 9.0, Enabled, 36, 123.00 W, 700.00 W, Disabled, [N/A], P0, Default"
    )


def test_nounits_with_header_keeps_names_without_units(smi):
    smi.configure(capture_machine())
    out = smi.smi_ok("--query-gpu=memory.used,utilization.gpu,power.draw", "--format=csv,nounits")
    assert out == "memory.used, utilization.gpu, power.draw\n0, 0, 123.00\n"


def test_noheader_with_units(smi):
    smi.configure(capture_machine())
    assert smi.smi_ok("--query-gpu=memory.total,power.draw", "--format=csv,noheader") == "143771 MiB, 123.00 W\n"


def test_format_tokens_in_any_order_and_two_argument_forms(smi):
    smi.configure(capture_machine())
    reference = smi.smi_ok(GPU_QUERY, NOHEADER_NOUNITS)
    assert smi.smi_ok(GPU_QUERY, "--format=nounits,noheader,csv") == reference
    assert smi.smi_ok("--query-gpu", GPU_QUERY.split("=", 1)[1], "--format", "csv,noheader,nounits") == reference


def test_field_aliases_print_canonical_headers(smi):
    smi.configure(capture_machine())
    out = smi.smi_ok("--query-gpu=gpu_name,gpu_uuid,gpu_bus_id", "--format=csv")
    assert out.splitlines()[0] == "name, uuid, pci.bus_id"
    apps = smi.smi_ok("--query-compute-apps=pid,name,used_memory,gpu_bus_id,gpu_name", "--format=csv")
    assert apps == "pid, process_name, used_gpu_memory [MiB], gpu_bus_id, gpu_name\n"


def test_overrides_make_fields_not_available(smi):
    overrides = {"power.draw": "[N/A]", "power.limit": "[N/A]", "temperature.gpu": "[Not Supported]"}
    smi.configure(capture_machine(overrides=overrides))
    csv = smi.smi_ok("--query-gpu=power.draw,power.limit,temperature.gpu,index", "--format=csv,noheader")
    assert csv == "[N/A], [N/A], [Not Supported], 0\n"
    line = smi.smi_ok().split("\n")[9]
    # The real layout of unavailable power figures (public 580-series outputs): "N/A  /  N/A  ".
    assert line.startswith("| N/A   N/A    P0            N/A  /  N/A  |")


def test_overrides_can_set_plain_values(smi):
    smi.configure(capture_machine(overrides={"utilization.gpu": "57", "fan.speed": "30"}))
    assert smi.smi_ok("--query-gpu=utilization.gpu,fan.speed", "--format=csv,noheader") == "57 %, 30 %\n"
    assert smi.smi_ok().split("\n")[9].startswith("| 30%   36C    P0")


# --- selection and listing --------------------------------------------------------


def test_select_gpus_by_index_uuid_and_bus_id(smi):
    config = smi.use_profile("gpus-h200x8.json")
    query = ("--query-gpu=index,pci.bus_id", NOHEADER_NOUNITS)
    assert smi.smi_ok("-i", "2,5", *query) == "2, 00000000:3A:00.0\n5, 00000000:AB:00.0\n"
    assert smi.smi_ok("--id=3", *query) == "3, 00000000:5D:00.0\n"
    assert smi.smi_ok("-i7", *query) == "7, 00000000:DB:00.0\n"
    assert smi.smi_ok(f"--id={config['gpus'][4]['uuid']}", *query) == "4, 00000000:9A:00.0\n"
    assert smi.smi_ok("-i", "00000000:18:00.0", *query) == "0, 00000000:18:00.0\n"


@pytest.mark.parametrize("wanted", ["8", "1,8", "GPU-00000000-0000-0000-0000-000000000000"])
def test_missing_gpu_selection(smi, wanted):
    smi.use_profile("gpus-h200x8.json")
    result = smi.smi("-i", wanted, "--query-gpu=index", "--format=csv")
    assert (result.returncode, result.stdout) == (6, "No devices were found\n")


def test_plain_with_selection_shows_only_that_gpu_and_its_processes(smi, processes):
    smi.use_profile("gpus-h200x8.json")
    on_zero = start_holder(smi, processes, "0:1000")
    on_three = start_holder(smi, processes, "3:2000")
    plain = smi.smi_ok("-i", "3")
    assert "|   3  NVIDIA H200" in plain
    assert "|   0  NVIDIA H200" not in plain
    assert f"{on_three.pid:>16}" in plain
    assert f"{on_zero.pid:>16}" not in plain


def test_list_gpus(smi):
    config = smi.use_profile("gpus-h200x8.json")
    expected = "".join(f"GPU {i}: NVIDIA H200 (UUID: {g['uuid']})\n" for i, g in enumerate(config["gpus"]))
    assert smi.smi_ok("-L") == expected
    assert smi.smi_ok("--list-gpus", "-i", "1") == f"GPU 1: NVIDIA H200 (UUID: {config['gpus'][1]['uuid']})\n"


def test_count_is_the_number_of_gpus(smi):
    smi.use_profile("gpus-h200x8.json")
    assert smi.smi_ok("--query-gpu=count", NOHEADER_NOUNITS) == "8\n" * 8


# --- the lab's two GPU profiles ----------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "count", "name", "total"),
    [("gpus-h200x8.json", 8, "NVIDIA H200", 143771),
     ("gpus-pro6000x2.json", 2, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887)],
)
def test_lab_profiles(smi, profile, count, name, total):
    config = smi.use_profile(profile)
    gpus = config["gpus"]
    assert len({g["uuid"] for g in gpus}) == len({g["pci_bus_id"] for g in gpus}) == len(gpus) == count
    uuid_form = r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    assert all(re.fullmatch(uuid_form, g["uuid"]) for g in gpus)
    out = smi.smi_ok("--query-gpu=index,name,memory.used,memory.total", NOHEADER_NOUNITS)
    assert out == "".join(f"{i}, {name}, 0, {total}\n" for i in range(count))


def test_long_gpu_name_is_truncated_in_the_table_like_the_real_tool(smi):
    smi.use_profile("gpus-pro6000x2.json")
    lines = smi.smi_ok().split("\n")
    # Real 580-series layout for this GPU (public captures): the name is cut to 24 characters + "...".
    assert lines[8] == "|   0  NVIDIA RTX PRO 6000 Blac...    On  |   00000000:17:00.0 Off |                    0 |"
    assert lines[9] == "| N/A   27C    P0             65W /  600W |       0MiB /  97887MiB |      0%      Default |"
    assert all(len(line) == 91 for line in lines[1:-1] if line)


# --- memory follows live processes ---------------------------------------------


def test_memory_is_released_exactly_when_the_holder_is_killed(smi, processes):
    smi.use_profile("gpus-h200x8.json")
    holder = start_holder(smi, processes, "0:30000")
    assert smi.memory_used()[0] == 30009
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    # SIGKILL leaves the registration file behind; it no longer counts.
    assert (smi.state_dir / "procs" / f"{holder.pid}.json").exists()
    assert smi.memory_used() == [0] * 8
    assert smi.smi_ok("--query-compute-apps=pid", NOHEADER_NOUNITS) == ""


def test_a_zombie_holds_no_memory(smi, processes):
    smi.use_profile("gpus-h200x8.json")
    holder = start_holder(smi, processes, "1:5000")
    os.kill(holder.pid, signal.SIGKILL)
    wait_for(lambda: proc_state(holder.pid) == "Z", what="holder to become a zombie")
    assert smi.memory_used()[1] == 0  # not yet reaped, but the CUDA context is gone
    holder.wait(timeout=10)


def test_registration_with_wrong_starttime_does_not_count(smi, processes):
    """PID reuse: a record for an earlier process with this PID must not be charged to it."""
    smi.use_profile("gpus-h200x8.json")
    sleeper = start_sleeper(processes)
    procs = smi.state_dir / "procs"
    procs.mkdir(parents=True)
    record = {"pid": sleeper.pid, "starttime": proc_starttime(sleeper.pid) - 1, "name": "python3", "gpus": {"2": 7000}}
    (procs / f"{sleeper.pid}.json").write_text(json.dumps(record))
    assert smi.memory_used()[2] == 0
    record["starttime"] += 1
    (procs / f"{sleeper.pid}.json").write_text(json.dumps(record))
    assert smi.memory_used()[2] == 7009


def test_registration_of_a_pid_that_does_not_exist_is_ignored_and_garbage_collected(smi, processes):
    smi.use_profile("gpus-h200x8.json")
    live = start_holder(smi, processes, "0:100")
    procs = smi.state_dir / "procs"
    dead = {"pid": 4194303, "starttime": 1, "name": "ghost", "gpus": {"0": 100}}
    (procs / "4194303.json").write_text(json.dumps(dead))
    (procs / "garbage.json").write_text("{not json")
    assert smi.memory_used()[0] == 109
    result = smi.fake_gpu("gc")
    assert result.returncode == 0
    assert result.stdout.split() == ["4194303"]
    assert sorted(p.name for p in procs.iterdir()) == sorted([f"{live.pid}.json", "garbage.json"])


def test_process_on_two_gpus_appears_once_per_gpu(smi, processes):
    config = smi.use_profile("gpus-h200x8.json")
    holder = start_holder(smi, processes, "0:1024,1:2048")
    apps = smi.smi_ok("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id", NOHEADER_NOUNITS)
    uuids = [g["uuid"] for g in config["gpus"]]
    assert apps == (
        f"{holder.pid}, python3, 1024, {uuids[0]}, 00000000:18:00.0\n"
        f"{holder.pid}, python3, 2048, {uuids[1]}, 00000000:2A:00.0\n"
    )
    assert smi.memory_used()[:3] == [1033, 2057, 0]
    plain = smi.smi_ok()
    assert plain.count(f"{holder.pid:>16}      C   python3") == 2


def test_several_processes_on_one_gpu_each_add_context_overhead(smi, processes):
    smi.use_profile("gpus-h200x8.json")
    first = start_holder(smi, processes, "4:1000")
    second = start_holder(smi, processes, "4:1000", "--name", "/usr/bin/python3.11 -m sglang.launch_server")
    assert smi.memory_used()[4] == 2017  # 2 x (1000 + 8.6)
    apps = smi.smi_ok("-i", "4", "--query-compute-apps=pid,process_name", NOHEADER_NOUNITS)
    names = dict(line.split(", ", 1) for line in apps.splitlines())
    assert names == {str(first.pid): "python3", str(second.pid): "/usr/bin/python3.11 -m sglang.launch_server"}
    plain = smi.smi_ok("-i", "4")
    # Names longer than the 32-character column keep their tail, behind "..." (real behaviour).
    assert f"{second.pid:>16}      C   ...n3.11 -m sglang.launch_server       1000MiB |" in plain


def test_busy_gpu_reports_busy_utilization_and_power(smi, processes):
    smi.use_profile("gpus-h200x8.json")
    start_holder(smi, processes, "0:1000")
    out = smi.smi_ok("-i", "0,1", "--query-gpu=utilization.gpu,power.draw", NOHEADER_NOUNITS)
    assert out == "97, 412.36\n0, 121.07\n"


# --- fake_gpu registry helpers ----------------------------------------------------------


def test_hold_for_another_pid_and_release(smi, processes):
    smi.use_profile("gpus-h200x8.json")
    sleeper = start_sleeper(processes)
    result = smi.fake_gpu("hold", "--gpus", "6:512", "--pid", str(sleeper.pid), "--name", "trainer")
    assert result.returncode == 0, result.stderr
    assert smi.smi_ok("--query-compute-apps=pid,process_name,used_memory", NOHEADER_NOUNITS) == (
        f"{sleeper.pid}, trainer, 512\n"
    )
    assert smi.fake_gpu("release", "--pid", str(sleeper.pid)).returncode == 0
    assert smi.memory_used()[6] == 0
    assert smi.fake_gpu("release", "--pid", str(sleeper.pid)).returncode == 1


def test_registration_file_has_exactly_the_documented_format(smi, processes):
    smi.use_profile("gpus-h200x8.json")
    holder = start_holder(smi, processes, "0:10,5:20")
    record = json.loads((smi.state_dir / "procs" / f"{holder.pid}.json").read_text())
    assert record == {"pid": holder.pid, "starttime": proc_starttime(holder.pid), "name": "python3",
                      "gpus": {"0": 10, "5": 20}}


def test_registration_beyond_free_memory_is_out_of_memory(smi, processes):
    smi.use_profile("gpus-pro6000x2.json")
    start_holder(smi, processes, "1:90000")
    sleeper = start_sleeper(processes)
    result = smi.fake_gpu("hold", "--gpus", "1:8000", "--pid", str(sleeper.pid))
    assert result.returncode == 1
    assert "CUDA out of memory on GPU 1" in result.stderr
    assert smi.fake_gpu("hold", "--gpus", "0:8000", "--pid", str(sleeper.pid)).returncode == 0
    missing = smi.fake_gpu("hold", "--gpus", "2:8", "--pid", str(sleeper.pid))
    assert (missing.returncode, "GPU 2 does not exist" in missing.stderr) == (1, True)


@pytest.mark.parametrize("spec", ["0", "x:5", "0:-5", "0:"])
def test_hold_rejects_bad_gpu_specs(smi, spec):
    smi.use_profile("gpus-h200x8.json")
    result = smi.fake_gpu("hold", "--gpus", spec, "--pid", "1")
    assert result.returncode == 2
    assert "bad GPU spec" in result.stderr


def test_registering_a_dead_pid_fails(smi):
    smi.use_profile("gpus-h200x8.json")
    result = smi.fake_gpu("hold", "--gpus", "0:5", "--pid", "4194303")
    assert (result.returncode, "does not exist" in result.stderr) == (1, True)


def test_inventory_with_unknown_keys_is_rejected(smi):
    smi.configure(capture_machine(colour="green"))
    result = smi.smi()
    assert result.returncode == 70
    assert "unknown keys ['colour']" in result.stderr


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="the shebang needs Debian's /usr/bin/python3")
def test_runs_as_an_executable_through_its_shebang(smi):
    smi.configure(capture_machine())
    result = subprocess.run([str(NVIDIA_SMI), "-L"], env=smi.env, capture_output=True, text=True, check=False)
    assert (result.returncode, result.stdout) == (0, f"GPU 0: NVIDIA H200 (UUID: {CAPTURE_UUID})\n")
    assert os.access(NVIDIA_SMI, os.X_OK)
    assert FILES.joinpath("fake_gpu.py").is_file()
