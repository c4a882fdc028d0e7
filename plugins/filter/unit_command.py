# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: unit_command
short_description: A service's command line and environment as systemd reads them from its unit file
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Reads C(ExecStart=), C(Environment=) and C(EnvironmentFile=) of a unit file's C([Service]) section with systemd's
    rules (continuation lines, comments, the C(@-:+!) prefixes, quotes anywhere in a word, C escapes, C(%%), C($$)), so
    the recorded baseline's own file, the one a rollback starts, is what its SGLang validates.
  - What the reader does not model (other C(%) specifiers, C($VAR) substituted at start, several commands, an
    interpreter named without its path) is not guessed; C(problem) says so.
  - With O(loaded_exec_start) (the C(ExecStart) value C(systemctl show) prints for the loaded unit), C(problem) is also
    set when systemd runs something else than the file says (a drop-in, an edit not yet reloaded).
options:
  _input:
    description: The unit file's text.
    type: str
    required: true
  loaded_exec_start:
    description:
      - The loaded unit's C(ExecStart) as C(systemctl show) prints it (in the status C(ansible.builtin.systemd_service)
        returns).
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Read the recorded unit's command line
  ansible.builtin.set_fact:
    baseline_command: "{{ unit_slurp.content | b64decode | pivot.ops.unit_command }}"
"""

RETURN = r"""
_value:
  description:
    - C(argv) (what the process gets), C(executable) (the file systemd runs), C(environment) (C(Environment=), a dict),
      C(sglang_environment) (its C(SGLANG_*) and C(DDTREE_*) variables without secret-looking names, which are what is
      recorded and validated), C(environment_files), and C(problem) (empty when C(argv) is exact, else why it is not).
  type: dict
"""

from ansible_collections.pivot.ops.plugins.plugin_utils import unit_file


def unit_command(text, loaded_exec_start=""):
    return unit_file.unit_command(str(text), str(loaded_exec_start or ""))


class FilterModule:
    def filters(self):
        return {"unit_command": unit_command}
