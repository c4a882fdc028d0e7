# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Read a systemd unit's state (``systemctl show``) and the end of its journal."""

from __future__ import annotations

from dataclasses import dataclass

STATE_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ExecMainStatus")


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
    """The part of a unit's state that tells whether it runs, restarts or has given up."""

    load_state: str
    active_state: str
    sub_state: str
    result: str
    restarts: int | None
    main_pid: int | None
    exec_main_status: int | None

    @classmethod
    def from_show(cls, output: str) -> UnitStatus:
        values = parse_systemctl_show(output)
        return cls(
            load_state=values.get("LoadState", ""),
            active_state=values.get("ActiveState", ""),
            sub_state=values.get("SubState", ""),
            result=values.get("Result", ""),
            restarts=_int_or_none(values.get("NRestarts")),
            main_pid=_int_or_none(values.get("MainPID")),
            exec_main_status=_int_or_none(values.get("ExecMainStatus")),
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
        return {
            "load_state": self.load_state,
            "active_state": self.active_state,
            "sub_state": self.sub_state,
            "result": self.result,
            "restarts": self.restarts,
            "main_pid": self.main_pid,
            "exec_main_status": self.exec_main_status,
        }


def unit_not_found_message(unit: str) -> str:
    return "Unit %s does not exist on this host; check the unit name (systemctl list-units)." % unit


def show_command(systemctl: str, unit: str) -> list:
    command = [systemctl, "show"]
    for prop in STATE_PROPERTIES:
        command += ["-p", prop]
    return [*command, unit]


def journal_command(journalctl: str, unit: str, lines: int) -> list:
    """The unit's own output. Not ``--unit``: that adds systemd's lines about the unit, and after a few restarts
    ("Scheduled restart job", "Start request repeated too quickly") they push the cause out of the tail."""
    return [journalctl, "_SYSTEMD_UNIT=%s" % unit, "--lines", str(lines), "--no-pager", "--output", "cat"]
