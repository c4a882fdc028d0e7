# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The controller's half of pivot.ops.file_part: read one part of the file, ship it, let the module write it."""

from __future__ import annotations

import hashlib
import os
import tempfile

from ansible import constants as C
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible.utils.hashing import checksum as sha1_checksum
from ansible.utils.hashing import secure_hash

READ_BLOCK = 8 << 20
OWN_ARGS = ("src", "dest", "offset", "size")


def part_bounds(total: int, offset: object, size: object) -> tuple[int, int]:
    """(offset, size) of a part of a ``total``-byte file, checked; the size defaults to the rest of the file."""
    try:
        start = int(offset if offset is not None else 0)
        length = int(size) if size is not None else total - start
    except (TypeError, ValueError) as error:
        raise AnsibleActionFail(f"offset and size must be whole numbers of bytes: {error}") from error
    if start < 0 or length < 0 or start + length > total or (length == 0 and total > 0):
        raise AnsibleActionFail(f"the part at byte {start} of {length} bytes is not within the {total}-byte file "
                                "(offset from 0, size above 0, the part inside the file)")
    return start, length


def write_part(src: str, offset: int, size: int) -> str:
    """The bytes of ``src`` from ``offset``, ``size`` of them, in a temporary file on the controller."""
    handle, path = tempfile.mkstemp(prefix="pivot-part-", dir=C.DEFAULT_LOCAL_TMP)
    with open(src, "rb") as source, os.fdopen(handle, "wb") as target:
        source.seek(offset)
        left = size
        while left:
            block = source.read(min(READ_BLOCK, left))
            if not block:
                raise AnsibleActionFail(f"{src} ended at byte {offset + size - left}, before the part did: it "
                                        "changed during the copy")
            target.write(block)
            left -= len(block)
    return path


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        try:
            result.update(self._copy_part(task_vars or {}))
        except AnsibleActionFail as error:
            result.update(failed=True, msg=to_text(error.message))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _copy_part(self, task_vars: dict) -> dict:
        args = self._task.args
        if not args.get("src") or not args.get("dest"):
            raise AnsibleActionFail("src (the file on the controller) and dest (the file on the host) are required")
        try:
            src = self._find_needle("files", args["src"])
        except AnsibleError as error:
            raise AnsibleActionFail(to_text(error.message)) from error
        dest = args["dest"]
        total = os.path.getsize(src)
        offset, size = part_bounds(total, args.get("offset"), args.get("size"))
        unchanged = {"changed": False, "dest": dest, "copied": total, "total": total, "complete": True}
        if self._holds_file(dest, src, total, task_vars):
            return unchanged
        if self._task.check_mode:
            return {"changed": True, "dest": dest, "copied": offset + size, "total": total,
                    "complete": offset + size == total}
        whole = offset == 0 and size == total
        local_part = src if whole else write_part(src, offset, size)
        try:
            remote_part = self._connection._shell.join_path(self._connection._shell.tmpdir, "part")
            self._transfer_file(local_part, remote_part)
        finally:
            if not whole:
                os.unlink(local_part)
        self._fixup_perms2((self._connection._shell.tmpdir, remote_part))
        module_args = {key: value for key, value in args.items() if key not in OWN_ARGS}
        module_args.update(src=remote_part, dest=dest, offset=offset, size=size, _total=total,
                           _sha256=secure_hash(src, hashlib.sha256) if offset + size == total else None)
        return self._execute_module(module_name="pivot.ops.file_part", module_args=module_args, task_vars=task_vars)

    def _holds_file(self, dest: str, src: str, total: int, task_vars: dict) -> bool:
        """Whether ``dest`` already is the controller's file (hashed only when its size already matches)."""
        status = self._execute_remote_stat(dest, all_vars=task_vars, follow=True, checksum=False)
        if not status["exists"] or status.get("isdir") or status.get("size") != total:
            return False
        status = self._execute_remote_stat(dest, all_vars=task_vars, follow=True, checksum=True)
        return status["checksum"] == sha1_checksum(src)
