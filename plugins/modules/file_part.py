#!/usr/bin/python
# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: file_part
short_description: Copy a large file from the controller to the host one part at a time
version_added: 0.1.0
description:
  - Copies the bytes O(offset) to O(offset) + O(size) of the controller's file O(src) to the host, appending them to
    O(dest) with the suffix C(.pivot-part). Looped over a file's parts in order (the P(pivot.ops.file_parts#filter)
    filter lists them), it copies the whole file with one task result, and so one line of output, per part, where
    M(ansible.builtin.copy) prints nothing until a file of several hundred MB has crossed a slow link.
  - The last part checks the SHA-256 of the whole copy against the controller's file and only then moves it to
    O(dest); a copy that does not match is removed and the task fails, so O(dest) is never a partial file.
  - A part that does not continue the copy (its O(offset) is not the size the copy has reached) fails and says to
    start again from the first part.
  - When O(dest) already holds the controller's file, every part reports no change and copies nothing.
  - Runs as an action plugin on the controller, which reads and ships the part, and this module on the host, which
    writes it.
author:
  - Pivot developers (@pivot)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  # its FQCN form (ansible.builtin.action_common_attributes.files) is not found by ansible-core 2.21
  - action_common_attributes.files
  - ansible.builtin.files
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Compares O(dest) with O(src) and reports what it would copy; ships and writes nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
  safe_file_operations:
    support: full
  vault:
    support: none
    details: O(src) is copied as it is on the controller, never decrypted.
options:
  src:
    description: The file on the controller (relative paths are looked up like M(ansible.builtin.copy)'s).
    type: path
    required: true
  dest:
    description: The file on the host. Its directory must exist.
    type: path
    required: true
  offset:
    description: Where this part starts in O(src), in bytes. The first part starts at V(0).
    type: int
    default: 0
  size:
    description: How many bytes this part holds. Unset, the rest of the file from O(offset).
    type: int
  _total:
    description: Internal, set by the action plugin from O(src) (the whole file's size); never set it yourself.
    type: int
  _sha256:
    description: Internal, set by the action plugin for the last part (the whole file's SHA-256); never set it yourself.
    type: str
notes:
  - The parts of one file must be copied in order, by one task looping over them, and nothing else may write O(dest)
    meanwhile.
seealso:
  - module: ansible.builtin.copy
  - plugin: pivot.ops.file_parts
    plugin_type: filter
"""

EXAMPLES = r"""
- name: Ship the wheels, 64 MiB at a time
  pivot.ops.file_part:
    src: "/srv/wheelhouse/{{ item.name }}"
    dest: "/opt/pivot/wheelhouse/{{ item.name }}"
    offset: "{{ item.offset }}"
    size: "{{ item.size }}"
    mode: "0644"
  loop: "{{ wheels | pivot.ops.file_parts(64 * 1048576) }}"
  loop_control:
    label: "{{ item.name }} part {{ item.part }} of {{ item.parts }}"
"""

RETURN = r"""
dest:
  description: The file on the host.
  returned: always
  type: str
  sample: /opt/pivot/wheelhouse/torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl
copied:
  description: Bytes of the file now on the host (the end of this part; the whole size once O(dest) is in place).
  returned: always
  type: int
  sample: 201326592
total:
  description: The size of the whole file.
  returned: always
  type: int
  sample: 554618695
complete:
  description: Whether O(dest) now holds the whole file (after the last part, or when it already did).
  returned: always
  type: bool
sha256:
  description: The SHA-256 of the whole file, checked on the host; returned with the last part.
  returned: when complete is true and a part was written
  type: str
  sample: 9f3c1d0e5b2a7c4f8e6d1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d
"""

import os

from ansible.module_utils.basic import AnsibleModule

PARTIAL_SUFFIX = ".pivot-part"
READ_BLOCK = 8 << 20


def continuation_problem(partial: str, offset: int) -> str:
    """Why a part at ``offset`` cannot be appended to ``partial`` ("" when it can)."""
    if offset == 0:
        return ""
    reached = os.path.getsize(partial) if os.path.exists(partial) else 0
    if reached == offset:
        return ""
    return (f"the part at byte {offset} does not continue the copy in {partial}, which holds {reached} bytes: the "
            "parts must be copied in order from offset 0; run the task again from the first part")


def append_part(part: str, partial: str, offset: int) -> None:
    with open(part, "rb") as source, open(partial, "r+b" if offset else "wb") as target:
        target.seek(offset)
        for block in iter(lambda: source.read(READ_BLOCK), b""):
            target.write(block)


def run_module() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "offset": {"type": "int", "default": 0},
            "size": {"type": "int"},
            # set by the action plugin: the whole file's size, and its SHA-256 with the last part
            "_total": {"type": "int"},
            "_sha256": {"type": "str"},
        },
        add_file_common_args=True,
        supports_check_mode=True,
    )
    params = module.params
    if params["_total"] is None:
        module.fail_json(msg="the file's size (_total) is missing, which the action plugin pivot.ops.file_part passes: "
                             "call the module by that name, not as ansible.legacy.file_part")
    dest, offset, total = params["dest"], params["offset"], params["_total"]
    size = params["size"] if params["size"] is not None else total - offset
    partial = dest + PARTIAL_SUFFIX
    last = offset + size == total
    # a refusal leaves dest as it was
    result = {"dest": dest, "copied": offset, "total": total, "complete": False, "changed": False}
    arrived = os.path.getsize(params["src"])
    if arrived != size:
        module.fail_json(msg=f"the part of {dest} at byte {offset} arrived with {arrived} bytes, not {size}: the "
                             "copy was cut short; run the task again", **result)
    problem = continuation_problem(partial, offset)
    if problem:
        module.fail_json(msg=problem, **result)
    result.update(changed=True, copied=offset + size)
    if module.check_mode:
        module.exit_json(**result)
    append_part(params["src"], partial, offset)
    if not last:
        module.exit_json(**result)
    if not params["_sha256"]:
        module.fail_json(msg="the last part needs the whole file's SHA-256 (_sha256), which the action plugin "
                             "pivot.ops.file_part passes: call the module by that name, not as "
                             "ansible.legacy.file_part", **result)
    copied = module.digest_from_file(partial, "sha256")
    if copied != params["_sha256"]:
        os.unlink(partial)
        result.update(changed=False, copied=0)
        module.fail_json(msg=f"the copy of {dest} does not match the controller's file (SHA-256 {copied}, expected "
                             f"{params['_sha256']}): it changed on the controller during the copy, or a part was "
                             "damaged; the copy was removed, run the task again from the first part", **result)
    module.atomic_move(partial, dest)
    file_args = module.load_file_common_arguments(params, path=dest)
    module.set_fs_attributes_if_different(file_args, True)
    result.update(complete=True, sha256=copied)
    module.exit_json(**result)


def main() -> None:
    run_module()


if __name__ == "__main__":
    main()
