# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How a run ended, in one line, from its phase records: the report's result and the playbook's last message.

A run is ``failed`` when any phase failed. Its result says what the server ended on (switched; rolled back and serving
again; or, loudly, down with the command that brings the baseline back), that a release serves without its quality
gate having run (no baseline answers to compare with), and any training work a forced stop lost, so that a run which
stopped the training without a new checkpoint never reads as a plain OK.
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


def run_outcome(records: Sequence[Record], check_mode: bool = False) -> dict[str, str]:
    """``status`` (ok/failed), ``result`` (the one line), ``work_lost`` (the forced stops' sentence, or '')."""
    failed = [r for r in records if r.get("status") == "failed"]
    status = "failed" if failed else "ok"
    lost = work_lost(records)
    clauses = [server_outcome(records, check_mode)]
    if failed and not clauses[0]:
        clauses[0] = f"{failed[-1].get('phase', '?')} failed on {failed[-1].get('host', '?')}"
    clauses.append(gate_not_run(records))
    clauses.append(lost)
    said = "; ".join(clause for clause in clauses if clause)
    head = status.upper() + (" (check mode)" if check_mode else "")
    return {"status": status, "result": f"{head}: {said}" if said else head, "work_lost": lost}
