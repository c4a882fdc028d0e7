# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: partial_run_tags
short_description: The parts of a tag filter that would leave part of a Pivot phase out
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Given C(ansible_run_tags) and C(ansible_skip_tags), returns what would run a Pivot phase only in part, each as
    C(--tags NAME) or C(--skip-tags NAME). Any C(--tags) other than C(all) counts (the playbooks' own includes carry no
    tags). A skipped tag counts when a Pivot task can carry it (C(always), a role's name or C(<role>_<step>), the roles
    being this collection's); others, such as molecule's C(molecule-notest), skip nothing of Pivot's and pass.
options:
  _input:
    description: The run's C(ansible_run_tags).
    type: list
    elements: str
    required: true
  skip_tags:
    description: The run's C(ansible_skip_tags).
    type: list
    elements: str
    required: true
  more_roles:
    description: More role names whose tags count, beside this collection's (C(pivot.ops.run_phase) passes the phase's
      own role, which may be a play's own).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Refuse a tag filter that would cut a phase short
  ansible.builtin.fail:
    msg: "not supported: {{ ansible_run_tags | pivot.ops.partial_run_tags(ansible_skip_tags) | join(', ') }}"
  when: ansible_run_tags | pivot.ops.partial_run_tags(ansible_skip_tags) | length > 0
"""

RETURN = r"""
_value:
  description: The offending filters, C(--tags) ones first, in the order given; empty when the run is whole.
  type: list
  elements: str
"""

import os

ROLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "roles")


def pivot_roles(roles_dir=ROLES_DIR):
    return sorted(name for name in os.listdir(roles_dir) if os.path.isdir(os.path.join(roles_dir, name)))


def is_pivot_tag(tag, roles):
    return tag == "always" or any(tag == role or tag.startswith(role + "_") for role in roles)


def partial_run_tags(run_tags, skip_tags, more_roles=None):
    roles = pivot_roles() + list(more_roles or [])
    offending = ["--tags " + tag for tag in run_tags or [] if tag != "all"]
    offending += ["--skip-tags " + tag for tag in skip_tags or [] if is_pivot_tag(tag, roles)]
    return offending


class FilterModule:
    def filters(self):
        return {"partial_run_tags": partial_run_tags}
