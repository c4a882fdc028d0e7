# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""stop_training run end to end in-process against real fake-trainer process trees."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time

import pytest
from ansible_collections.pivot.ops.plugins.module_utils import state_dir
from ansible_collections.pivot.ops.plugins.module_utils.systemd_unit import STATE_PROPERTIES
from ansible_collections.pivot.ops.plugins.modules import stop_training

FAST = {"poll_interval": 0.05, "grace_period": 3, "kill_timeout": 5}


def select(trainers, role: str = "single") -> list:
    """cmdline_match that picks exactly this test's process of ``role``."""
    return [trainers.token, role]


def checkpoint_opts(tmp_path, **overrides) -> dict:
    options = {"path": str(tmp_path / "ckpt"), "glob": "step_*", "marker": "COMPLETE", "timeout": 10}
    options.update(overrides)
    return options


def trainer_args(tmp_path, *extra: str) -> list:
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    return ["--ckpt-dir", str(tmp_path / "ckpt"), "--marker", "COMPLETE", "--log", str(tmp_path / "train.log"), *extra]


def signals_of(result: dict, pid: int) -> list:
    return next((entry["signals"] for entry in result["signals"] if entry["pid"] == pid), [])


def test_cooperative_job_checkpoints_then_stops(run_module, trainers, tmp_path, alive):
    popen = trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "signal"))
    result = run_module(
        stop_training.main,
        dict(
            FAST,
            cmdline_match=select(trainers),
            checkpoint=checkpoint_opts(tmp_path),
            log_file=str(tmp_path / "train.log"),
        ),
    )
    assert result["failed"] is False, result["msg"]
    assert result["changed"] is True
    assert [entry["pid"] for entry in result["pids"]] == [popen.pid]
    assert result["pids"][0]["matched_by"] == "selected"
    assert signals_of(result, popen.pid) == ["SIGUSR1", "SIGTERM"]
    assert result["sigkill_needed"] is False
    assert result["remaining"] == []
    checkpoint = result["checkpoint"]
    assert os.path.exists(os.path.join(checkpoint["path"], "COMPLETE"))
    assert checkpoint["step"] == int(os.path.basename(checkpoint["path"]).split("_")[1])
    assert checkpoint["requested_at"] <= checkpoint["completed_at"]
    assert result["last_step"] >= checkpoint["step"]
    assert f"step={result['last_step']}" in result["last_log_line"]
    assert set(result["timings"]) >= {"discover", "checkpoint", "sigterm", "sigkill", "total"}
    assert not alive(popen.pid)

    second = run_module(stop_training.main, dict(FAST, cmdline_match=select(trainers)))
    assert second["failed"] is False
    assert second["changed"] is False
    assert "No process of the job is running" in second["msg"]


def test_job_ignoring_sigterm_is_killed_after_grace(run_module, trainers, tmp_path, alive):
    popen = trainers.start("single", "--ignore-term")
    result = run_module(stop_training.main, dict(FAST, cmdline_match=select(trainers), grace_period=0.5))
    assert result["failed"] is False, result["msg"]
    assert result["sigkill_needed"] is True
    assert signals_of(result, popen.pid) == ["SIGTERM", "SIGKILL"]
    assert result["timings"]["sigterm"] >= 0.5
    assert not alive(popen.pid)


def test_checkpoint_that_never_lands_leaves_job_running(run_module, trainers, tmp_path, alive):
    # The trainer installs a SIGUSR1 handler but never writes a checkpoint.
    (tmp_path / "ckpt").mkdir()
    popen = trainers.start("single", "--checkpoint", "signal")  # no --ckpt-dir: it never saves
    result = run_module(
        stop_training.main,
        dict(FAST, cmdline_match=select(trainers), checkpoint=checkpoint_opts(tmp_path, timeout=0.5)),
    )
    assert result["failed"] is True
    assert "No new complete checkpoint" in result["msg"]
    assert "left running" in result["msg"]
    assert signals_of(result, popen.pid) == ["SIGUSR1"]
    assert result["checkpoint"]["path"] is None
    assert alive(popen.pid)


def test_checkpoint_timeout_with_force_stops_anyway(run_module, trainers, tmp_path, alive):
    popen = trainers.start("single", "--checkpoint", "signal")
    (tmp_path / "ckpt").mkdir()
    result = run_module(
        stop_training.main,
        dict(FAST, cmdline_match=select(trainers), force=True, checkpoint=checkpoint_opts(tmp_path, timeout=0.3)),
    )
    assert result["failed"] is False, result["msg"]
    assert any("force=true" in warning for warning in result["warnings"])
    assert signals_of(result, popen.pid) == ["SIGUSR1", "SIGTERM"]
    assert not alive(popen.pid)
    assert result["forced"] is True and result["work_lost"]["last_checkpoint"] is None
    assert result["msg"].startswith("FORCED STOP WITHOUT A NEW CHECKPOINT: resume from no checkpoint at all")


def test_a_forced_stop_says_which_checkpoint_to_resume_from_and_how_many_steps_are_lost(
    run_module, trainers, tmp_path, alive
):
    """The trainer never saves (no SIGUSR1 checkpoint lands); force=true stops it and the result says so loudly."""
    for step in (3000, 4000):
        (tmp_path / "ckpt" / f"step_{step}").mkdir(parents=True)
        (tmp_path / "ckpt" / f"step_{step}" / "COMPLETE").write_text("")
    (tmp_path / "ckpt" / "step_4500").mkdir()  # a half-written one does not count
    log = tmp_path / "train.log"
    log.write_text("".join(f"[1m] step={step} loss=0.5\n" for step in range(5000, 5382)))
    popen = trainers.start("single", "--checkpoint", "signal")
    result = run_module(
        stop_training.main,
        dict(FAST, cmdline_match=select(trainers), force=True, log_file=str(log),
             checkpoint=checkpoint_opts(tmp_path, timeout=0.3)),
    )
    assert result["failed"] is False, result["msg"]
    assert not alive(popen.pid)
    assert result["previous_checkpoint"] == {"path": str(tmp_path / "ckpt" / "step_4000"), "step": 4000}
    lost = result["work_lost"]
    assert (lost["last_checkpoint_step"], lost["last_logged_step"], lost["steps_lost"]) == (4000, 5381, 1381)
    assert "No new complete checkpoint" in lost["reason"]
    expected = (f"FORCED STOP WITHOUT A NEW CHECKPOINT: resume from {tmp_path / 'ckpt' / 'step_4000'} (step 4000); "
                "the log had reached step 5381, so 1381 steps of training are lost.")
    assert result["msg"].startswith(expected)
    assert expected in result["warnings"]


def test_a_stop_that_was_not_forced_reports_no_lost_work(run_module, trainers, tmp_path):
    trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "signal"))
    result = run_module(
        stop_training.main,
        dict(FAST, cmdline_match=select(trainers), force=True, checkpoint=checkpoint_opts(tmp_path)),
    )
    assert result["failed"] is False, result["msg"]
    assert "forced" not in result and "work_lost" not in result
    assert result["previous_checkpoint"] == {"path": None, "step": None}


def test_slow_checkpoint_within_timeout(run_module, trainers, tmp_path):
    trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "signal", "--ckpt-delay", "1.0"))
    result = run_module(
        stop_training.main,
        dict(FAST, cmdline_match=select(trainers), checkpoint=checkpoint_opts(tmp_path, timeout=8)),
    )
    assert result["failed"] is False, result["msg"]
    assert result["timings"]["checkpoint"] >= 1.0
    assert os.path.exists(os.path.join(result["checkpoint"]["path"], "COMPLETE"))


def test_stable_size_completion_without_marker(run_module, trainers, tmp_path):
    trainers.start("single", "--checkpoint", "signal", "--ckpt-dir", str(tmp_path / "ckpt"))
    (tmp_path / "ckpt").mkdir()
    result = run_module(
        stop_training.main,
        dict(
            FAST,
            cmdline_match=select(trainers),
            checkpoint={"path": str(tmp_path / "ckpt"), "glob": "step_*", "stable_seconds": 0.3, "timeout": 8},
        ),
    )
    assert result["failed"] is False, result["msg"]
    assert result["checkpoint"]["size_bytes"] == 4096


def test_trigger_file_request_and_cleanup(run_module, trainers, tmp_path):
    trigger = tmp_path / "SAVE_NOW"
    trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "file", "--trigger", str(trigger)))
    result = run_module(
        stop_training.main,
        dict(
            FAST,
            cmdline_match=select(trainers),
            checkpoint=checkpoint_opts(tmp_path, request="file", trigger_file=str(trigger)),
        ),
    )
    assert result["failed"] is False, result["msg"]
    assert result["checkpoint"]["step"] is not None
    assert not trigger.exists()
    assert all(entry["signals"] == ["SIGTERM"] for entry in result["signals"])


def test_torchrun_like_job_with_workers_in_own_sessions(run_module, trainers, tmp_path, alive):
    # agent + 2 workers (own sessions) + one dataloader child per worker = 5 processes.
    trainers.start(
        "agent", *trainer_args(tmp_path, "--workers", "2", "--children", "1", "--checkpoint", "signal"), ready=5
    )
    job = trainers.ready()
    agent = trainers.ready("agent")[0]
    workers = trainers.ready("worker")
    result = run_module(
        stop_training.main,
        dict(
            FAST,
            cmdline_match=select(trainers, "agent"),
            match_env=["TORCHELASTIC_RUN_ID"],
            checkpoint=checkpoint_opts(tmp_path),
        ),
    )
    assert result["failed"] is False, result["msg"]
    assert sorted(entry["pid"] for entry in result["pids"]) == job
    # SIGUSR1 goes only to processes with a handler: the workers, not the agent (it would die of it).
    assert sorted(entry["pid"] for entry in result["signals"] if "SIGUSR1" in entry["signals"]) == workers
    assert "SIGUSR1" not in signals_of(result, agent)
    assert result["checkpoint"]["step"] is not None
    assert result["remaining"] == []
    assert not [pid for pid in job if alive(pid)]


@pytest.mark.parametrize("subreaper", [False, True], ids=["reparent-to-init", "reparent-to-subreaper"])
def test_orphans_reparented_during_stop_are_still_killed(run_module, trainers, tmp_path, alive, subreaper):
    # The agent exits at once on SIGTERM without forwarding it; the workers die of SIGTERM, but their dataloader
    # children ignore it and are re-parented to PID 1 (or to the subreaper) while the module is still stopping.
    options = ["--workers", "2", "--children", "1", "--children-ignore-term", "--agent-abandons"]
    if subreaper:
        trainers.start("subreaper", "--then=agent", *options, ready=6)
    else:
        trainers.start("agent", *options, ready=5)
    dataloaders = trainers.ready("dataloader")
    result = run_module(stop_training.main, dict(FAST, grace_period=0.8, cmdline_match=select(trainers, "agent")))
    assert result["failed"] is False, result["msg"]
    assert result["sigkill_needed"] is True
    for pid in dataloaders:
        assert signals_of(result, pid) == ["SIGTERM", "SIGKILL"]
        assert not alive(pid)
    if subreaper:
        assert alive(trainers.ready("subreaper")[0]), "the subreaper is not part of the job"


def test_orphaned_workers_found_by_fixed_environment_value(run_module, trainers, tmp_path, alive):
    trainers.start("agent", "--workers", "2", ready=3)
    agent = trainers.ready("agent")[0]
    workers = trainers.ready("worker")
    os.kill(agent, 9)
    deadline = time.monotonic() + 5
    while alive(agent) and time.monotonic() < deadline:
        time.sleep(0.02)
    result = run_module(
        stop_training.main,
        dict(FAST, cmdline_match=select(trainers, "agent"), match_env=["TORCHELASTIC_RUN_ID=run-" + trainers.token]),
    )
    assert result["failed"] is False, result["msg"]
    assert sorted(entry["pid"] for entry in result["pids"]) == workers
    assert {entry["matched_by"] for entry in result["pids"]} == {"environment"}
    assert not [pid for pid in workers if alive(pid)]


def test_check_mode_sends_nothing_and_creates_nothing(run_module, trainers, tmp_path, alive):
    trigger = tmp_path / "SAVE_NOW"
    popen = trainers.start("single", "--checkpoint", "file", "--trigger", str(trigger))
    result = run_module(
        stop_training.main,
        dict(
            FAST,
            cmdline_match=select(trainers),
            checkpoint=checkpoint_opts(tmp_path, request="file", trigger_file=str(trigger)),
        ),
        check_mode=True,
        diff=True,
    )
    assert result["failed"] is False, result["msg"]
    assert result["changed"] is True
    assert result["signals"] == []
    assert not trigger.exists()
    assert alive(popen.pid)
    assert any("trigger file" in step for step in result["planned"])
    assert any(step.startswith("SIGTERM 1 process") for step in result["planned"])
    assert result["diff"]["before"].startswith(f"{popen.pid} ")
    assert result["diff"]["after"] == ""


def test_nothing_running_is_unchanged(run_module, tmp_path):
    missing = run_module(stop_training.main, dict(FAST, pidfile=str(tmp_path / "none.pid")))
    assert missing["failed"] is False
    assert missing["changed"] is False
    assert "does not exist" in missing["msg"]
    no_match = run_module(stop_training.main, dict(FAST, cmdline_match=["pivot-unit-no-such-process"]))
    assert no_match["changed"] is False
    assert no_match["pids"] == []


def test_pidfile_job_and_recycled_pid(run_module, trainers, tmp_path, alive):
    popen = trainers.start("single")
    pidfile = tmp_path / "train.pid"
    # A pidfile naming an unrelated live process (PID recycled) is stale when cmdline_match disagrees.
    pidfile.write_text(f"{os.getppid()}\n")
    stale = run_module(stop_training.main, dict(FAST, pidfile=str(pidfile), cmdline_match=select(trainers)))
    assert stale["changed"] is False
    assert "stale" in stale["msg"]
    pidfile.write_text(f"{popen.pid}\n")
    result = run_module(stop_training.main, dict(FAST, pidfile=str(pidfile), cmdline_match=select(trainers)))
    assert result["failed"] is False, result["msg"]
    assert not alive(popen.pid)


def test_pidfile_with_garbage_fails(run_module, tmp_path):
    pidfile = tmp_path / "train.pid"
    pidfile.write_text("not a pid\n")
    result = run_module(stop_training.main, dict(FAST, pidfile=str(pidfile)))
    assert result["failed"] is True
    assert "does not contain a PID" in result["msg"]


@pytest.mark.parametrize("target", ["pid1", "self", "parent"])
def test_refuses_pid1_and_own_ancestors(run_module, tmp_path, target):
    pid = {"pid1": 1, "self": os.getpid(), "parent": os.getppid()}[target]
    pidfile = tmp_path / "train.pid"
    pidfile.write_text(f"{pid}\n")
    result = run_module(stop_training.main, dict(FAST, pidfile=str(pidfile)))
    assert result["failed"] is True
    assert "Refusing to act" in result["msg"]
    assert [candidate["pid"] for candidate in result["candidates"]] == [pid]


def test_ambiguous_match_lists_candidates(run_module, trainers, alive):
    first = trainers.start("single")
    second = trainers.start("single", ready=2)
    result = run_module(stop_training.main, dict(FAST, cmdline_match=select(trainers)))
    assert result["failed"] is True
    assert "ambiguous" in result["msg"]
    assert sorted(candidate["pid"] for candidate in result["candidates"]) == sorted([first.pid, second.pid])
    for popen in (first, second):
        assert f"PID {popen.pid}: " in result["msg"]
        assert alive(popen.pid)
    both = run_module(stop_training.main, dict(FAST, cmdline_match=select(trainers), max_roots=2))
    assert both["failed"] is False, both["msg"]
    assert not alive(first.pid) and not alive(second.pid)


def test_cmdline_match_is_exact_not_substring(run_module, trainers, alive):
    popen = trainers.start("single")
    result = run_module(stop_training.main, dict(FAST, cmdline_match=[trainers.token[:-1], "single"]))
    assert result["changed"] is False
    assert alive(popen.pid)


def test_signal_without_handler_fails_before_anything_is_sent(run_module, trainers, tmp_path, alive):
    popen = trainers.start("single")  # no SIGUSR1 handler: SIGUSR1 would kill it
    (tmp_path / "ckpt").mkdir()
    result = run_module(
        stop_training.main, dict(FAST, cmdline_match=select(trainers), checkpoint=checkpoint_opts(tmp_path))
    )
    assert result["failed"] is True
    assert "No process of the job has a handler for SIGUSR1" in result["msg"]
    assert result["signals"] == []
    assert alive(popen.pid)


def test_check_mode_names_the_processes_the_checkpoint_signal_would_reach(run_module, trainers, tmp_path, alive):
    """What the preflight reads: in check mode, [] for a job without a SIGUSR1 handler, the PIDs for one with."""
    (tmp_path / "ckpt").mkdir()
    bare = trainers.start("single")
    refused = run_module(stop_training.main, dict(FAST, cmdline_match=select(trainers),
                                                  checkpoint=checkpoint_opts(tmp_path)), check_mode=True)
    assert refused["failed"] is False and refused["checkpoint_signal_targets"] == []
    assert any(step.startswith("no process handles SIGUSR1") for step in refused["planned"])
    assert alive(bare.pid)
    bare.kill()
    bare.wait()

    # ready=2: the first trainer's ready file is still there; this one's handler is installed once it writes its own
    handling = trainers.start("single", "--checkpoint", "signal", ready=2)
    planned = run_module(stop_training.main, dict(FAST, cmdline_match=select(trainers),
                                                  checkpoint=checkpoint_opts(tmp_path)), check_mode=True)
    assert planned["checkpoint_signal_targets"] == [handling.pid]
    assert run_module(stop_training.main, dict(FAST, cmdline_match=select(trainers)),
                      check_mode=True)["checkpoint_signal_targets"] is None


def test_invalid_regex_fails_before_signalling(run_module, trainers, tmp_path, alive):
    popen = trainers.start("single")
    result = run_module(
        stop_training.main,
        dict(FAST, cmdline_match=select(trainers), log_file=str(tmp_path / "x.log"), log_step_regex="step=(\\d+"),
    )
    assert result["failed"] is True
    assert "not a valid regular expression" in result["msg"]
    assert alive(popen.pid)


def test_unit_selection_uses_systemctl_and_cgroup(run_module, monkeypatch, tmp_path):
    """Constructed: a fake /proc where PIDs 500 and 501 live in the unit's cgroup (v1 hybrid and v2 notation)."""
    proc = tmp_path / "proc"
    for pid, ppid, cgroup in (
        (500, 1, "0::/system.slice/trainer.service\n"),
        (501, 1, "9:name=systemd:/system.slice/trainer.service/workers\n0::/\n"),
        (502, 1, "0::/system.slice/other.service\n"),
    ):
        (proc / str(pid)).mkdir(parents=True)
        stat = f"{pid} (python3) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {1000 + pid} 0 0\n"
        (proc / str(pid) / "stat").write_text(stat)
        (proc / str(pid) / "cmdline").write_bytes(b"python3\0train.py\0")
        (proc / str(pid) / "cgroup").write_text(cgroup)
    monkeypatch.setattr(stop_training, "PROC_ROOT", str(proc))
    monkeypatch.setattr(stop_training.AnsibleModule, "get_bin_path", lambda self, *a, **k: "/bin/systemctl")
    calls = []

    def fake_run(self, cmd, **kwargs):
        calls.append(cmd)
        return 0, "MainPID=500\nControlGroup=/system.slice/trainer.service\nActiveState=active\nLoadState=loaded\n", ""

    monkeypatch.setattr(stop_training.AnsibleModule, "run_command", fake_run)
    result = run_module(stop_training.main, dict(FAST, unit="trainer.service"), check_mode=True)
    assert result["failed"] is False, result["msg"]
    assert sorted(entry["pid"] for entry in result["pids"]) == [500, 501]
    assert "systemctl stop trainer.service" in result["planned"]
    # One look at the unit (its state, MainPID and ControlGroup among it), and nothing stopped in check mode.
    assert calls == [["/bin/systemctl", "show", *[arg for prop in STATE_PROPERTIES for arg in ("-p", prop)],
                      "trainer.service"]]
    assert {"MainPID", "ControlGroup"} <= set(STATE_PROPERTIES)


def test_unknown_unit_fails(run_module, monkeypatch):
    monkeypatch.setattr(stop_training.AnsibleModule, "get_bin_path", lambda self, *a, **k: "/bin/systemctl")
    monkeypatch.setattr(
        stop_training.AnsibleModule, "run_command", lambda self, cmd, **k: (0, "MainPID=0\nLoadState=not-found\n", "")
    )
    result = run_module(stop_training.main, dict(FAST, unit="typo.service"))
    assert result["failed"] is True
    assert "does not exist" in result["msg"]


def test_without_systemctl_a_unit_cannot_be_selected(run_module, monkeypatch):
    monkeypatch.setattr(stop_training.AnsibleModule, "get_bin_path", lambda self, *a, **k: None)
    result = run_module(stop_training.main, dict(FAST, unit="trainer.service"))
    assert result["failed"] is True
    assert result["msg"] == ("Unit trainer.service needs systemctl, which is not on this host's PATH: run the task on "
                             "the host whose systemd manages the unit. On a host without systemd, select the job with "
                             "pidfile or cmdline_match.")
    assert result["changed"] is False


def test_a_failing_systemctl_stop_fails_before_any_signal(run_module, monkeypatch, tmp_path):
    """Constructed: a fake /proc with one process in the unit's cgroup, under a PID above any kernel's pid_max (no
    signal could reach a real process even if one went out)."""
    pid = 4194400
    (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    (tmp_path / "proc" / str(pid) / "stat").write_text(
        f"{pid} (python3) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1500 0 0\n")
    (tmp_path / "proc" / str(pid) / "cmdline").write_bytes(b"python3\0train.py\0")
    (tmp_path / "proc" / str(pid) / "cgroup").write_text("0::/system.slice/trainer.service\n")
    monkeypatch.setattr(stop_training, "PROC_ROOT", str(tmp_path / "proc"))
    monkeypatch.setattr(stop_training.AnsibleModule, "get_bin_path", lambda self, *a, **k: "/bin/systemctl")
    calls = []

    def fake_run(self, cmd, **kwargs):
        calls.append(cmd[1])
        if cmd[1] == "stop":
            return 1, "", "Failed to stop trainer.service: Access denied"
        return 0, f"MainPID={pid}\nControlGroup=/system.slice/trainer.service\nLoadState=loaded\n", ""

    monkeypatch.setattr(stop_training.AnsibleModule, "run_command", fake_run)
    result = run_module(stop_training.main, dict(FAST, unit="trainer.service"))
    assert result["failed"] is True
    assert result["msg"] == ("systemctl stop trainer.service failed (exit 1): Failed to stop trainer.service: Access "
                             "denied. See 'systemctl status trainer.service' on this host.")
    assert result["rc"] == 1 and result["signals"] == [] and calls == ["show", "stop"]


def test_argument_validation(run_module):
    neither = run_module(stop_training.main, {})
    assert neither["failed"] is True
    assert "one of the following is required" in neither["msg"]
    missing_path = run_module(stop_training.main, {"cmdline_match": ["x"], "checkpoint": {"request": "signal"}})
    assert missing_path["failed"] is True
    assert "path" in missing_path["msg"]
    negative = run_module(stop_training.main, {"cmdline_match": ["x"], "grace_period": -1})
    assert negative["failed"] is True
    assert "grace_period" in negative["msg"]


# --- a stop watched by its controller: heartbeat, host lock, host records, progress ---------------------------------


def supervised(tmp_path, **extra) -> dict:
    """The options the stop_training role adds: state dir, heartbeat and progress files, run id."""
    state = tmp_path / "state"
    options = dict(state_dir=str(state), heartbeat_file=str(state / "session-1.heartbeat"), heartbeat_timeout=60,
                   progress_file=str(state / "session-1.progress.json"), run_id="run-7")
    options.update(extra)
    return options


def record_of(result: dict) -> dict:
    with open(result["host_record"]) as handle:
        return json.load(handle)


class ControllerLooks:
    """The controller's looks at a running stop, as pivot.ops.async_watch makes them: the heartbeat refreshed every
    0.1 s (never created: the module creates it, and removes it when it ends) until stop()."""

    def __init__(self, heartbeat) -> None:
        self.heartbeat = heartbeat
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.look, daemon=True)
        self.thread.start()

    def look(self) -> None:
        while not self.done.wait(0.1):
            with contextlib.suppress(FileNotFoundError):
                os.utime(self.heartbeat)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


@pytest.fixture
def controller_looks(tmp_path):
    looks = ControllerLooks(tmp_path / "state" / "session-1.heartbeat")
    yield looks
    looks.stop()


@pytest.fixture
def controller_gone(monkeypatch):
    """The controller never polls: the module's own refresh at its start is skipped and the file is old."""

    def stale_touch(self):
        with open(self.path, "a"):
            pass
        os.utime(self.path, (1, 1))

    monkeypatch.setattr(stop_training.Heartbeat, "touch", stale_touch)


def test_a_stop_whose_controller_went_away_before_sigterm_is_cancelled(
    run_module, trainers, tmp_path, alive, controller_gone
):
    trigger = tmp_path / "SAVE_NOW"
    popen = trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "file", "--trigger", str(trigger),
                                                   "--ckpt-delay", "30"))
    result = run_module(
        stop_training.main,
        dict(FAST, **supervised(tmp_path), cmdline_match=select(trainers),
             checkpoint=checkpoint_opts(tmp_path, request="file", trigger_file=str(trigger))),
    )
    assert result["failed"] is True and result["cancelled"] is True
    assert result["msg"].startswith("Cancelled: the controller stopped watching this stop")
    assert "The job was left running; nothing was stopped." in result["msg"]
    assert result["signals"] == [] and result["committed_at"] is None and result["attended"] is False
    assert alive(popen.pid)
    assert not trigger.exists(), "the trigger file it created is removed again"
    record = record_of(result)
    assert (record["outcome"], record["attended"], record["finished_unattended"]) == ("cancelled", False, True)
    assert (record["run_id"], record["msg"]) == ("run-7", result["msg"])
    assert [p["pid"] for p in record["job"]["processes"]] == [popen.pid]
    assert record["job"]["selector"] == {"cmdline_match": select(trainers), "max_roots": 1}
    state = tmp_path / "state"
    assert sorted(os.listdir(state)) == ["lock", "records"], "heartbeat and progress files are removed"


def test_a_cancelled_stop_says_a_checkpoint_request_was_already_sent(
    run_module, trainers, tmp_path, alive, controller_gone
):
    popen = trainers.start("single", "--checkpoint", "signal")  # never saves
    (tmp_path / "ckpt").mkdir()
    result = run_module(
        stop_training.main,
        dict(FAST, **supervised(tmp_path), cmdline_match=select(trainers), checkpoint=checkpoint_opts(tmp_path)),
    )
    assert result["cancelled"] is True
    assert signals_of(result, popen.pid) == ["SIGUSR1"], "a checkpoint request does not end the job"
    assert "A checkpoint request had been sent" in result["msg"]
    assert alive(popen.pid)


def test_a_stop_whose_controller_went_away_after_sigterm_completes_and_says_so(
    run_module, trainers, tmp_path, alive, monkeypatch, *, controller_looks
):
    """The controller is interrupted right after the first SIGTERM: the stop goes on to SIGKILL and records itself."""
    heartbeat = tmp_path / "state" / "session-1.heartbeat"
    commit_to = stop_training.TrainingStop.commit_to

    def commit_then_lose_the_controller(self, what):
        commit_to(self, what)
        controller_looks.stop()
        os.utime(heartbeat, (1, 1))

    monkeypatch.setattr(stop_training.TrainingStop, "commit_to", commit_then_lose_the_controller)
    popen = trainers.start("single", "--ignore-term")
    result = run_module(stop_training.main, dict(FAST, **supervised(tmp_path), cmdline_match=select(trainers),
                                                 grace_period=0.3))
    assert result["failed"] is False, result["msg"]
    assert not alive(popen.pid)
    assert signals_of(result, popen.pid) == ["SIGTERM", "SIGKILL"]
    assert result["attended"] is False and result["committed_at"] is not None
    record = record_of(result)
    assert (record["outcome"], record["finished_unattended"], record["sigkill_needed"]) == ("stopped", True, True)
    assert record["msg"] == result["msg"] and record["committed_at"] == result["committed_at"]


def test_a_checkpoint_that_lands_after_the_controllers_last_look_ends_nothing(
    run_module, trainers, tmp_path, alive, monkeypatch, *, controller_looks
):
    """Ctrl-C while the checkpoint is being written: the heartbeat is still fresh when it lands, but no look comes
    after it, so the stop cancels (the checkpoint is kept) instead of sending SIGTERM behind the user's back."""
    request = stop_training.TrainingStop.request_checkpoint

    def request_then_lose_the_controller(self, *args, **kwargs):
        outcome = request(self, *args, **kwargs)
        controller_looks.stop()  # the user pressed Ctrl-C: no more looks, the heartbeat ages from now
        return outcome

    monkeypatch.setattr(stop_training.TrainingStop, "request_checkpoint", request_then_lose_the_controller)
    popen = trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "signal", "--ckpt-delay", "0.3"))
    result = run_module(stop_training.main, dict(FAST, **supervised(tmp_path, heartbeat_timeout=2),
                                                 cmdline_match=select(trainers), checkpoint=checkpoint_opts(tmp_path)))
    assert result["failed"] is True and result["cancelled"] is True, result["msg"]
    assert result["checkpoint"]["path"], "the checkpoint landed before the heartbeat went stale"
    assert f"The checkpoint it had asked for is complete: {result['checkpoint']['path']}" in result["msg"]
    assert signals_of(result, popen.pid) == ["SIGUSR1"] and result["committed_at"] is None
    assert alive(popen.pid)


def test_a_watched_stop_records_itself_on_the_host(run_module, trainers, tmp_path, controller_looks):
    trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "signal"))
    log = tmp_path / "train.log"
    result = run_module(
        stop_training.main,
        dict(FAST, **supervised(tmp_path), cmdline_match=select(trainers), checkpoint=checkpoint_opts(tmp_path),
             log_file=str(log)),
    )
    assert result["failed"] is False, result["msg"]
    assert result["attended"] is True
    record = record_of(result)
    assert os.path.dirname(result["host_record"]) == str(tmp_path / "state" / "records")
    assert (record["outcome"], record["attended"], record["finished_unattended"]) == ("stopped", True, False)
    assert record["checkpoint"] == result["checkpoint"] and record["checkpoint"]["path"]
    assert record["last_logged_step"] == result["last_step"] and record["log_file"] == str(log)
    assert record["previous_checkpoint"] == {"path": None, "step": None}
    assert (record["forced"], record["work_lost"]) == (False, None)
    assert oct(os.stat(result["host_record"]).st_mode & 0o777) == "0o600"


def test_nothing_to_stop_leaves_no_record(run_module, tmp_path):
    result = run_module(stop_training.main, dict(FAST, **supervised(tmp_path), cmdline_match=["pivot-unit-none"]))
    assert result["changed"] is False and result["host_record"] is None
    assert os.listdir(tmp_path / "state" / "records") == []


def test_a_stop_waits_for_the_lock_of_an_earlier_one_and_then_refuses(
    run_module, trainers, tmp_path, alive, monkeypatch
):
    """An earlier stop still holds the host: the new one waits (limit forced to 0 here) and fails naming it."""
    monkeypatch.setattr(stop_training, "LOCK_WAIT_MARGIN", 0.0)
    popen = trainers.start("single")
    state = tmp_path / "state"
    os.makedirs(state / "records")
    progress = state / "session-0.progress.json"
    progress.write_text(json.dumps({"line": "SIGTERM sent: waiting for the job to exit, 12 s of 60"}))
    earlier = stop_training.HostLock(str(state))
    earlier.try_acquire({"pid": 4242, "run_id": "run-6", "started_at": "2026-11-30T15:34:01Z",
                         "progress_file": str(progress)})
    try:
        result = run_module(stop_training.main, dict(FAST, **supervised(tmp_path, heartbeat_timeout=0),
                                                     grace_period=0, kill_timeout=0, cmdline_match=select(trainers)))
    finally:
        earlier.release()
    assert result["failed"] is True
    assert result["msg"].startswith("Another training stop is still running on this host (PID 4242, run run-6, "
                                    "started 2026-11-30T15:34:01Z)")
    assert "it reports: SIGTERM sent: waiting for the job to exit, 12 s of 60" in result["msg"]
    assert result["signals"] == [] and result["pids"] == [] and result["host_record"] is None
    assert alive(popen.pid)


@pytest.fixture
def former_state(tmp_path, monkeypatch):
    """The host ran training_stop: its directory holds a record no run imported yet (and the lock file)."""
    former = tmp_path / "training_stop"
    monkeypatch.setattr(state_dir, "FORMER_STATE_DIRS", {str(tmp_path / "state"): str(former)})
    os.makedirs(former / "records")
    (former / "records" / "20261130T153401Z-4242.json").write_text(json.dumps({"outcome": "stopped"}))
    (former / "lock").write_text("")
    return former


def test_the_state_dir_of_the_former_module_name_is_moved_with_its_records(
    run_module, trainers, tmp_path, former_state, controller_looks
):
    trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "signal"))
    result = run_module(stop_training.main, dict(FAST, **supervised(tmp_path), cmdline_match=select(trainers),
                                                 checkpoint=checkpoint_opts(tmp_path)))
    assert result["failed"] is False, result["msg"]
    state = tmp_path / "state"
    assert not former_state.exists()
    assert sorted(os.listdir(state / "records")) == sorted(
        ["20261130T153401Z-4242.json", os.path.basename(result["host_record"])]
    ), "the earlier record waits beside this stop's for the role to import both"


def test_a_stop_of_the_former_module_still_running_is_waited_for_not_moved_away(
    run_module, trainers, tmp_path, alive, former_state
):
    popen = trainers.start("single")
    earlier = stop_training.HostLock(str(former_state))
    earlier.try_acquire({"pid": 4242, "run_id": "run-6", "started_at": "2026-11-30T15:34:01Z"})
    try:
        result = run_module(stop_training.main, dict(FAST, **supervised(tmp_path), cmdline_match=select(trainers)))
        checked = run_module(stop_training.main, dict(FAST, **supervised(tmp_path), cmdline_match=select(trainers)),
                             check_mode=True)
    finally:
        earlier.release()
    assert result["failed"] is True
    assert result["msg"].startswith("A training stop of an earlier Pivot, from before this module was renamed, is "
                                    "still running on this host (PID 4242, run run-6, started 2026-11-30T15:34:01Z; "
                                    f"its state is in {former_state}). Nothing was done.")
    assert result["signals"] == [] and result["pids"] == [] and result["host_record"] is None
    assert alive(popen.pid)
    assert former_state.exists() and not (tmp_path / "state").exists()
    assert checked["failed"] is False, checked["msg"]
    assert checked["planned"][0] == ("wait for the earlier stop still running on this host "
                                     "(PID 4242, run run-6, started 2026-11-30T15:34:01Z)")


def test_check_mode_names_an_earlier_stop_that_holds_the_host(run_module, trainers, tmp_path):
    trainers.start("single")
    state = tmp_path / "state"
    os.makedirs(state)
    earlier = stop_training.HostLock(str(state))
    earlier.try_acquire({"pid": 4242, "run_id": "run-6", "started_at": "2026-11-30T15:34:01Z"})
    try:
        result = run_module(stop_training.main, dict(FAST, **supervised(tmp_path), cmdline_match=select(trainers)),
                            check_mode=True)
    finally:
        earlier.release()
    assert result["failed"] is False, result["msg"]
    assert result["planned"][0] == ("wait for the earlier stop still running on this host "
                                    "(PID 4242, run run-6, started 2026-11-30T15:34:01Z)")
    assert sorted(os.listdir(state)) == ["lock"], "check mode writes no heartbeat, progress or record"
    assert json.loads((state / "lock").read_text())["run_id"] == "run-6", "nor anything into the lock"


def test_progress_lines_tell_the_checkpoint_wait_and_the_sigterm_wait(run_module, trainers, tmp_path, monkeypatch,
                                                                      controller_looks):
    lines = []
    update = stop_training.ProgressFile.update

    def keep(self, stage, line):
        lines.append((stage, line))
        update(self, stage, line)

    monkeypatch.setattr(stop_training.ProgressFile, "update", keep)
    trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "signal", "--ignore-term"))
    result = run_module(stop_training.main, dict(FAST, **supervised(tmp_path), cmdline_match=select(trainers),
                                                 grace_period=0.3, checkpoint=checkpoint_opts(tmp_path)))
    assert result["failed"] is False, result["msg"]
    stages = [stage for stage, _line in lines]
    assert stages[:3] == ["start", "request", "checkpoint"]
    assert lines[1][1] == "requested a checkpoint: SIGUSR1 sent to 1 process(es)"
    waits = [line for stage, line in lines if stage == "checkpoint"]
    assert re.fullmatch(r"waiting for a complete checkpoint newer than the request: \d+ s of 10, "
                        r"(no new one yet|newest step_\d+ \(.+, [\d.]+ K?i?B\))", waits[0]), waits[0]
    sigterm = [line for stage, line in lines if stage == "SIGTERM"]
    assert sigterm and re.fullmatch(r"SIGTERM sent: waiting for the job to exit, \d+ s of 0 grace period, "
                                    r"1 process\(es\) left \(PID \d+ .*python.*\)", sigterm[0]), sigterm[0]


def test_without_a_marker_a_job_that_dies_while_saving_is_not_trusted(run_module, trainers, tmp_path, alive):
    (tmp_path / "ckpt").mkdir()
    popen = trainers.start("single", "--checkpoint", "signal", "--ckpt-dir", str(tmp_path / "ckpt"),
                           "--die-while-saving")
    result = run_module(
        stop_training.main,
        dict(FAST, cmdline_match=select(trainers),
             checkpoint={"path": str(tmp_path / "ckpt"), "glob": "step_*", "settle_seconds": 0.2, "timeout": 20}),
    )
    assert result["failed"] is True
    assert result["msg"].startswith("Every process of the job exited during the checkpoint wait, before this module "
                                    "sent anything that ends it"), result["msg"]
    assert "No checkpoint newer than the request is proven" in result["msg"]
    assert result["msg"].endswith("Nothing was stopped by this module.")
    assert signals_of(result, popen.pid) == ["SIGUSR1"]
    assert result["checkpoint"]["path"] is None


def test_a_trainer_that_dies_with_enospc_while_saving_is_said_to_have_hit_a_full_disk(
    run_module, trainers, tmp_path
):
    """The checkpoint filled the disk: the failure names it, from the trainer's log."""
    (tmp_path / "ckpt").mkdir()
    log = tmp_path / "train.log"
    log.write_text("step 100 loss 2.1\nOSError: [Errno 28] No space left on device: '/x/ckpt/step_101/model.pt'\n")
    trainers.start("single", "--checkpoint", "signal", "--ckpt-dir", str(tmp_path / "ckpt"), "--die-while-saving")
    result = run_module(
        stop_training.main,
        dict(FAST, cmdline_match=select(trainers), log_file=str(log),
             checkpoint={"path": str(tmp_path / "ckpt"), "glob": "step_*", "settle_seconds": 0.2, "timeout": 20}),
    )
    assert result["failed"] is True
    said = ("The training log says the disk is full: \"OSError: [Errno 28] No space left on device: "
            "'/x/ckpt/step_101/model.pt'\". Free space where the checkpoints go (" + str(tmp_path / "ckpt"))
    assert said in result["msg"], result["msg"]
    assert " GiB free now) before the next try." in result["msg"]


def test_check_mode_measures_whether_the_next_checkpoint_fits(run_module, trainers, tmp_path):
    trainers.start("single", *trainer_args(tmp_path, "--checkpoint", "signal"))
    newest = tmp_path / "ckpt" / "step_000200"
    newest.mkdir()
    (newest / "model.pt").write_bytes(b"x" * 4096)
    (newest / "COMPLETE").write_text("done\n")
    result = run_module(stop_training.main, dict(FAST, cmdline_match=select(trainers),
                                                 checkpoint=checkpoint_opts(tmp_path)), check_mode=True)
    space = result["checkpoint_space"]
    assert space["directory"] == str(tmp_path / "ckpt") and space["newest"] == str(newest)
    assert space["newest_bytes"] == 4096 + len("done\n") and space["free_bytes"] > 0
    assert result["signals"] == [], "check mode sends nothing"
