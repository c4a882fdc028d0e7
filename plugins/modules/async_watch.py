#!/usr/bin/python
# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: async_watch
short_description: Watch a task started with async, keep its controller heartbeat fresh, report its progress
version_added: 0.1.0
description:
  - "One look at a task started with C(async) and C(poll: 0), made to run in an C(until) loop on the controller (see
    the example). Each call says whether the task has finished and returns one line of progress; the
    C(pivot.ops.progress) callback prints that line for every retry, instead of C(FAILED - RETRYING)."
  - With O(wait), one look lasts until the task finishes or O(wait) seconds have passed, so the loop notices the end
    at once and needs no C(delay) of its own.
  - With O(heartbeat_file), every call that finds the task still running refreshes that file. A task that must not
    go on without its controller (M(pivot.ops.stop_training)) checks the file's age and cancels what it can still
    cancel when the controller stops polling (Ctrl-C, a lost connection).
  - "The progress line is the task's own (O(progress_file), written by the task) when there is one, else
    C(<label>: <seconds> of <timeout>) counted from the task's start."
  - It does not return the task's result; read it afterwards with M(ansible.builtin.async_status).
author:
  - Pivot developers (@pivot)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads the same files, but does not refresh the heartbeat.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  results_file:
    description:
      - The async task's results file, as its start returned it (C(results_file) of the registered result).
    type: path
    required: true
  heartbeat_file:
    description:
      - File to refresh (create or touch) while the task runs. Removed once the task has finished.
    type: path
  progress_file:
    description:
      - JSON file the task writes its progress to (C(line), and C(stage)); missing or unreadable means no progress of
        its own yet.
    type: path
  label:
    description:
      - What the task does, for the progress line when it writes none of its own.
    type: str
    default: running
  timeout:
    description:
      - The task's time limit in seconds, for the progress line when it writes none of its own (C(40 s of 120)).
    type: float
  wait:
    description:
      - Seconds this call waits for the task to finish, looking at O(results_file) every quarter of a second; it
        returns as soon as the task has finished. V(0) looks once.
      - The heartbeat is refreshed when the call starts, so keep O(wait) several times below the watched task's
        heartbeat timeout.
    type: float
    default: 0
notes:
  - It fails only when O(results_file) holds something other than a job status, or the heartbeat cannot be written;
    a task that ran out of its C(async) time counts as finished (its result says C(Timeout exceeded)).
  - Give the C(until) loop more C(retries) x (O(wait) + C(delay)) than the task's C(async) time, and keep
    O(wait) + C(delay) several times below the watched task's heartbeat timeout.
seealso:
  - module: ansible.builtin.async_status
  - module: pivot.ops.stop_training
"""

EXAMPLES = r"""
- name: Start the long task on the host
  pivot.ops.stop_training:
    cmdline_match: [/root/train_dflash_pipeline.py]
    heartbeat_file: /var/lib/pivot/stop_training/heartbeat-1
    progress_file: /var/lib/pivot/stop_training/progress-1.json
  async: 1800
  poll: 0
  register: started

- name: Wait for it, printing its progress (pivot.ops.progress callback) and keeping its heartbeat fresh
  pivot.ops.async_watch:
    results_file: "{{ started.results_file }}"
    heartbeat_file: /var/lib/pivot/stop_training/heartbeat-1
    progress_file: /var/lib/pivot/stop_training/progress-1.json
    wait: 5
  register: watched
  until: watched.finished
  retries: 400   # > async / wait
  delay: 0

- name: Read its result
  ansible.builtin.async_status:
    jid: "{{ started.ansible_job_id }}"
  register: result

- name: Any async task, without a progress file of its own
  pivot.ops.async_watch:
    results_file: "{{ health.results_file }}"
    label: waiting for sglang.service to answer /health_generate
    timeout: 1800
    wait: 5
  register: watched
  until: watched.finished
  retries: 400
  delay: 0
"""

RETURN = r"""
finished:
  description: Whether the task has ended (successfully or not).
  returned: always
  type: bool
  sample: false
progress:
  description: One line about what the task is doing (the host's name is not in it).
  returned: always
  type: str
  sample: "waiting for a complete checkpoint newer than the request: 120 s of 900, newest step_000005400 (growing,
    1.2 GiB)"
stage:
  description: The task's stage as its progress file names it (V(checkpoint), V(SIGTERM), ...); empty without one.
  returned: always
  type: str
  sample: checkpoint
elapsed:
  description: Seconds since the task started (from its results file), null when unknown.
  returned: always
  type: float
  sample: 120.4
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pivot.ops.plugins.module_utils.progress import (
    Heartbeat,
    read_json,
    remove_quietly,
    waited_text,
)

# Progress older than this is shown with its age: the task may be stuck, or gone without a result.
STALE_PROGRESS_SECONDS = 30.0
# How often a call with a wait looks at the results file.
LOOK_INTERVAL_SECONDS = 0.25


def job_status(results_file: str) -> tuple:
    """(finished, seconds since the task started or None). A results file without ``started`` is the final result,
    as async_wrapper writes it; a missing one is not written yet."""
    data = read_json(results_file)
    if data is None:
        if os.path.exists(results_file):
            raise ValueError("%s is not a job status written by Ansible's async_wrapper" % results_file)
        return False, None
    finished = "started" not in data or bool(data.get("finished"))
    try:
        elapsed = max(0.0, time.time() - os.stat(results_file).st_mtime)
    except OSError:
        elapsed = None
    return finished, None if finished else elapsed


def progress_line(params: dict, elapsed: float | None) -> tuple:
    """(line, stage): the task's own progress, or the generic line from the label."""
    data = read_json(params["progress_file"]) if params["progress_file"] else None
    if data and data.get("line"):
        line = str(data["line"])
        updated = data.get("updated")
        if isinstance(updated, (int, float)) and time.time() - updated > STALE_PROGRESS_SECONDS:
            line += " (no news for %d s)" % (time.time() - updated)
        return line, str(data.get("stage", ""))
    if elapsed is None:
        return "%s: starting" % params["label"], ""
    return "%s: %s" % (params["label"], waited_text(elapsed, params["timeout"])), ""


def wait_for_job(results_file: str, seconds: float, status: tuple, sleep=time.sleep, clock=time.monotonic) -> tuple:
    """job_status once the job has finished or SECONDS have passed, whichever comes first; STATUS is the one read
    just before."""
    deadline = clock() + seconds
    finished, elapsed = status
    while not finished and clock() < deadline:
        sleep(min(LOOK_INTERVAL_SECONDS, max(0.0, deadline - clock())))
        finished, elapsed = job_status(results_file)
    return finished, elapsed


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            results_file=dict(type="path", required=True),
            heartbeat_file=dict(type="path"),
            progress_file=dict(type="path"),
            label=dict(type="str", default="running"),
            timeout=dict(type="float"),
            wait=dict(type="float", default=0),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["wait"] < 0:
        module.fail_json(msg="wait must be 0 (look once) or more seconds, got %s." % params["wait"])
    heartbeat = Heartbeat(params["heartbeat_file"], 0)
    try:
        status = job_status(params["results_file"])
        if not status[0] and not module.check_mode:
            try:
                heartbeat.touch()
            except OSError as exc:
                module.fail_json(msg="Cannot refresh the heartbeat file %s: %s. Without it the task cancels itself; "
                                 "check that its directory exists and is writable." % (params["heartbeat_file"], exc))
        finished, elapsed = wait_for_job(params["results_file"], params["wait"], status)
    except ValueError as exc:
        module.fail_json(msg="%s. Pass the results_file that the task started with async returned." % exc)
    if finished:
        if not module.check_mode:
            remove_quietly(params["heartbeat_file"])
        module.exit_json(changed=False, finished=True, progress="finished", stage="finished", elapsed=None)
    line, stage = progress_line(params, elapsed)
    module.exit_json(changed=False, finished=False, progress=line, stage=stage, elapsed=elapsed)


if __name__ == "__main__":
    main()
