# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: file_parts
short_description: The parts a list of files is copied in, for a loop over M(pivot.ops.file_part)
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Given files as C(name) and C(bytes), returns one item per part of at most O(part_bytes) bytes, in order, each the
    file's own keys plus C(offset), C(size), C(part) (from 1) and C(parts). An empty file is one part of 0 bytes.
options:
  _input:
    description: The files, each a dictionary with at least C(bytes), its size.
    type: list
    elements: dict
    required: true
  part_bytes:
    description: The most bytes in one part.
    type: int
    required: true
"""

EXAMPLES = r"""
- name: Where torch's wheel is cut into 64 MiB parts
  ansible.builtin.debug:
    msg: "{{ wheels | pivot.ops.file_parts(64 * 1048576) | map(attribute='offset') }}"
  vars:
    wheels: [{name: torch.whl, bytes: 554618695}]
  # -> 9 offsets, 0, 67108864, ..., 536870912; the last part holds 17747783 bytes
"""

RETURN = r"""
_value:
  description: One dictionary per part.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError


def file_parts(files, part_bytes):
    """Files -> their parts (see DOCUMENTATION)."""
    if not isinstance(part_bytes, int) or isinstance(part_bytes, bool) or part_bytes < 1:
        raise AnsibleFilterError("file_parts: part_bytes must be a whole number of bytes above 0, got %r"
                                 % (part_bytes,))
    items = []
    for entry in files:
        size = entry.get("bytes") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise AnsibleFilterError("file_parts: each file needs its size in bytes as 'bytes', got %r" % (entry,))
        parts = max(1, -(-size // part_bytes))
        for index in range(parts):
            offset = index * part_bytes
            items.append(dict(entry, offset=offset, size=min(part_bytes, size - offset), part=index + 1, parts=parts))
    return items


class FilterModule(object):
    def filters(self):
        return {"file_parts": file_parts}
