# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: progress
type: stdout
short_description: The default output, with a line of progress for every retry of a long wait
version_added: 0.1.0
description:
  - "Prints what C(ansible.builtin.default) prints, except for the retries of an C(until) loop whose result carries a
    C(progress) string (as M(pivot.ops.async_watch) returns). For those it prints C(<host>: <progress>), for example
    'ct200: waiting for a complete checkpoint newer than the request: 120 s of 900, newest step_000005400 (growing,
    1.2 GiB)', instead of 'FAILED - RETRYING: [ct200]: ... (178 retries left)'."
  - A progress line is printed on the first retry of a task, whenever its stage changes (the C(stage) in the result,
    else the text before the first colon), and otherwise at most every O(progress_interval) seconds per host and task.
  - Retries without C(progress) look as they do with the default callback.
author:
  - Pivot developers (@pivot)
extends_documentation_fragment:
  - default_callback
  - result_format_callback
options:
  progress_interval:
    description:
      - Least seconds between two progress lines of one host and task at the same stage; V(0) prints every retry.
    type: float
    default: 15
    ini:
      - section: callback_progress
        key: interval
    env:
      - name: PIVOT_PROGRESS_INTERVAL
requirements:
  - set as the stdout callback (C(stdout_callback = pivot.ops.progress) in C(ansible.cfg))
"""

import time

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallbackModule


def stage_of(result: dict) -> str:
    """The stage a progress result is in: its own ``stage``, else the text of ``progress`` before the first colon."""
    stage = result.get("stage")
    if stage:
        return str(stage)
    return str(result.get("progress", "")).split(":", 1)[0]


class ProgressThrottle:
    """Decides which progress lines to print: first per (host, task), on every stage change, else after
    ``interval`` seconds."""

    def __init__(self, interval: float, clock=time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.last = {}  # (host, task) -> (stage, clock of the last printed line)

    def should_print(self, key: tuple, stage: str) -> bool:
        now = self.clock()
        previous = self.last.get(key)
        if previous is not None and previous[0] == stage and now - previous[1] < self.interval:
            return False
        self.last[key] = (stage, now)
        return True


class CallbackModule(DefaultCallbackModule):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "pivot.ops.progress"

    def __init__(self) -> None:
        super().__init__()
        self._progress_throttle = None

    def _throttle(self) -> ProgressThrottle:
        if self._progress_throttle is None:
            self._progress_throttle = ProgressThrottle(float(self.get_option("progress_interval")))
        return self._progress_throttle

    def v2_runner_retry(self, result) -> None:
        data = result.result
        progress = data.get("progress")
        if not isinstance(progress, str) or not progress:
            super().v2_runner_retry(result)
            return
        host = self.host_label(result)
        if self._throttle().should_print((host, result.task._uuid), stage_of(data)):
            self._display.display("%s: %s" % (host, progress), color=C.COLOR_DEBUG)
