# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""SystemdUnit, the one runner of systemctl, journalctl and systemd-run, against a fake module: the commands it
builds, what it makes of their answers, and its failures (unit missing, command failing, program missing)."""

from __future__ import annotations

import pytest
from ansible_collections.pivot.ops.plugins.module_utils.systemd_unit import (
    STATE_PROPERTIES,
    SystemdError,
    SystemdUnit,
    UnitStatus,
    parse_systemctl_show,
    service_name,
)

UNIT = "trainer.service"
RUNNING = ("LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nNRestarts=0\nMainPID=4242\n"
           "ExecMainStatus=0\nControlGroup=/system.slice/trainer.service\n")


class FakeModule:
    """``get_bin_path`` finds the programs in ``installed``; ``run_command`` answers from ``answers`` (keyed by the
    program's name and its first argument) and records every command."""

    def __init__(self, answers: dict | None = None, installed: tuple = ("systemctl", "journalctl", "systemd-run")):
        self.answers = answers or {}
        self.installed = installed
        self.calls = []
        self.looked_up = []

    def get_bin_path(self, name: str, required: bool = False, opt_dirs: list | None = None) -> str | None:
        assert required is False, "the runner reports a missing program itself"
        self.looked_up.append(name)
        return "/usr/bin/" + name if name in self.installed else None

    def run_command(self, cmd: list) -> tuple:
        self.calls.append(cmd)
        key = (cmd[0].rsplit("/", 1)[-1], cmd[1])
        if key[0] == "journalctl":
            key = ("journalctl", "")
        if key not in self.answers:
            raise AssertionError(f"unexpected command {cmd}")
        return self.answers[key]


def properties(*names: str) -> list:
    return [arg for name in names for arg in ("-p", name)]


# --- status ------------------------------------------------------------------------------------------------------

def test_status_reads_every_state_property_in_one_show():
    module = FakeModule({("systemctl", "show"): (0, RUNNING, "")})
    status = SystemdUnit(module, UNIT).status()
    assert module.calls == [["/usr/bin/systemctl", "show", *properties(*STATE_PROPERTIES), UNIT]]
    assert status == UnitStatus("loaded", "active", "running", "success", 0, 4242, 0,
                                "/system.slice/trainer.service")
    assert status.stopped is False and status.describe() == "active/running, 0 restarts"


def test_status_of_a_unit_systemd_does_not_know_is_an_error_with_the_state():
    module = FakeModule({("systemctl", "show"): (0, "LoadState=not-found\nActiveState=inactive\nMainPID=0\n", "")})
    with pytest.raises(SystemdError) as raised:
        SystemdUnit(module, "typo.service").status()
    assert str(raised.value) == ("Unit typo.service does not exist on this host; check the unit name "
                                 "(systemctl list-units).")
    assert raised.value.status.load_state == "not-found" and raised.value.status.main_pid == 0
    assert raised.value.details() == {} and raised.value.missing is None


def test_a_failing_systemctl_names_the_command_its_exit_status_and_output():
    module = FakeModule({("systemctl", "show"): (1, "", "Failed to connect to bus: No such file or directory\n")})
    with pytest.raises(SystemdError) as raised:
        SystemdUnit(module, UNIT).status()
    assert str(raised.value) == (f"systemctl show {UNIT} failed (exit 1): Failed to connect to bus: No such file or "
                                 f"directory. See 'systemctl status {UNIT}' on this host.")
    assert raised.value.details() == {"rc": 1} and raised.value.status is None


def test_a_failure_without_output_says_so():
    module = FakeModule({("systemctl", "stop"): (5, "", "")})
    with pytest.raises(SystemdError, match=r"failed \(exit 5\): no output\. See"):
        SystemdUnit(module, UNIT).stop()


def test_without_systemctl_nothing_runs_and_the_message_says_what_is_missing():
    module = FakeModule(installed=())
    with pytest.raises(SystemdError) as raised:
        SystemdUnit(module, UNIT).status()
    assert str(raised.value) == (f"Unit {UNIT} needs systemctl, which is not on this host's PATH: run the task on the "
                                 "host whose systemd manages the unit.")
    assert raised.value.missing == "systemctl" and raised.value.details() == {}
    assert module.calls == []


def test_programs_are_looked_up_once():
    module = FakeModule({("systemctl", "show"): (0, RUNNING, "")})
    unit = SystemdUnit(module, UNIT)
    unit.status()
    unit.status()
    assert module.looked_up == ["systemctl"]


# --- main PID, stop, reset-failed ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("answer", "expected"), [
    ((0, "MainPID=4242\n", ""), 4242),
    ((0, "MainPID=0\n", ""), 0),
    ((0, "", ""), 0),
])
def test_main_pid(answer, expected):
    module = FakeModule({("systemctl", "show"): answer})
    assert SystemdUnit(module, UNIT).main_pid() == expected
    assert module.calls == [["/usr/bin/systemctl", "show", "-p", "MainPID", UNIT]]


def test_main_pid_of_a_failing_systemctl_is_an_error_unless_unchecked():
    module = FakeModule({("systemctl", "show"): (1, "", "Failed to connect to bus")})
    with pytest.raises(SystemdError):
        SystemdUnit(module, UNIT).main_pid()
    assert SystemdUnit(module, UNIT).main_pid(check=False) == 0


@pytest.mark.parametrize(("result", "timed_out"), [("success", False), ("timeout", True), ("", False)])
def test_stop_says_whether_systemd_had_to_kill_after_its_stop_timeout(result, timed_out):
    module = FakeModule({("systemctl", "stop"): (0, "", ""), ("systemctl", "show"): (0, f"Result={result}\n", "")})
    assert SystemdUnit(module, UNIT).stop() is timed_out
    assert module.calls == [["/usr/bin/systemctl", "stop", UNIT],
                            ["/usr/bin/systemctl", "show", "-p", "Result", UNIT]]


def test_a_failing_stop_is_an_error_and_nothing_more_runs():
    module = FakeModule({("systemctl", "stop"): (1, "", "Job for trainer.service canceled.")})
    with pytest.raises(SystemdError) as raised:
        SystemdUnit(module, UNIT).stop()
    assert str(raised.value).startswith(f"systemctl stop {UNIT} failed (exit 1): Job for trainer.service canceled.")
    assert raised.value.rc == 1 and len(module.calls) == 1


def test_reset_failed_of_a_unit_that_is_not_failed_is_no_error():
    module = FakeModule({("systemctl", "reset-failed"): (1, "", f"Unit {UNIT} not loaded.")})
    SystemdUnit(module, UNIT).reset_failed()
    assert module.calls == [["/usr/bin/systemctl", "reset-failed", UNIT]]


# --- the journal --------------------------------------------------------------------------------------------------

def test_journal_tail_reads_the_units_own_lines():
    module = FakeModule({("journalctl", ""): (0, "one\ntwo\nthree\n", "")})
    assert SystemdUnit(module, UNIT).journal_tail(2) == ["two", "three"]
    assert module.calls == [["/usr/bin/journalctl", f"_SYSTEMD_UNIT={UNIT}", "--lines", "2", "--no-pager",
                             "--output", "cat"]]


@pytest.mark.parametrize(("installed", "answer", "lines"), [
    (("journalctl",), (1, "", "No journal files were found."), 8),  # journalctl failing
    ((), None, 8),  # no journalctl
    (("journalctl",), None, 0),  # no lines wanted
])
def test_journal_tail_is_empty_when_it_cannot_be_read(installed, answer, lines):
    module = FakeModule({("journalctl", ""): answer} if answer else {}, installed=installed)
    assert SystemdUnit(module, UNIT).journal_tail(lines) == []
    assert len(module.calls) == (1 if answer else 0)


# --- a transient service ------------------------------------------------------------------------------------------

def test_transient_command_names_systemd_run_so_check_mode_shows_the_same():
    unit = SystemdUnit(FakeModule(), service_name("dflash-training"))
    command = unit.transient_command(["/root/run.sh", "--resume"], chdir="/root", environment={"B": "2", "A": "1"},
                                     output_file="/var/log/train.out")
    assert command == ["systemd-run", "--unit=dflash-training.service", "--collect", "--quiet", "--property=Type=exec",
                       "--working-directory=/root", "--setenv=A=1", "--setenv=B=2",
                       "--property=StandardOutput=append:/var/log/train.out",
                       "--property=StandardError=append:/var/log/train.out", "--", "/root/run.sh", "--resume"]
    assert unit.transient_command(["/root/run.sh"]) == [
        "systemd-run", "--unit=dflash-training.service", "--collect", "--quiet", "--property=Type=exec", "--",
        "/root/run.sh"]


def test_start_transient_forgets_a_failed_run_starts_and_returns_the_main_pid():
    module = FakeModule({("systemctl", "reset-failed"): (1, "", "not loaded"), ("systemd-run", "--unit=t.service"):
                         (0, "", ""), ("systemctl", "show"): (0, "MainPID=777\n", "")})
    unit = SystemdUnit(module, "t.service")
    assert unit.start_transient(unit.transient_command(["/root/run.sh"])) == 777
    assert module.calls == [
        ["/usr/bin/systemctl", "reset-failed", "t.service"],
        ["/usr/bin/systemd-run", "--unit=t.service", "--collect", "--quiet", "--property=Type=exec", "--",
         "/root/run.sh"],
        ["/usr/bin/systemctl", "show", "-p", "MainPID", "t.service"],
    ]


def test_start_transient_failing_is_an_error():
    module = FakeModule({("systemctl", "reset-failed"): (0, "", ""), ("systemd-run", "--unit=t.service"):
                         (1, "", "Failed to start transient service unit: Unit t.service already exists.")})
    unit = SystemdUnit(module, "t.service")
    with pytest.raises(SystemdError) as raised:
        unit.start_transient(unit.transient_command(["/root/run.sh"]))
    assert str(raised.value) == ("systemd-run could not start t.service (exit 1): Failed to start transient service "
                                 "unit: Unit t.service already exists.")
    assert raised.value.rc == 1


@pytest.mark.parametrize("missing", ["systemd-run", "systemctl"])
def test_start_transient_runs_nothing_when_a_program_is_missing(missing):
    module = FakeModule(installed=tuple(name for name in ("systemctl", "systemd-run") if name != missing))
    unit = SystemdUnit(module, "t.service")
    with pytest.raises(SystemdError) as raised:
        unit.start_transient(unit.transient_command(["/root/run.sh"]))
    assert raised.value.missing == missing and module.calls == []


# --- parsing ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("output", "expected"), [
    ("MainPID=4242\n", {"MainPID": "4242"}),
    ("Description=SGLang = fast\nExecStart={ path=/x ; argv[]=/x -a=b }\n",
     {"Description": "SGLang = fast", "ExecStart": "{ path=/x ; argv[]=/x -a=b }"}),
    ("no equals sign\n\nResult=\n", {"Result": ""}),
    ("", {}),
])
def test_parse_systemctl_show(output, expected):
    assert parse_systemctl_show(output) == expected


@pytest.mark.parametrize(("output", "main_pid", "restarts", "describe"), [
    (RUNNING, 4242, 0, "active/running, 0 restarts"),
    ("ActiveState=failed\nSubState=failed\nResult=exit-code\nNRestarts=2\nMainPID=0\n", 0, 2,
     "failed/failed, 2 restarts, result exit-code"),
    ("MainPID=[not set]\n", None, None, "?/?, ? restarts"),
    ("", None, None, "?/?, ? restarts"),
])
def test_unit_status_from_show(output, main_pid, restarts, describe):
    status = UnitStatus.from_show(output)
    assert (status.main_pid, status.restarts, status.describe()) == (main_pid, restarts, describe)
    assert "control_group" not in status.as_dict()  # service_health's documented unit keys


def test_service_name():
    assert service_name("pivot-training") == "pivot-training.service"
    assert service_name("pivot-training.service") == "pivot-training.service"
