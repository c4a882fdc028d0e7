# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: unit_drift
short_description: How a release's unit differs from what Pivot rendered or recorded for it
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Compares a release's unit, as systemd has loaded it and as its files say, with the release's C(release.json) (the
    command line and SGLang/DDTree environment Pivot rendered, or recorded from the user's unit).
  - Drop-ins, a unit file systemd has not reloaded (C(NeedDaemonReload=yes)) and a loaded C(ExecStart) other than the
    recorded command line are differences; with O(unit_text) and O(environment_text), so are a unit file's
    C(ExecStart=) or environment other than the recorded ones (a hand edit).
options:
  _input:
    description: The release's C(release.json), parsed (C(argv), C(environment), C(source)).
    type: dict
    required: true
  status:
    description:
      - The unit's C(systemctl show) properties, as C(ansible.builtin.systemd_service) returns them in C(status).
    type: dict
    required: true
  unit_text:
    description: The release's unit file; omitted, the file is not read.
    type: str
  environment_text:
    description: A rendered release's environment file; omitted, only the unit's C(Environment=) counts.
    type: str
"""

EXAMPLES = r"""
- name: Refuse a unit that is not what Pivot recorded
  ansible.builtin.assert:
    that: drift | length == 0
    fail_msg: "{{ drift | join('; ') }}"
  vars:
    drift: "{{ record | pivot.ops.unit_drift(unit_status.status, unit_text=unit_file_text) }}"
"""

RETURN = r"""
_value:
  description: One sentence per difference, empty when the unit is what Pivot rendered or recorded.
  type: list
  elements: str
"""

from ansible_collections.pivot.ops.plugins.plugin_utils import unit_file


def unit_drift(record, status, unit_text=None, environment_text=None):
    return unit_file.unit_drift(dict(record or {}), dict(status or {}),
                                None if unit_text is None else str(unit_text),
                                None if environment_text is None else str(environment_text))


class FilterModule:
    def filters(self):
        return {"unit_drift": unit_drift}
