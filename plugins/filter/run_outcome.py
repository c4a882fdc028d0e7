# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: run_outcome
short_description: How a Pivot run ended, in one line, from its phase records
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - A report written while the run goes on (O(finished=false)) is C(running), never OK, so an interrupted run, or one
    that lost a host, leaves a report that says it did not finish and what to run.
  - At the run's end the run is C(failed) when any phase failed or a serving host is not what the records say (its
    server down, another release serving), C(incomplete) when a serving host could not be checked or has no switch
    recorded although it should (O(switch_hosts)), else C(ok). Its result line says what the server ended on (switched
    to a release; the release failed and the baseline serves again; or the rollback failed too and the server is DOWN,
    with the command that brings the baseline back) and what any forced stop of the training lost (the steps, the
    checkpoint to resume from, the last logged step).
  - The run report's C(Result) line and the playbooks' last message both show it, so a run that stopped the training
    without a new checkpoint never reads as a plain OK.
options:
  _input:
    description: The run's phase records (C(run_phase_records) of every host), in the order they ran.
    type: list
    elements: dict
    required: true
  check_mode:
    description: Whether the run was in check mode (the result then says what it would do).
    type: bool
    default: false
  finished:
    description: Whether this is the run's closing judgement; V(false) for the reports written during the run.
    type: bool
    default: true
  served:
    description:
      - What the closing check saw on each serving host, by host name; each a dict with C(reachable) (bool), C(error),
        C(active_state) (the unit's), C(release) (where C(current) points), C(healthy) (bool), C(algorithm) and
        C(rollback_command).
    type: dict
    default: {}
  switch_hosts:
    description: Hosts on which the run must have recorded a switch or rollback to be complete.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Say how the run ended
  ansible.builtin.debug:
    msg: "{{ (phases | pivot.ops.run_outcome(ansible_check_mode)).result }}"
"""

RETURN = r"""
_value:
  description:
    - C(status) (C(ok), C(failed), C(incomplete) or C(running)), C(result) (the one line, starting with the status in
      capitals), C(work_lost) (the forced stops' sentence, empty when no stop was forced).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.pivot.ops.plugins.plugin_utils import run_outcome as rules


def run_outcome(records, check_mode=False, finished=True, served=None, switch_hosts=None):
    if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
        raise AnsibleFilterError("run_outcome: the input must be the list of phase records")
    if not isinstance(served or {}, dict):
        raise AnsibleFilterError("run_outcome: served must map each serving host to what the closing check saw")
    return rules.run_outcome(records, bool(check_mode), bool(finished), dict(served or {}),
                             [str(host) for host in switch_hosts or []])


class FilterModule:
    def filters(self):
        return {"run_outcome": run_outcome}
