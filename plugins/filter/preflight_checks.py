# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: preflight_checks
short_description: Judge the facts the preflight role read on a host
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Turns the task results the C(pivot.ops.preflight) role registered on a serving or training host into named checks,
    each C({name, ok, detail}). A missing or malformed fact fails its own check with a sentence; it never fails the
    filter.
  - The model-shape and draft-length rules are the DDTree plugin's own, loaded from the bundled C(ddtree_runtime)
    source (C(ddtree_runtime.model_layout), C(ddtree_runtime.sglang.config)).
options:
  _input:
    description: The facts, keyed as the preflight role's C(tasks/serving.yml) and C(tasks/training.yml) collect them.
    type: dict
    required: true
  side:
    description: Which host's checks to run.
    type: str
    choices: [serving, training]
    required: true
  skipped:
    description: Names of checks that count as passed (reported with C(skipped=true)).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Evaluate the serving-side checks
  ansible.builtin.set_fact:
    preflight_checks: "{{ facts | pivot.ops.preflight_checks('serving', ['free_disk']) }}"
"""

RETURN = r"""
_value:
  description: One entry per check, in a fixed order.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.pivot.ops.plugins.plugin_utils import preflight_rules


def preflight_checks(facts, side, skipped=None):
    if not isinstance(facts, dict):
        raise AnsibleFilterError("preflight_checks: the facts must be a dictionary, got %s" % type(facts).__name__)
    if side == "serving":
        checks = preflight_rules.serving_checks(facts)
    elif side == "training":
        checks = preflight_rules.training_checks(facts)
    else:
        raise AnsibleFilterError("preflight_checks: side must be 'serving' or 'training', got %r" % (side,))
    return preflight_rules.skip(checks, list(skipped or []))


class FilterModule:
    def filters(self):
        return {"preflight_checks": preflight_checks}
