# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one place that runs ``systemctl``, ``journalctl`` and ``systemd-run``: a unit's state, its stop, a transient
service's start and the end of its journal, with each failure worded once (what is wrong, what to do).

Modules ask :class:`SystemdUnit` and get parsed results or a :class:`SystemdError`; tests fake one seam, the
module's ``get_bin_path`` and ``run_command``."""

from __future__ import annotations

from dataclasses import dataclass

# What :meth:`SystemdUnit.status` asks for: whether the unit runs, restarts or has given up, and where its processes
# are (ControlGroup, for finding a job's processes).
STATE_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ExecMainStatus",
                    "ControlGroup")


def parse_systemctl_show(output: str) -> dict:
    """``KEY=VALUE`` lines of ``systemctl show`` as a dict (values may contain ``=``)."""
    values = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


@dataclass
class UnitStatus:
    """The part of a unit's state that tells whether it runs, restarts or has given up, and where its processes
    are."""

    load_state: str
    active_state: str
    sub_state: str
    result: str
    restarts: int | None
    main_pid: int | None
    exec_main_status: int | None
    control_group: str = ""

    @classmethod
    def from_show(cls, output: str) -> UnitStatus:
        return cls.from_values(parse_systemctl_show(output))

    @classmethod
    def from_values(cls, values: dict) -> UnitStatus:
        return cls(
            load_state=values.get("LoadState", ""),
            active_state=values.get("ActiveState", ""),
            sub_state=values.get("SubState", ""),
            result=values.get("Result", ""),
            restarts=_int_or_none(values.get("NRestarts")),
            main_pid=_int_or_none(values.get("MainPID")),
            exec_main_status=_int_or_none(values.get("ExecMainStatus")),
            control_group=values.get("ControlGroup", ""),
        )

    @property
    def stopped(self) -> bool:
        """systemd will not start it again by itself: failed (start limit hit, no restart policy) or stopped."""
        return self.active_state in ("failed", "inactive")

    def describe(self) -> str:
        restarts = "?" if self.restarts is None else str(self.restarts)
        text = "%s/%s, %s restarts" % (self.active_state or "?", self.sub_state or "?", restarts)
        if self.result and self.result != "success":
            text += ", result %s" % self.result
        return text

    def as_dict(self) -> dict:
        """What ``service_health`` returns as ``unit``."""
        return {
            "load_state": self.load_state,
            "active_state": self.active_state,
            "sub_state": self.sub_state,
            "result": self.result,
            "restarts": self.restarts,
            "main_pid": self.main_pid,
            "exec_main_status": self.exec_main_status,
        }


class SystemdError(Exception):
    """systemctl, journalctl or systemd-run is missing or failed. ``rc`` is the failing command's exit status,
    ``missing`` the name of a program not found, ``status`` the unit's state when it was read (a unit systemd does
    not know)."""

    def __init__(
        self, message: str, rc: int | None = None, missing: str | None = None, status: UnitStatus | None = None
    ) -> None:
        super().__init__(message)
        self.rc = rc
        self.missing = missing
        self.status = status

    def details(self) -> dict:
        """Extra keys for the module's failure result."""
        return {"rc": self.rc} if self.rc is not None else {}


def service_name(name: str) -> str:
    """``name`` with ``.service`` added when it has no unit type (as systemd-run names a transient service)."""
    return name if name.endswith(".service") else name + ".service"


def unit_not_found_message(unit: str) -> str:
    return "Unit %s does not exist on this host; check the unit name (systemctl list-units)." % unit


def missing_program_message(unit: str, program: str) -> str:
    return ("Unit %s needs %s, which is not on this host's PATH: run the task on the host whose systemd manages the "
            "unit." % (unit, program))


def command_output(out: str, err: str) -> str:
    """What a failing command said, as a clause of a sentence."""
    return (err or out).strip().rstrip(".") or "no output"


def failed_message(command: str, unit: str, rc: int, out: str, err: str) -> str:
    return "%s %s failed (exit %d): %s. See 'systemctl status %s' on this host." % (
        command, unit, rc, command_output(out, err), unit)


def journal_command(journalctl: str, unit: str, lines: int) -> list:
    """The unit's own output. Not ``--unit``: that adds systemd's lines about the unit, and after a few restarts
    ("Scheduled restart job", "Start request repeated too quickly") they push the cause out of the tail."""
    return [journalctl, "_SYSTEMD_UNIT=%s" % unit, "--lines", str(lines), "--no-pager", "--output", "cat"]


class SystemdUnit:
    """One unit, driven through ``module.get_bin_path`` and ``module.run_command`` (an ``AnsibleModule`` on the
    target, a fake in tests). Programs are looked up when first needed."""

    def __init__(self, module, unit: str) -> None:
        self.module = module
        self.unit = unit
        self.paths = {}

    def program(self, name: str) -> str:
        """The path of ``systemctl``, ``journalctl`` or ``systemd-run``; a SystemdError when it is not installed."""
        if name not in self.paths:
            path = self.module.get_bin_path(name, required=False)
            if not path:
                raise SystemdError(missing_program_message(self.unit, name), missing=name)
            self.paths[name] = path
        return self.paths[name]

    def systemctl(self, verb: str, *options: str, check: bool = True) -> str:
        """``systemctl VERB OPTIONS UNIT``'s output; a failure raises unless ``check`` is false."""
        rc, out, err = self.module.run_command([self.program("systemctl"), verb, *options, self.unit])
        if rc != 0 and check:
            raise SystemdError(failed_message("systemctl " + verb, self.unit, rc, out, err), rc=rc)
        return out

    def show(self, properties, check: bool = True) -> dict:
        options = []
        for prop in properties:
            options += ["-p", prop]
        return parse_systemctl_show(self.systemctl("show", *options, check=check))

    def status(self) -> UnitStatus:
        """The unit's state; a unit systemd does not know is an error."""
        status = UnitStatus.from_values(self.show(STATE_PROPERTIES))
        if status.load_state == "not-found":
            raise SystemdError(unit_not_found_message(self.unit), status=status)
        return status

    def main_pid(self, check: bool = True) -> int:
        """The unit's main process, 0 when it has none (or, without ``check``, when systemctl fails)."""
        return _int_or_none(self.show(["MainPID"], check=check).get("MainPID")) or 0

    def stop(self) -> bool:
        """``systemctl stop``, which returns when the unit has stopped; whether systemd had to kill it after its stop
        timeout (``Result=timeout``)."""
        self.systemctl("stop")
        return self.show(["Result"], check=False).get("Result") == "timeout"

    def reset_failed(self) -> None:
        """Forget a failed state and the start-limit count (systemctl says so when there is none: not an error)."""
        self.systemctl("reset-failed", check=False)

    def journal_tail(self, lines: int) -> list:
        """The last ``lines`` lines the unit's processes wrote to the journal; empty when there is no journalctl or
        it cannot read the journal (the tail only explains a failure, it is never one)."""
        if lines <= 0:
            return []
        try:
            journalctl = self.program("journalctl")
        except SystemdError:
            return []
        rc, out, _err = self.module.run_command(journal_command(journalctl, self.unit, lines))
        return out.splitlines()[-lines:] if rc == 0 else []

    def transient_command(
        self, argv: list, chdir: str | None = None, environment: dict | None = None, output_file: str | None = None
    ) -> list:
        """The ``systemd-run`` command line that runs ``argv`` as this transient service (``systemd-run`` by name, so
        that check mode shows the same command; :meth:`start_transient` resolves it)."""
        command = ["systemd-run", "--unit=" + self.unit, "--collect", "--quiet", "--property=Type=exec"]
        if chdir:
            command.append("--working-directory=" + chdir)
        for name, value in sorted((environment or {}).items()):
            command.append("--setenv=%s=%s" % (name, value))
        if output_file:
            command += ["--property=StandardOutput=append:" + output_file,
                        "--property=StandardError=append:" + output_file]
        return [*command, "--", *argv]

    def start_transient(self, command: list) -> int:
        """Run a :meth:`transient_command`; the started service's main PID (0 when systemd does not name one). A
        failed earlier run of the same name is forgotten first, or systemd-run would refuse the name."""
        systemd_run = self.program("systemd-run")
        self.reset_failed()
        rc, out, err = self.module.run_command([systemd_run, *command[1:]])
        if rc != 0:
            raise SystemdError(
                "systemd-run could not start %s (exit %d): %s." % (self.unit, rc, command_output(out, err)), rc=rc)
        return self.main_pid(check=False)
