#!/usr/bin/python
# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: service_health
short_description: Wait until a systemd service answers its HTTP health check, and stop waiting once it has failed
version_added: 0.1.0
description:
  - Polls O(url) until it answers with one of O(status_code) or O(timeout) passes, like M(ansible.builtin.uri) with
    C(until), but also reads the systemd unit that serves it between polls.
  - When systemd has given up on the unit (C(failed), for example after its start limit, or C(inactive)) on two
    polls in a row, the wait ends at once and the task fails. A server that crashes while loading a model would
    otherwise keep the task waiting for the whole timeout, which for a large model is half an hour, with nothing
    serving.
  - While the unit is still starting or waiting to restart (C(activating), C(auto-restart)), the wait goes on, since a
    restart may succeed.
  - Every failure message names the unit's state and restart count, the last answer from O(url), and ends with the
    last O(log_lines) lines the unit's processes wrote to the journal (C(journalctl _SYSTEMD_UNIT=...)), where the
    cause usually is. systemd's own lines about the unit are left out; after a few restarts they would fill the tail.
  - Read-only; check mode runs the same wait.
author:
  - Pivot developers (@pivot)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; check mode runs it normally, including the wait.
  diff_mode:
    support: none
  platform:
    platforms: linux
    details: Needs C(systemctl) and C(journalctl) on the target.
options:
  unit:
    description:
      - The systemd unit that serves O(url), for example C(sglang.service).
      - A unit systemd does not know fails the task at once.
    type: str
    required: true
  url:
    description:
      - The health endpoint, for example C(http://127.0.0.1:30000/health_generate).
    type: str
    required: true
  status_code:
    description:
      - HTTP status codes that count as healthy.
    type: list
    elements: int
    default: [200]
  headers:
    description:
      - Headers sent with each request, for example an C(Authorization) header. Kept out of logs.
    type: dict
    default: {}
  timeout:
    description:
      - Seconds to wait for a healthy answer while the unit is alive. Allow for the model's loading time.
    type: float
    default: 1800
  poll_interval:
    description:
      - Seconds between two polls.
    type: float
    default: 2
  request_timeout:
    description:
      - Seconds one request may take. A server that accepts connections but hangs counts as not healthy yet.
    type: float
    default: 30
  validate_certs:
    description:
      - Whether to verify the server's TLS certificate for an C(https) O(url).
    type: bool
    default: true
  log_lines:
    description:
      - How many lines of the unit's own output in the journal a failure message ends with. V(0) leaves them out.
    type: int
    default: 8
seealso:
  - module: ansible.builtin.uri
  - module: ansible.builtin.systemd_service
"""

EXAMPLES = r"""
- name: Wait for SGLang to load its model and answer a generation health check
  pivot.ops.service_health:
    unit: sglang.service
    url: http://127.0.0.1:30000/health_generate
    timeout: 1800

- name: A quick liveness check of a server that should already run
  pivot.ops.service_health:
    unit: sglang.service
    url: http://127.0.0.1:30000/health
    timeout: 30
    poll_interval: 1
  register: health

- name: Show how long the server took
  ansible.builtin.debug:
    msg: "healthy after {{ health.waited }} s and {{ health.unit.restarts }} restarts"
"""

RETURN = r"""
msg:
  description: What happened, in one sentence; on failure, also the end of the unit's journal.
  returned: always
  type: str
  sample: sglang.service answered http://127.0.0.1:30000/health_generate with 200 after 42.0 s.
healthy:
  description: Whether O(url) answered with one of O(status_code).
  returned: always
  type: bool
  sample: true
waited:
  description: Seconds from the first poll to the last.
  returned: always
  type: float
  sample: 42.0
attempts:
  description: Number of requests made.
  returned: always
  type: int
  sample: 21
http_status:
  description: Status code of the last answer; null when the last request got no HTTP answer.
  returned: always
  type: int
  sample: 200
last_error:
  description: Why the last request was not healthy (connection refused, time-out, status); empty when healthy.
  returned: always
  type: str
  sample: "[Errno 111] Connection refused"
unit_failed:
  description: Whether the wait ended because systemd had given up on the unit, rather than on the timeout.
  returned: always
  type: bool
  sample: false
unit:
  description: The unit's state at the last poll.
  returned: always
  type: dict
  contains:
    load_state:
      description: C(loaded), C(not-found), ...
      type: str
    active_state:
      description: C(active), C(activating), C(failed), C(inactive), ...
      type: str
    sub_state:
      description: C(running), C(auto-restart), C(failed), C(dead), ...
      type: str
    result:
      description: Why it last stopped (C(success), C(exit-code), C(start-limit-hit), ...).
      type: str
    restarts:
      description: Automatic restarts since the unit was last started by hand (C(NRestarts)).
      type: int
    main_pid:
      description: PID of the main process; V(0) when none runs.
      type: int
    exec_main_status:
      description: Exit status of the last main process.
      type: int
  sample: {load_state: loaded, active_state: active, sub_state: running, result: success, restarts: 0,
           main_pid: 4242, exec_main_status: 0}
log_tail:
  description: The last O(log_lines) lines the unit's processes wrote to the journal.
  returned: when the service did not become healthy
  type: list
  elements: str
  sample: ["safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata"]
"""

import time
from http.client import HTTPException
from urllib.error import HTTPError, URLError

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.pivot.ops.plugins.module_utils.systemd_unit import (
    SystemdError,
    SystemdUnit,
    UnitStatus,
)

# Polls in a row on which the unit must look stopped before the wait gives up: one look can fall between the
# stop and the start of a restart that someone else runs.
STOPPED_POLLS_TO_GIVE_UP = 2


def http_answer(url: str, headers: dict, request_timeout: float, validate_certs: bool) -> tuple:
    """(status or None, error text). Any HTTP status is an answer; only transport failures have no status."""
    try:
        response = open_url(url, headers=headers, timeout=request_timeout, validate_certs=validate_certs,
                            follow_redirects="none")
        return response.getcode(), ""
    except HTTPError as error:
        return error.code, "HTTP %d" % error.code
    except URLError as error:
        return None, str(error.reason)
    except (OSError, HTTPException) as error:  # time-outs, resets, a peer that closes without an answer
        return None, str(error) or type(error).__name__


class HealthWait:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.systemd = SystemdUnit(module, self.params["unit"])
        self.result = {"changed": False, "healthy": False, "waited": 0.0, "attempts": 0, "http_status": None,
                       "last_error": "", "unit_failed": False, "unit": {}}

    def unit_status(self) -> UnitStatus:
        try:
            status = self.systemd.status()
        except SystemdError as exc:
            status = exc.status  # set when systemd does not know the unit
            if status is not None:
                self.result["unit"] = status.as_dict()
            self.module.fail_json(msg=str(exc), **exc.details(), **self.result)
        self.result["unit"] = status.as_dict()
        return status

    def log_tail(self) -> list:
        return self.systemd.journal_tail(self.params["log_lines"])

    def poll(self) -> bool:
        params = self.params
        status, error = http_answer(
            params["url"], params["headers"], params["request_timeout"], params["validate_certs"]
        )
        self.result["attempts"] += 1
        self.result["http_status"] = status
        healthy = status in params["status_code"]
        self.result["last_error"] = "" if healthy else error
        return healthy

    def fail(self, reason: str, status: UnitStatus) -> None:
        tail = self.log_tail()
        self.result["log_tail"] = tail
        answer = self.result["last_error"] or "no answer"
        msg = "%s %s (%s: %s; unit %s)." % (self.params["unit"], reason, self.params["url"], answer, status.describe())
        if tail:
            msg += " Its log ends: " + " | ".join(tail)
        elif self.params["log_lines"] > 0:
            msg += " Its journal is empty or unreadable (journalctl _SYSTEMD_UNIT=%s)." % self.params["unit"]
        self.module.fail_json(msg=msg, **self.result)

    def run(self) -> None:
        started = time.monotonic()
        deadline = started + self.params["timeout"]
        stopped_polls = 0
        while True:
            healthy = self.poll()
            status = self.unit_status()
            self.result["waited"] = round(time.monotonic() - started, 1)
            if healthy:
                self.result["healthy"] = True
                msg = "%s answered %s with %s after %.1f s." % (
                    self.params["unit"], self.params["url"], self.result["http_status"], self.result["waited"])
                self.module.exit_json(msg=msg, **self.result)
            stopped_polls = stopped_polls + 1 if status.stopped else 0
            if stopped_polls >= STOPPED_POLLS_TO_GIVE_UP:
                self.result["unit_failed"] = True
                self.fail("stopped before it became healthy: systemd will not start it again by itself (after %.0f s)"
                          % self.result["waited"], status)
            if time.monotonic() + self.params["poll_interval"] > deadline:
                self.fail("did not become healthy within %g s" % self.params["timeout"], status)
            time.sleep(self.params["poll_interval"])


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "url": {"type": "str", "required": True},
            "status_code": {"type": "list", "elements": "int", "default": [200]},
            "headers": {"type": "dict", "default": {}, "no_log": True},
            "timeout": {"type": "float", "default": 1800},
            "poll_interval": {"type": "float", "default": 2},
            "request_timeout": {"type": "float", "default": 30},
            "validate_certs": {"type": "bool", "default": True},
            "log_lines": {"type": "int", "default": 8},
        },
        supports_check_mode=True,
    )
    for name in ("timeout", "poll_interval", "request_timeout"):
        if module.params[name] <= 0:
            module.fail_json(msg="%s must be greater than 0, got %s." % (name, module.params[name]))
    HealthWait(module).run()


if __name__ == "__main__":
    main()
