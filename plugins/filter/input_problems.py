# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: input_problems
short_description: Judge a Pivot run's inputs (phase 0)
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Takes the serving host's and the training host's C(pivot_*) variables and returns one sentence per problem (a
    draft length, budget or top-k the DDTree plugin would refuse, as its own settings resolver decides; gates out of
    range, a port, relative paths, a missing wheelhouse, an incomplete training job selector).
  - Values given with C(-e key=value) arrive as strings; numbers are judged by their text.
options:
  _input:
    description: The serving host's variables (C(hostvars[host]); only the C(pivot_*) ones phase 0 judges are read).
    type: dict
    required: true
  training:
    description: The training host's variables.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Refuse bad inputs before any host is contacted
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "Invalid inputs, nothing was touched: {{ problems | join('; ') }}"
  vars:
    problems: "{{ serving_vars | pivot.ops.input_problems(training_vars) }}"
"""

RETURN = r"""
_value:
  description: One sentence per problem; empty when the inputs are good.
  type: list
  elements: str
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible_collections.pivot.ops.plugins.plugin_utils import input_rules


def input_problems(serving, training):
    if not isinstance(serving, Mapping) or not isinstance(training, Mapping):
        raise AnsibleFilterError("input_problems: the serving and training variables must be dictionaries")
    return input_rules.input_problems(serving, training)


class FilterModule:
    def filters(self):
        return {"input_problems": input_problems}
