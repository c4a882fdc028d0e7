# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What pivot.ops.controller_files accepts and how it writes: its argument spec (the module's documentation stub and
the action plugin both use it) and the writing itself, which the action plugin runs on the controller."""

from __future__ import annotations

import os
import tempfile

ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    files=dict(type="list", elements="dict", default=[], options=dict(
        name=dict(type="str", required=True), content=dict(type="str", required=True))),
    links=dict(type="list", elements="dict", default=[], options=dict(
        name=dict(type="str", required=True), target=dict(type="str", required=True))),
    mode=dict(type="str", default="0644"),
    directory_mode=dict(type="str", default="0755"),
)


class ControllerFilesError(ValueError):
    """An argument that cannot be written as asked; the message says what to change."""


def plain_name(name: str, what: str) -> str:
    """NAME when it is a single path component, else ControllerFilesError naming WHAT it was for."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ControllerFilesError("%s %r is not a plain file name: give a single path component, without '/' (the "
                                   "directory is 'path')" % (what, name))
    return name


def octal_mode(mode: str, what: str) -> int:
    try:
        value = int(str(mode), 8)
    except ValueError:
        raise ControllerFilesError("%s %r is not an octal mode such as '0644'" % (what, mode)) from None
    if not 0 <= value <= 0o7777:
        raise ControllerFilesError("%s %r is not an octal mode such as '0644'" % (what, mode))
    return value


def file_needs_writing(path: str, data: bytes, mode: int) -> bool:
    try:
        if os.lstat(path).st_mode & 0o7777 != mode or os.path.islink(path):
            return True
        with open(path, "rb") as handle:
            return handle.read() != data
    except OSError:
        return True


def write_file(path: str, data: bytes, mode: int) -> None:
    """DATA into PATH with MODE, through a temporary file in the same directory and a rename."""
    handle, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=os.path.dirname(path))
    try:
        with os.fdopen(handle, "wb") as target:
            target.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def link_needs_making(path: str, target: str) -> bool:
    return not os.path.islink(path) or os.readlink(path) != target


def make_link(path: str, target: str) -> None:
    """PATH as a symbolic link to TARGET, replacing what was there with a rename."""
    temporary = "%s.%d.link" % (path, os.getpid())
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, path)


def write_all(params: dict, check_mode: bool) -> dict:
    """Write PARAMS' files and links (the validated arguments); the paths written and linked, and whether any."""
    directory = params["path"]
    mode = octal_mode(params["mode"], "mode")
    directory_mode = octal_mode(params["directory_mode"], "directory_mode")
    files = [(os.path.join(directory, plain_name(item["name"], "file name")), item["content"].encode("utf-8"))
             for item in params["files"]]
    links = [(os.path.join(directory, plain_name(item["name"], "link name")), plain_name(item["target"], "link target"))
             for item in params["links"]]
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise ControllerFilesError("%s exists and is not a directory: remove it or choose another path" % directory)
    if not os.path.isdir(directory):
        if check_mode:
            return {"changed": True, "written": [path for path, _data in files], "linked": [path for path, _t in links]}
        os.makedirs(directory, mode=directory_mode, exist_ok=True)
    written = [path for path, data in files if file_needs_writing(path, data, mode)]
    linked = [path for path, target in links if link_needs_making(path, target)]
    if not check_mode:
        for path, data in files:
            if path in written:
                write_file(path, data, mode)
        for path, target in links:
            if path in linked:
                make_link(path, target)
    return {"changed": bool(written or linked), "written": written, "linked": linked}
