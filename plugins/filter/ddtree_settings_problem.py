# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: ddtree_settings_problem
short_description: Ask the DDTree plugin whether it would serve a draft length, budget and top-k
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Runs the plugin's own settings resolver (C(ddtree_runtime.sglang.config.resolve_settings), loaded from the
    collection's bundled source) on C(--speculative-num-draft-tokens) and the C(DDTREE_BUDGET) / C(DDTREE_TOPK) values
    a release would get, and returns the plugin's refusal, or an empty string when the plugin serves them. Every phase
    and the lab use this one rule.
options:
  _input:
    description: The draft length (C(--speculative-num-draft-tokens)).
    type: raw
    required: true
  budget:
    description: Tree nodes per round (C(DDTREE_BUDGET)).
    type: raw
    required: true
  topk:
    description: Candidates per depth (C(DDTREE_TOPK)).
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Refuse settings the plugin would refuse at start
  ansible.builtin.assert:
    that: pivot_ddtree_draft_tokens | pivot.ops.ddtree_settings_problem(pivot_ddtree_budget, pivot_ddtree_topk) == ''
"""

RETURN = r"""
_value:
  description: The plugin's refusal, or an empty string.
  type: str
"""

from ansible_collections.pivot.ops.plugins.plugin_utils import ddtree_rules


def ddtree_settings_problem(draft_tokens, budget, topk):
    return ddtree_rules.settings_problem(draft_tokens, budget, topk) or ""


class FilterModule:
    def filters(self):
        return {"ddtree_settings_problem": ddtree_settings_problem}
