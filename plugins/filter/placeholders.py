# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: placeholders
short_description: The production inventory's placeholders left in a value
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Returns every C(<PLACEHOLDER>) (a C(<), a capital letter, and anything up to the next C(>), such as
    C(<TRAINING_LOG_FILE>) or the resume command's C(<CONFIRM, ...>) element) found in a string, or in the strings of a
    list or of a dictionary's values, in order. It is the rule phase 0 (C(pivot.ops.input_problems),
    C(pivot.ops.resume_input_problems)) applies, in C(plugins/plugin_utils/input_rules.py).
options:
  _input:
    description: The value to search.
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Refuse a command that still holds a placeholder
  ansible.builtin.assert:
    that: resume_training_command | pivot.ops.placeholders | length == 0
    fail_msg: "Replace {{ resume_training_command | pivot.ops.placeholders | join(', ') }} in the inventory"
"""

RETURN = r"""
_value:
  description: The placeholders found, as written; empty when there is none.
  type: list
  elements: str
"""

from ansible_collections.pivot.ops.plugins.plugin_utils import input_rules


def placeholders(value):
    return input_rules.placeholders(value)


class FilterModule:
    def filters(self):
        return {"placeholders": placeholders}
