# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""service_health against a real HTTP server on loopback, with systemctl and journalctl scripted per poll and a
fake clock (each poll_interval of sleep advances it), so time-outs of an hour take no time."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest
from ansible_collections.pivot.ops.plugins.module_utils.systemd_unit import UnitStatus
from ansible_collections.pivot.ops.plugins.modules import service_health

UNIT = "sglang.service"
LOG = [
    "  File \"/opt/ml-env/lib/python3.11/site-packages/safetensors/torch.py\", line 359, in load_file",
    "safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata",
    "sglang.service: Main process exited, code=exited, status=1/FAILURE",
]


def show(active: str, sub: str, restarts: int = 0, result: str = "success", load: str = "loaded") -> str:
    return (f"LoadState={load}\nActiveState={active}\nSubState={sub}\nResult={result}\nNRestarts={restarts}\n"
            f"MainPID={4242 if active == 'active' else 0}\nExecMainStatus={0 if result == 'success' else 1}\n")


RUNNING = show("active", "running")
AUTO_RESTART = show("activating", "auto-restart", restarts=1, result="exit-code")
GAVE_UP = show("failed", "failed", restarts=2, result="exit-code")  # as systemd leaves it after its start limit


class HealthServer:
    """Answers GET with the next scripted status (the last one repeats) and records the requests' headers."""

    def __init__(self) -> None:
        self.statuses = [200]
        self.headers: list[dict] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.headers.append(dict(self.headers))
                status = server.statuses.pop(0) if len(server.statuses) > 1 else server.statuses[0]
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/health_generate"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def health_server():
    server = HealthServer()
    yield server
    server.close()


@pytest.fixture
def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/health_generate"


class FakeSystemd:
    """Scripted ``systemctl show`` answers (the last repeats), a journal, and a clock the module's sleep advances."""

    def __init__(self, states: list, journal: list | None = None) -> None:
        self.states = list(states)
        self.journal = LOG if journal is None else journal
        self.calls: list = []
        self.now = 1000.0
        self.show_rc = 0

    def run_command(self, cmd: list) -> tuple:
        self.calls.append(cmd)
        if cmd[1] == "show":
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return (self.show_rc, state, "") if self.show_rc == 0 else (self.show_rc, "", "Failed to connect to bus")
        if cmd[0].endswith("journalctl"):
            return 0, "".join(line + "\n" for line in self.journal), ""
        raise AssertionError(f"unexpected command {cmd}")

    def shows(self) -> int:
        return sum(1 for cmd in self.calls if cmd[1] == "show")

    def journal_reads(self) -> list:
        return [cmd for cmd in self.calls if cmd[0].endswith("journalctl")]


@pytest.fixture
def systemd(monkeypatch):
    def install(states: list, journal: list | None = None) -> FakeSystemd:
        fake = FakeSystemd(states, journal)

        def sleep(seconds: float) -> None:
            fake.now += seconds

        monkeypatch.setattr(service_health.AnsibleModule, "run_command",
                            lambda self, cmd, **kwargs: fake.run_command(cmd))
        monkeypatch.setattr(service_health.AnsibleModule, "get_bin_path",
                            lambda self, name, *a, **k: f"/usr/bin/{name}")
        monkeypatch.setattr(service_health.time, "sleep", sleep)
        monkeypatch.setattr(service_health.time, "monotonic", lambda: fake.now)
        return fake

    return install


def args(url: str, **extra) -> dict:
    return {"unit": UNIT, "url": url, **extra}


def test_a_healthy_server_passes_at_once_without_reading_the_journal(run_module, systemd, health_server):
    fake = systemd([RUNNING])
    result = run_module(service_health.main, args(health_server.url))
    assert result["failed"] is False, result["msg"]
    assert result["changed"] is False
    assert result["healthy"] is True and result["unit_failed"] is False
    assert result["attempts"] == 1 and result["http_status"] == 200 and result["last_error"] == ""
    assert result["unit"]["active_state"] == "active" and result["unit"]["main_pid"] == 4242
    assert result["msg"] == f"{UNIT} answered {health_server.url} with 200 after 0.0 s."
    assert fake.journal_reads() == []
    assert "log_tail" not in result


def test_waits_while_the_model_loads(run_module, systemd, health_server):
    health_server.statuses = [503, 503, 503, 200]
    systemd([show("activating", "start"), show("activating", "start"), RUNNING])
    result = run_module(service_health.main, args(health_server.url, poll_interval=5))
    assert result["failed"] is False, result["msg"]
    assert result["attempts"] == 4 and result["waited"] == 15.0


def test_gives_up_at_once_when_systemd_has_given_up_on_the_unit(run_module, systemd, health_server):
    """A server that crashes while loading: after its start limit the unit is failed, and the wait ends there, not
    after the hour-long timeout."""
    health_server.statuses = [503]
    fake = systemd([AUTO_RESTART, AUTO_RESTART, GAVE_UP])
    result = run_module(service_health.main, args(health_server.url, timeout=3600, poll_interval=2))
    assert result["failed"] is True
    assert result["unit_failed"] is True and result["healthy"] is False
    assert result["attempts"] == 4  # two polls see it restarting, two in a row see it failed
    assert result["waited"] == 6.0
    msg = result["msg"]
    assert msg.startswith(f"{UNIT} stopped before it became healthy: systemd will not start it again by itself")
    assert f"({health_server.url}: HTTP 503; unit failed/failed, 2 restarts, result exit-code)." in msg
    assert msg.endswith("Its log ends: " + " | ".join(LOG))
    assert result["log_tail"] == LOG
    # The server's own lines: systemd's restart messages would push the cause out of the tail.
    assert fake.journal_reads() == [["/usr/bin/journalctl", f"_SYSTEMD_UNIT={UNIT}", "--lines", "8", "--no-pager",
                                     "--output", "cat"]]


def test_a_unit_seen_stopped_once_is_given_another_poll(run_module, systemd, health_server):
    """One look can fall between the stop and the start of a restart someone else runs."""
    health_server.statuses = [503, 503, 200]
    systemd([show("inactive", "dead"), show("activating", "start"), RUNNING])
    result = run_module(service_health.main, args(health_server.url))
    assert result["failed"] is False, result["msg"]
    assert result["attempts"] == 3


def test_a_unit_that_keeps_restarting_is_waited_for_until_the_timeout(run_module, systemd, closed_port_url):
    systemd([AUTO_RESTART])
    result = run_module(service_health.main, args(closed_port_url, timeout=15, poll_interval=2))
    assert result["failed"] is True
    assert result["unit_failed"] is False
    assert result["http_status"] is None and "refused" in result["last_error"].lower()
    assert result["msg"].startswith(f"{UNIT} did not become healthy within 15 s ({closed_port_url}: ")
    assert "; unit activating/auto-restart, 1 restarts, result exit-code). Its log ends: " in result["msg"]
    assert result["attempts"] == 8 and result["waited"] == 14.0  # polls at 0, 2, ..., 14 s; none after the timeout


def test_a_unit_systemd_does_not_know_fails_at_once(run_module, systemd, health_server):
    health_server.statuses = [503]
    systemd([show("inactive", "dead", load="not-found")])
    result = run_module(service_health.main, args(health_server.url))
    assert result["failed"] is True
    assert result["msg"] == f"Unit {UNIT} does not exist on this host; check the unit name (systemctl list-units)."
    assert result["attempts"] == 1


def test_systemctl_failing_is_reported_with_its_message(run_module, systemd, health_server):
    health_server.statuses = [503]
    fake = systemd([RUNNING])
    fake.show_rc = 1
    result = run_module(service_health.main, args(health_server.url))
    assert result["failed"] is True
    assert result["msg"] == (f"systemctl show {UNIT} failed (exit 1): Failed to connect to bus. "
                             f"See 'systemctl status {UNIT}' on this host.")
    assert result["rc"] == 1


def test_without_systemctl_the_task_fails_saying_so(run_module, systemd, health_server, monkeypatch):
    fake = systemd([RUNNING])
    monkeypatch.setattr(service_health.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: None)
    result = run_module(service_health.main, args(health_server.url))
    assert result["failed"] is True
    assert result["msg"] == (f"Unit {UNIT} needs systemctl, which is not on this host's PATH: run the task on the host "
                             "whose systemd manages the unit.")
    assert fake.calls == []


def test_without_journalctl_the_failure_says_the_journal_is_unreadable(run_module, systemd, health_server,
                                                                       monkeypatch):
    health_server.statuses = [503]
    fake = systemd([GAVE_UP])
    monkeypatch.setattr(service_health.AnsibleModule, "get_bin_path",
                        lambda self, name, *a, **k: None if name == "journalctl" else f"/usr/bin/{name}")
    result = run_module(service_health.main, args(health_server.url))
    assert result["unit_failed"] is True and result["log_tail"] == []
    assert result["msg"].endswith(f"Its journal is empty or unreadable (journalctl _SYSTEMD_UNIT={UNIT}).")
    assert fake.journal_reads() == []


def test_headers_are_sent_and_kept_out_of_the_result(run_module, systemd, health_server):
    systemd([RUNNING])
    secret = "Bearer s3cr3t-key"
    result = run_module(service_health.main, args(health_server.url, headers={"Authorization": secret}))
    assert result["failed"] is False, result["msg"]
    assert health_server.headers[0]["Authorization"] == secret
    assert secret not in repr(result)


def test_other_status_codes_can_count_as_healthy(run_module, systemd, health_server):
    health_server.statuses = [204]
    systemd([RUNNING])
    result = run_module(service_health.main, args(health_server.url, status_code=[200, 204]))
    assert result["failed"] is False and result["http_status"] == 204


def test_without_log_lines_the_journal_is_not_read(run_module, systemd, health_server):
    health_server.statuses = [503]
    fake = systemd([GAVE_UP])
    result = run_module(service_health.main, args(health_server.url, log_lines=0))
    assert result["failed"] is True and result["unit_failed"] is True
    assert "Its log ends" not in result["msg"] and result["log_tail"] == []
    assert fake.journal_reads() == []


def test_an_empty_journal_is_said_so(run_module, systemd, health_server):
    health_server.statuses = [503]
    systemd([GAVE_UP], journal=[])
    result = run_module(service_health.main, args(health_server.url))
    assert result["msg"].endswith(f"Its journal is empty or unreadable (journalctl _SYSTEMD_UNIT={UNIT}).")


def test_check_mode_waits_the_same_way(run_module, systemd, health_server):
    health_server.statuses = [503, 200]
    systemd([RUNNING])
    result = run_module(service_health.main, args(health_server.url), check_mode=True)
    assert result["failed"] is False and result["attempts"] == 2


@pytest.mark.parametrize("name", ["timeout", "poll_interval", "request_timeout"])
def test_non_positive_times_are_refused(run_module, systemd, health_server, name):
    systemd([RUNNING])
    result = run_module(service_health.main, args(health_server.url, **{name: 0}))
    assert result["failed"] is True
    assert result["msg"] == f"{name} must be greater than 0, got 0.0."


def test_unit_status_reads_what_systemctl_show_prints():
    status = UnitStatus.from_show(GAVE_UP + "Description=SGLang = fast\n")
    assert status.stopped is True
    assert status.describe() == "failed/failed, 2 restarts, result exit-code"
    assert UnitStatus.from_show(AUTO_RESTART).stopped is False
    assert UnitStatus.from_show(RUNNING).describe() == "active/running, 0 restarts"
    assert UnitStatus.from_show("").describe() == "?/?, ? restarts"
