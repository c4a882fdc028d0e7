# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""pivot.ops.controller_files: writes files and links in one directory on the controller, in the worker's own process
(no module run on any host)."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.pivot.ops.plugins.module_utils.controller_files import (
    ARGUMENT_SPEC,
    ControllerFilesError,
    write_all,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        _validation, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            result.update(write_all(params, bool(self._task.check_mode)))
        except (ControllerFilesError, OSError) as error:
            message = "Could not write the files in %s on the controller: %s" % (params["path"], error)
            raise AnsibleActionFail(message) from error
        return result
