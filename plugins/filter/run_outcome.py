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
  - The run is C(failed) when any phase failed, else C(ok). Its result line says what the server ended on (switched to
    a release; the release failed and the baseline serves again; or the rollback failed too and the server is DOWN,
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
"""

EXAMPLES = r"""
- name: Say how the run ended
  ansible.builtin.debug:
    msg: "{{ (phases | pivot.ops.run_outcome(ansible_check_mode)).result }}"
"""

RETURN = r"""
_value:
  description:
    - C(status) (C(ok) or C(failed)), C(result) (the one line, starting OK or FAILED), C(work_lost) (the forced stops'
      sentence, empty when no stop was forced).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.pivot.ops.plugins.plugin_utils import run_outcome as rules


def run_outcome(records, check_mode=False):
    if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
        raise AnsibleFilterError("run_outcome: the input must be the list of phase records")
    return rules.run_outcome(records, bool(check_mode))


class FilterModule:
    def filters(self):
        return {"run_outcome": run_outcome}
