# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: resume_input_problems
short_description: Judge a training host's inputs to a resume of its training job (phase 0)
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Takes a training host's C(pivot_*) variables and returns one sentence per problem that would keep
    C(playbooks/resume_training.yml) from starting the job again, so that it refuses before any host is touched.
  - 'It judges: a complete training job selector (C(pivot_training_job)); an absolute C(pivot_training_log_file) (the
    resume needs it: it waits for a step after the checkpoint''s there) and C(pivot_training_checkpoint.path);
    C(pivot_training_resume) with a C(command) that is a non-empty list of arguments holding no C(<PLACEHOLDER>) of the
    production inventory (C(<CONFIRM: ...>)), and absolute C(chdir), C(output_file) and C(pidfile) when given; an
    absolute C(pivot_resume_from) when given.'
  - A value still holding a C(<PLACEHOLDER>) (C(<TRAINING_LOG_FILE>)) is named as one. The rules are the ones the
    pivot's C(pivot.ops.input_problems) applies, in C(plugins/plugin_utils/input_rules.py).
options:
  _input:
    description: The training host's variables (C(hostvars[host]); only the ones named above are read).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Refuse bad resume settings before any host is contacted
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "Invalid inputs, nothing was touched: {{ problems | join('; ') }}"
  vars:
    problems: "{{ hostvars['ct200'] | pivot.ops.resume_input_problems }}"
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


def resume_input_problems(training):
    if not isinstance(training, Mapping):
        raise AnsibleFilterError("resume_input_problems: the training host's variables must be a dictionary")
    return input_rules.resume_input_problems(training)


class FilterModule:
    def filters(self):
        return {"resume_input_problems": resume_input_problems}
