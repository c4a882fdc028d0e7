# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: ddtree_required_flags
short_description: The server flags the DDTree plugin would set on a release, to state them in its unit
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Runs the plugin's own rule (C(ddtree_runtime.sglang.config.required_server_args), loaded from the collection's
    bundled source, the function the plugin's C(handle_server_args) applies) on a DDTREE release's flags and returns
    the flags the plugin would set or override at start, by their SGLang 0.5.23 names. Added to the release's command
    line, they make the rendered unit say what serves (C(systemctl cat)), and the plugin then changes nothing.
  - Fails when the plugin would refuse the draft length, budget or top-k (phase 0 says so first).
options:
  _input:
    description: The release's server flags (common and speculative), SGLang names without the leading C(--).
    type: dict
    required: true
  draft_tokens:
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
- name: The release's flags, with what the plugin would set stated
  ansible.builtin.set_fact:
    release_flags: >-
      {{ flags | combine(flags | pivot.ops.ddtree_required_flags(pivot_ddtree_draft_tokens, pivot_ddtree_budget,
         pivot_ddtree_topk)) }}
"""

RETURN = r"""
_value:
  description: Flag name (without C(--)) to value, for each setting the plugin would set; empty when all are stated.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.pivot.ops.plugins.plugin_utils import ddtree_rules


def ddtree_required_flags(flags, draft_tokens, budget, topk):
    if not isinstance(flags, dict):
        raise AnsibleFilterError("ddtree_required_flags expects the release's flags as a dict, got %s"
                                 % type(flags).__name__)
    try:
        return ddtree_rules.required_flags(flags, draft_tokens, budget, topk)
    except ValueError as error:
        raise AnsibleFilterError("The DDTree plugin would refuse this release: %s" % error) from error


class FilterModule:
    def filters(self):
        return {"ddtree_required_flags": ddtree_required_flags}
