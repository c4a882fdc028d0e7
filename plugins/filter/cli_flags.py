# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: cli_flags
short_description: Turn a dictionary of command-line flags into an argument list
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - 'Renders a dictionary such as C({"tp-size": 2, "trust-remote-code": true}) as C(["--tp-size", "2",
    "--trust-remote-code"]), in the dictionary''s order, the way argparse-based servers such as SGLang read them.'
  - V(true) gives the bare flag, V(false) and V(null) leave the flag out, a list gives the flag followed by each
    element (argparse C(nargs)), anything else gives the flag and its value as a string.
  - Keys may be given with or without the leading C(--); underscores stay as written.
options:
  _input:
    description: Flags and their values.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: SGLang arguments for a release
  ansible.builtin.debug:
    msg: "{{ {'model-path': '/root/models/Qwen3.6-27B', 'tp-size': 2, 'enable-metrics': true} | pivot.ops.cli_flags }}"
  # -> ['--model-path', '/root/models/Qwen3.6-27B', '--tp-size', '2', '--enable-metrics']
"""

RETURN = r"""
_value:
  description: The argument list.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError


def _flag(key):
    if not isinstance(key, str) or not key.strip("-"):
        raise AnsibleFilterError("cli_flags: flag names must be non-empty strings, got %r" % (key,))
    return key if key.startswith("--") else "--" + key


def _value(key, value):
    if isinstance(value, (dict, set)):
        raise AnsibleFilterError("cli_flags: the value of %s must be a scalar or a list, got %r" % (key, value))
    return str(value)


def cli_flags(flags):
    """Flags dictionary -> argv list (see DOCUMENTATION)."""
    if not isinstance(flags, dict):
        raise AnsibleFilterError("cli_flags: expected a dictionary of flags, got %s" % type(flags).__name__)
    argv = []
    for key, value in flags.items():
        if value is None or value is False:
            continue
        flag = _flag(key)
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv.append(flag)
            argv.extend(_value(key, item) for item in value)
        else:
            argv.extend([flag, _value(key, value)])
    return argv


class FilterModule(object):
    def filters(self):
        return {"cli_flags": cli_flags}
