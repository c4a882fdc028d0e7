# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How a run ended, in one line, from its phase records: the report's result and the playbook's last message.

A report written while the run goes on is ``running`` until a phase fails (which ends the run): a run that is
interrupted (Ctrl-C twice, ``kill -9``, a lost controller) or that loses a host leaves that report behind, and it never
reads OK. The closing write (``finished``) judges the run by its records and by what the closing check saw on each
serving host (``served``): the unit systemd runs, its health and the release ``current`` points at. A run is
``failed`` when any phase failed or the server is not what the run says it left (down, another release);
``incomplete`` when a serving host could not be checked or no switch was recorded on a host that should have one; ``ok``
otherwise.

Its result says what the server ended on (switched; rolled back and serving again; or, loudly, down with the command
that brings the baseline back), that a release serves without its quality gate having run (no baseline answers to
compare with), and any training work a forced stop lost, so that a run which stopped the training without a new
checkpoint never reads as a plain OK.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Record = Mapping[str, Any]
SWITCH_PHASES = ("sglang_release", "sglang_release_rollback")


def _findings(record: Record) -> Mapping[str, Any]:
    findings = record.get("findings")
    return findings if isinstance(findings, Mapping) else {}


def _step(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def work_lost(records: Sequence[Record]) -> str:
    """What forced stops lost, one sentence per stop; '' when no stop was forced."""
    sentences = []
    for record in records:
        lost = _findings(record).get("work_lost") if record.get("phase") == "stop_training" else None
        if not isinstance(lost, Mapping):
            continue
        host = record.get("host", "?")
        steps = lost.get("steps_lost")
        what = f"{steps} steps of training lost" if steps is not None else "training work lost (steps unknown)"
        checkpoint = lost.get("last_checkpoint")
        resume = (f"resume from {checkpoint} (step {_step(lost.get('last_checkpoint_step'))})" if checkpoint
                  else "no checkpoint to resume from")
        sentences.append(f"{what} by a forced stop on {host}: {resume}; the log had reached step "
                         f"{_step(lost.get('last_logged_step'))}")
    return "; ".join(sentences)


def _last_switch(records: Sequence[Record]) -> Record | None:
    """The run's last switch or rollback that reported findings."""
    switches = [r for r in records if r.get("phase") in SWITCH_PHASES and _findings(r)]
    return switches[-1] if switches else None


def server_outcome(records: Sequence[Record], check_mode: bool) -> str:
    """What the last switch or rollback left serving; '' when the run had none."""
    last = _last_switch(records)
    if last is None:
        return ""
    found, host = _findings(last), last.get("host", "?")
    release = found.get("release", "?")
    if found.get("server_down"):
        command = found.get("rollback_command") or "ansible-playbook playbooks/rollback_nextn.yml"
        return (f"{release} failed and the rollback to {found.get('rollback_to', '?')} failed too: the server on "
                f"{host} is DOWN (fix the cause, then run {command})")
    if found.get("rolled_back_to"):
        return f"{release} failed; rolled back to {found['rolled_back_to']}, which serves again"
    if "switched" not in found:
        return ""
    if check_mode:
        return f"would switch to {release}" if found["switched"] else f"{release} already serves"
    return f"switched to {release}" if found["switched"] else f"{release} was already serving"


def gate_not_run(records: Sequence[Record]) -> str:
    """The quality gate's note when a release now serves without it having run ('' otherwise)."""
    last = _last_switch(records)
    if last is None:
        return ""
    found = _findings(last)
    note = found.get("quality_note")
    if not note or found.get("server_down") or found.get("rolled_back_to"):
        return ""
    return f"the quality gate did not run: {note}"


DEFAULT_ROLLBACK_COMMAND = "ansible-playbook playbooks/rollback_nextn.yml"
CHECK_HOSTS_COMMAND = "ansible-playbook playbooks/check_hosts.yml"


def _switch_of(records: Sequence[Record], host: str) -> Record | None:
    switches = [r for r in records if r.get("phase") in SWITCH_PHASES and r.get("host") == host]
    return switches[-1] if switches else None


def expected_release(record: Record | None, check_mode: bool) -> str | None:
    """The release a switch or rollback record says serves now; None when it says none does (or would switch)."""
    found = _findings(record) if record is not None else {}
    if not found or found.get("server_down"):
        return None
    if found.get("rolled_back_to"):
        return str(found["rolled_back_to"])
    if "switched" in found and not (check_mode and found["switched"]):
        return str(found.get("release"))
    return None


def seen_sentence(host: str, seen: Mapping[str, Any]) -> str:
    """What the closing check saw on a serving host, as a clause."""
    if not seen.get("reachable", False):
        return f"what {host} serves could not be checked ({seen.get('error') or 'unreachable'})"
    release = seen.get("release") or "no release"
    if seen.get("healthy"):
        return f"{host} serves {release} ({seen.get('algorithm') or '?'}, healthy)"
    command = seen.get("rollback_command") or DEFAULT_ROLLBACK_COMMAND
    return (f"the server on {host} is DOWN (unit {seen.get('active_state') or 'unknown'}, current -> {release}): run "
            f"{command}")


def verification_problems(records: Sequence[Record], check_mode: bool, served: Mapping[str, Mapping[str, Any]],
                          switch_hosts: Sequence[str]) -> tuple[list[str], list[str]]:
    """Where the hosts disagree with the records: (failures, gaps). A failure is a server that is down or serves
    another release than recorded; a gap a host that could not be checked or has no switch recorded (what such a host
    serves is said beside it)."""
    failures: list[str] = []
    gaps = [f"no switch was recorded on {host} (the host was lost or the run stopped before it)"
            for host in switch_hosts if _switch_of(records, host) is None]
    for host, seen in served.items():
        record = _switch_of(records, host)
        recorded_down = bool(_findings(record).get("server_down")) if record else False
        expected = expected_release(record, check_mode)
        if not seen.get("reachable", False):
            gaps.append(seen_sentence(host, seen))
        elif not seen.get("healthy"):
            if not recorded_down:
                failures.append(seen_sentence(host, seen))
        elif recorded_down:
            failures.append(f"yet {seen_sentence(host, seen)}")
        elif expected is not None and seen.get("release") != expected:
            failures.append(f"{host} serves {seen.get('release') or 'no release'}, not {expected}")
        elif record is None and host in switch_hosts:
            gaps.append(seen_sentence(host, seen))
    return failures, gaps


def running_outcome(records: Sequence[Record]) -> dict[str, str]:
    """The outcome a report written during the run carries: never OK."""
    lost = work_lost(records)
    last = records[-1] if records else None
    where = (f"the last phase recorded is {last.get('phase', '?')} on {last.get('host', '?')} "
             f"({last.get('status', '?')})") if last else "no phase was recorded yet"
    result = (f"RUNNING: this run has not finished; {where}{'; ' + lost if lost else ''}. If its ansible-playbook is "
              f"no longer running, the run was interrupted: {CHECK_HOSTS_COMMAND} shows what serves now, "
              f"{DEFAULT_ROLLBACK_COMMAND} brings the baseline back")
    return {"status": "running", "result": result, "work_lost": lost}


def run_outcome(records: Sequence[Record], check_mode: bool = False, finished: bool = True,
                served: Mapping[str, Mapping[str, Any]] | None = None,
                switch_hosts: Sequence[str] = ()) -> dict[str, str]:
    """``status`` (ok/failed/incomplete, or running before the run's end), ``result`` (the one line), ``work_lost``
    (the forced stops' sentence, or '')."""
    failed = [r for r in records if r.get("status") == "failed"]
    if not finished and not failed:  # a failed phase ends the run: the playbooks' plays are any_errors_fatal
        return running_outcome(records)
    failures, gaps = verification_problems(records, check_mode, served or {}, switch_hosts)
    status = "failed" if failed or failures else ("incomplete" if gaps else "ok")
    lost = work_lost(records)
    clauses = [server_outcome(records, check_mode)]
    if failed and not clauses[0]:
        clauses[0] = f"{failed[-1].get('phase', '?')} failed on {failed[-1].get('host', '?')}"
    clauses += [*failures, *gaps, gate_not_run(records), lost]
    said = "; ".join(clause for clause in clauses if clause)
    head = status.upper() + (" (check mode)" if check_mode else "")
    return {"status": status, "result": f"{head}: {said}" if said else head, "work_lost": lost}
