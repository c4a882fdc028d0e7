# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The pivot.ops.progress stdout callback: a progress line instead of FAILED - RETRYING, not too often."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ansible_collections.pivot.ops.plugins.callback.progress import CallbackModule, ProgressThrottle, stage_of


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def retry(host: str, data: dict, task_uuid: str = "t1") -> SimpleNamespace:
    task = SimpleNamespace(_uuid=task_uuid, delegate_to=None, get_name=lambda: "Wait for the stop")
    return SimpleNamespace(result={"retries": 100, "attempts": 3, **data}, task=task, task_name="Wait for the stop",
                           host=SimpleNamespace(get_name=lambda: host))


@pytest.fixture
def callback(monkeypatch):
    plugin = CallbackModule()
    plugin._plugin_options = {"progress_interval": 15.0}  # what set_options() takes from the documented default
    shown = []
    monkeypatch.setattr(plugin._display, "display", lambda msg, **_kwargs: shown.append(msg))
    clock = Clock()
    plugin._progress_throttle = ProgressThrottle(15.0, clock=clock)
    return plugin, shown, clock


def test_a_retry_with_progress_prints_the_line_for_its_host(callback):
    plugin, shown, _clock = callback
    line = ("waiting for a complete checkpoint newer than the request: 120 s of 900, "
            "newest step_000005400 (growing, 1.2 GiB)")
    plugin.v2_runner_retry(retry("ct200", {"progress": line}))
    assert shown == ["ct200: " + line]


def test_lines_of_one_stage_come_at_most_every_interval(callback):
    plugin, shown, clock = callback
    for second in range(0, 61, 5):
        clock.now = second
        plugin.v2_runner_retry(retry("ct200", {"progress": f"waiting: {second} s of 900", "stage": "checkpoint"}))
    assert shown == ["ct200: waiting: 0 s of 900", "ct200: waiting: 15 s of 900", "ct200: waiting: 30 s of 900",
                     "ct200: waiting: 45 s of 900", "ct200: waiting: 60 s of 900"]


def test_a_new_stage_is_printed_at_once_and_hosts_and_tasks_are_apart(callback):
    plugin, shown, clock = callback
    plugin.v2_runner_retry(retry("ct200", {"progress": "waiting for a checkpoint: 0 s"}))
    clock.now = 5
    plugin.v2_runner_retry(retry("ct200", {"progress": "SIGTERM sent: 0 s of 60"}))
    plugin.v2_runner_retry(retry("pro6000", {"progress": "waiting for health: 5 s"}))
    plugin.v2_runner_retry(retry("ct200", {"progress": "SIGTERM sent: 0 s of 60"}, task_uuid="t2"))
    plugin.v2_runner_retry(retry("ct200", {"progress": "SIGTERM sent: 5 s of 60"}))
    assert shown == ["ct200: waiting for a checkpoint: 0 s", "ct200: SIGTERM sent: 0 s of 60",
                     "pro6000: waiting for health: 5 s", "ct200: SIGTERM sent: 0 s of 60"]


def test_a_retry_without_progress_looks_as_with_the_default_callback(callback):
    plugin, shown, _clock = callback
    plugin.v2_runner_retry(retry("ct200", {"rc": 1}))
    assert shown == ["FAILED - RETRYING: [ct200]: Wait for the stop (97 retries left)."]


def test_stage_of():
    assert stage_of({"progress": "SIGTERM sent: 3 s", "stage": "SIGTERM"}) == "SIGTERM"
    assert stage_of({"progress": "waiting for health: 3 s of 1800"}) == "waiting for health"
