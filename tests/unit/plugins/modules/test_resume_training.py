# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""resume_training with real processes (tests/unit/support/resume_trainer.py, started by the module) and an
nvidia-smi double whose GPUs hold memory exactly while the test's trainer runs, as the driver's do."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import yaml
from ansible_collections.pivot.ops.plugins.module_utils import state_dir
from ansible_collections.pivot.ops.plugins.modules import resume_training
from conftest import live_pids_with_argument

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "support")
UUIDS = ("GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111")
STEP = 400


class World:
    """A checkpoint directory, a log, the host's state dir and a trainer script under a name unique to the test."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.trainer = str(tmp_path / f"trainer_{uuid.uuid4().hex[:10]}.py")
        shutil.copy(os.path.join(SUPPORT, "resume_trainer.py"), self.trainer)
        self.checkpoints = tmp_path / "checkpoints"
        self.checkpoint = self.save(STEP)
        self.log = tmp_path / "train.log"
        self.log.write_text("[9m] step=512 loss=--- (before the stop)\n")
        self.state_dir = tmp_path / "state"
        self.output = tmp_path / "out" / "nohup.out"
        self.holders = []  # (pid, name, MiB) compute processes nvidia-smi lists besides the trainer

    def save(self, step: int):
        path = self.checkpoints / f"step_{step:09d}"
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"m" * 4096)
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        (path / "COMPLETE").write_text("{}")
        return path

    def size(self, path) -> int:
        return sum(item.stat().st_size for item in path.iterdir())

    def args(self, *flags: str, **overrides) -> dict:
        args = {
            "checkpoint": str(self.checkpoint),
            "checkpoint_size_bytes": self.size(self.checkpoint),
            "checkpoint_marker": "COMPLETE",
            "checkpoint_glob": "step_*",
            "command": [sys.executable, self.trainer, "--log", str(self.log), "--resume", "{checkpoint}", *flags],
            "chdir": str(self.tmp_path),
            "output_file": str(self.output),
            "pidfile": str(self.tmp_path / "run" / "train.pid"),
            "job": {"cmdline_match": [self.trainer]},
            "log_file": str(self.log),
            "gpus": [0, 1],
            "gpu_free_timeout": 0,
            "timeout": 15,
            "poll_interval": 0.05,
            "state_dir": str(self.state_dir),
            "run_id": "run-1",
        }
        args.update(overrides)
        return args

    def job_pids(self) -> list:
        return live_pids_with_argument(self.trainer)

    def start_by_hand(self, *flags: str) -> subprocess.Popen:
        """The same trainer started without Pivot, the way an operator does."""
        popen = subprocess.Popen([sys.executable, self.trainer, "--log", str(self.log), *flags],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while not self.job_pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        return popen

    def smi(self, cmd: list) -> tuple:
        """nvidia-smi: each GPU holds 61440 MiB while the trainer runs, plus what the holders hold."""
        pids = self.job_pids()  # read once: the job may exit between two reads
        running = bool(pids)
        if cmd[1].startswith("--query-gpu="):
            lines = []
            for index, gpu_uuid in enumerate(UUIDS):
                used = (61449 if running else 0) + sum(mib + 9 for _pid, _name, mib in self.holders if index == 0)
                lines.append(f"{index}, {gpu_uuid}, NVIDIA H200, {used}, 143771, {143157 - used}, 0")
            return 0, "\n".join(lines) + "\n", ""
        apps = [f"{pid}, {name}, {mib}, {UUIDS[0]}" for pid, name, mib in self.holders]
        if running:
            apps += [f"{pids[0]}, python3, 61440, {gpu_uuid}" for gpu_uuid in UUIDS]
        return 0, "\n".join(apps) + ("\n" if apps else ""), ""

    def cleanup(self) -> None:
        for pid in self.job_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def world(tmp_path, monkeypatch):
    world = World(tmp_path)
    calls = []

    def run_command(self, cmd, **kwargs):
        calls.append(cmd)
        if os.path.basename(cmd[0]) == "nvidia-smi":
            return world.smi(cmd)
        raise AssertionError(f"unexpected command {cmd}")

    monkeypatch.setattr(resume_training.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(resume_training.AnsibleModule, "get_bin_path",
                        lambda self, name, *a, **k: f"/usr/bin/{name}")
    world.calls = calls
    yield world
    world.cleanup()


def read_record(world) -> dict:
    return json.loads((world.state_dir / "resume.json").read_text())


# --- the resume and its second run -------------------------------------------------------------------------------


def test_resumes_from_the_checkpoint_and_waits_until_it_trains(run_module, world):
    result = run_module(resume_training.main, world.args("--workers", "2"), diff=True)
    assert result["failed"] is False, result["msg"]
    assert result["changed"] is True and result["launched"] is True and result["already_running"] is False
    assert result["first_step"] == STEP + 1 and result["last_step"] > STEP
    assert result["msg"].startswith(f"Started the training job from checkpoint {world.checkpoint} (step 400): PID ")
    assert "GPUs in use 2 of 2" in result["msg"]
    assert result["command"][5] == str(world.checkpoint)
    assert result["launch_command"][:2] == ["setsid", "nohup"]
    assert result["diff"]["before"] == "no training job is running\n"
    assert str(world.checkpoint) in result["diff"]["after"]
    pids = world.job_pids()
    assert result["pid"] in pids and len(pids) == 3
    record = read_record(world)
    assert (record["pid"], record["sid"], record["checkpoint"], record["run_id"]) == (
        result["pid"], result["pid"], str(world.checkpoint), "run-1")
    assert record["log_offset"] == len("[9m] step=512 loss=--- (before the stop)\n")
    assert (world.tmp_path / "run" / "train.pid").read_text() == f"{result['pid']}\n"
    assert "resuming at step 400" in world.output.read_text()
    assert oct(os.stat(world.state_dir / "resume.json").st_mode & 0o777) == "0o600"


def test_the_job_outlives_the_module_in_a_session_of_its_own(run_module, world):
    handler_before = signal.getsignal(signal.SIGHUP)
    result = run_module(resume_training.main, world.args())
    assert result["failed"] is False, result["msg"]
    with open(f"/proc/{result['pid']}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    assert int(fields[3]) == result["pid"] != os.getsid(0)  # its own session: the connection's end does not reach it
    with open(f"/proc/{result['pid']}/status") as handle:
        ignored = int(next(line for line in handle if line.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGHUP - 1))
    assert signal.getsignal(signal.SIGHUP) == handler_before  # the module's own handler is back


def test_a_second_run_finds_the_job_it_started_and_changes_nothing(run_module, world):
    first = run_module(resume_training.main, world.args("--workers", "1"))
    assert first["failed"] is False, first["msg"]
    pids = world.job_pids()
    second = run_module(resume_training.main, world.args("--workers", "1"), diff=True)
    assert second["failed"] is False, second["msg"]
    assert second["changed"] is False and second["already_running"] is True and second["launched"] is False
    assert second["pid"] == first["pid"]
    assert second["msg"].startswith(f"The training job Pivot started from {world.checkpoint} (run run-1 at ")
    assert second["diff"]["before"] == second["diff"]["after"]
    assert world.job_pids() == pids


def test_check_mode_on_the_running_job_reports_it_without_a_change(run_module, world):
    assert run_module(resume_training.main, world.args())["failed"] is False
    checked = run_module(resume_training.main, world.args(), check_mode=True)
    assert checked["failed"] is False, checked["msg"]
    assert checked["changed"] is False and checked["already_running"] is True
    assert checked["msg"].endswith("Nothing to do.")


def test_the_job_started_under_the_former_module_name_is_recognised_and_its_record_moved(
    run_module, world, monkeypatch
):
    """A host that ran training_resume keeps its record in that module's directory: the renamed module adopts it."""
    former = world.tmp_path / "training_resume"
    monkeypatch.setattr(state_dir, "FORMER_STATE_DIRS", {str(world.state_dir): str(former)})
    first = run_module(resume_training.main, world.args(state_dir=str(former)))
    assert first["failed"] is False, first["msg"]
    checked = run_module(resume_training.main, world.args(), check_mode=True)
    assert checked["already_running"] is True and checked["changed"] is False, checked["msg"]
    assert former.exists() and not world.state_dir.exists(), "check mode reads the record where it is"
    second = run_module(resume_training.main, world.args())
    assert second["failed"] is False, second["msg"]
    assert second["changed"] is False and second["already_running"] is True and second["pid"] == first["pid"]
    assert second["host_record"] == str(world.state_dir / "resume.json")
    assert not former.exists() and read_record(world)["pid"] == first["pid"]


def test_a_job_pivot_started_from_another_checkpoint_is_not_restarted(run_module, world):
    assert run_module(resume_training.main, world.args())["failed"] is False
    newer = world.save(STEP + 400)
    pids = world.job_pids()
    result = run_module(resume_training.main, world.args(checkpoint=str(newer), checkpoint_size_bytes=None))
    assert result["failed"] is True
    assert f"is running from checkpoint {world.checkpoint}, not from {newer}" in result["msg"]
    assert "stop the running job first" in result["msg"]
    assert world.job_pids() == pids


# --- refusals: nothing is started --------------------------------------------------------------------------------


def test_a_job_pivot_did_not_start_is_refused_not_duplicated(run_module, world):
    world.start_by_hand()
    pids = world.job_pids()
    result = run_module(resume_training.main, world.args())
    assert result["failed"] is True
    assert result["msg"].startswith(f"A training job is already running on this host that Pivot did not start: "
                                    f"PID {pids[0]} ")
    assert "Refusing to start a second trainer; nothing was started." in result["msg"]
    assert result["processes"][0]["pid"] == pids[0]
    assert world.job_pids() == pids
    assert not (world.state_dir / "resume.json").exists()


def test_a_job_started_by_hand_after_pivots_own_is_refused_naming_pivots(run_module, world):
    first = run_module(resume_training.main, world.args())
    assert first["failed"] is False, first["msg"]
    os.kill(first["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while world.job_pids() and time.monotonic() < deadline:
        time.sleep(0.02)
    world.start_by_hand()
    result = run_module(resume_training.main, world.args())
    assert result["failed"] is True
    assert f"(Pivot's last start on this host, run run-1 at {first['started_at']}, PID {first['pid']}, is not among " \
           "them.)" in result["msg"]


@pytest.mark.parametrize(("damage", "problem"), [
    ("remove", "is gone: nothing is at that path any more"),
    ("unmark", "is incomplete: its completion marker COMPLETE is missing"),
    ("grow", "changed since the stop confirmed it"),
])
def test_a_checkpoint_that_is_gone_or_incomplete_refuses(run_module, world, damage, problem):
    args = world.args()
    if damage == "remove":
        shutil.rmtree(world.checkpoint)
    elif damage == "unmark":
        (world.checkpoint / "COMPLETE").unlink()
    else:
        (world.checkpoint / "optimizer.pt").write_bytes(b"o")
    result = run_module(resume_training.main, args)
    assert result["failed"] is True
    assert result["msg"].startswith(f"The checkpoint to resume from, {world.checkpoint}, {problem}")
    assert "Nothing was started." in result["msg"]
    assert world.job_pids() == []


def test_a_checkpoint_without_marker_or_recorded_size_is_resumed_once_it_settled(run_module, world):
    (world.checkpoint / "COMPLETE").unlink()  # a trainer that writes no marker, a checkpoint named for this run
    args = world.args(checkpoint_marker=None, checkpoint_size_bytes=None, checkpoint_settle_seconds=0.5)
    result = run_module(resume_training.main, args)
    assert result["failed"] is False, result["msg"]
    assert result["launched"] is True
    assert result["timings"]["checks"] >= 0.5, "it watched the checkpoint settle before starting anything"


def test_a_checkpoint_without_marker_still_being_written_is_refused(run_module, world):
    (world.checkpoint / "COMPLETE").unlink()
    stop = threading.Event()

    def copy_goes_on() -> None:  # the checkpoint is still being copied back
        while not stop.is_set():
            with (world.checkpoint / "model.safetensors").open("ab") as handle:
                handle.write(b"m" * 64)
            time.sleep(0.05)

    copier = threading.Thread(target=copy_goes_on, daemon=True)
    copier.start()
    try:
        result = run_module(resume_training.main, world.args(checkpoint_marker=None, checkpoint_size_bytes=None,
                                                             checkpoint_settle_seconds=0.4))
    finally:
        stop.set()
        copier.join()
    assert result["failed"] is True
    assert result["msg"].startswith(f"The checkpoint to resume from, {world.checkpoint}, has not settled within ")
    assert ("s: with no marker and no size recorded by a stop, it counts as complete once its files stay unchanged "
            "for settle_seconds (0.4 s) with none open for writing; last seen: step_000000400 (") in result["msg"]
    assert "Nothing was started." in result["msg"]
    assert world.job_pids() == [] and not world.state_dir.joinpath("resume.json").exists()


def test_newer_checkpoints_refuse_unless_allowed(run_module, world):
    newer = world.save(STEP + 600)
    result = run_module(resume_training.main, world.args())
    assert result["failed"] is True
    assert f"lie beside it: {newer}. Training ran after the stop that recorded it" in result["msg"]
    assert result["newer_checkpoints"] == [str(newer)]
    assert world.job_pids() == []
    allowed = run_module(resume_training.main, world.args(allow_newer_checkpoints=True))
    assert allowed["failed"] is False, allowed["msg"]


def test_gpus_still_held_refuse_naming_the_holder(run_module, world):
    world.holders.append((os.getpid(), "python3", 4096))
    result = run_module(resume_training.main, world.args())
    assert result["failed"] is True
    assert result["msg"].startswith("The training GPUs are not free, so the job was not started: GPU 0 (NVIDIA H200) "
                                    f"uses 4105 MiB (limit 1024 MiB); compute processes: PID {os.getpid()} ")
    assert "(4096 MiB)" in result["msg"] and "then run again" in result["msg"]
    assert result["gpu_problems"] and world.job_pids() == []


def test_gpus_held_by_an_allowed_process_do_not_refuse(run_module, world):
    world.holders.append((os.getpid(), "dcgm-exporter", 200))
    result = run_module(resume_training.main, world.args(allowed_gpu_process_names=["dcgm-exporter"]))
    assert result["failed"] is False, result["msg"]


def test_a_step_the_checkpoint_does_not_know_cannot_be_passed(run_module, world):
    latest = world.checkpoints / "latest"
    args = world.args(checkpoint=str(latest), checkpoint_size_bytes=None, command=["run.sh", "--step", "{step}"])
    world.checkpoint.rename(latest)
    result = run_module(resume_training.main, args)
    assert result["failed"] is True
    assert "uses {step}, but the step of checkpoint" in result["msg"]


# --- check mode ---------------------------------------------------------------------------------------------------


def test_check_mode_makes_every_check_and_starts_nothing(run_module, world):
    result = run_module(resume_training.main, world.args(), check_mode=True, diff=True)
    assert result["failed"] is False, result["msg"]
    assert result["changed"] is True and result["launched"] is False
    assert result["msg"].startswith(f"Would start the training job from checkpoint {world.checkpoint} (step 400): "
                                    "setsid nohup ")
    assert str(world.checkpoint) in result["diff"]["after"]
    assert world.job_pids() == []
    assert not world.state_dir.exists() and not world.output.exists()


def test_check_mode_reports_the_same_refusals(run_module, world):
    world.holders.append((os.getpid(), "python3", 4096))
    result = run_module(resume_training.main, world.args(gpu_free_timeout=30), check_mode=True)
    assert result["failed"] is True and "The training GPUs are not free" in result["msg"]
    assert result["timings"]["total"] < 10  # one reading: check mode does not wait


def test_check_mode_with_systemd_run_shows_the_transient_unit(run_module, world):
    result = run_module(resume_training.main, world.args(launcher="systemd-run", unit="dflash-training",
                                                         environment={"NCCL_DEBUG": "WARN"}), check_mode=True)
    assert result["failed"] is False, result["msg"]
    command = result["launch_command"]
    assert command[:5] == ["systemd-run", "--unit=dflash-training.service", "--collect", "--quiet",
                           "--property=Type=exec"]
    assert f"--working-directory={world.tmp_path}" in command and "--setenv=NCCL_DEBUG=WARN" in command
    assert f"--property=StandardOutput=append:{world.output}" in command
    assert command[command.index("--") + 1:] == result["command"]


# --- a start that goes wrong ----------------------------------------------------------------------------------


def test_a_job_that_exits_fails_with_the_end_of_its_output(run_module, world):
    result = run_module(resume_training.main, world.args("--die"))
    assert result["failed"] is True
    assert result["msg"].startswith(f"The training job started from {world.checkpoint} exited with status 3 before it "
                                    "trained: the job exited: no process of it is left.")
    assert "error: cannot load the checkpoint (simulated)" in result["msg"]
    assert result["changed"] is True and world.job_pids() == []


def test_a_job_that_starts_over_is_stopped_again(run_module, world):
    result = run_module(resume_training.main, world.args("--scratch", "--workers", "1"))
    assert result["failed"] is True
    assert "its first logged step is 1, not after the checkpoint's step 400" in result["msg"]
    assert "Pivot stopped it again." in result["msg"]
    assert world.job_pids() == []


def test_a_template_that_does_not_name_the_checkpoint_is_warned_about(run_module, world):
    args = world.args(command=[sys.executable, world.trainer, "--log", str(world.log)])
    result = run_module(resume_training.main, args)
    assert any("does not name the checkpoint" in warning for warning in result["warnings"])
    assert result["failed"] is True and "did not resume from the checkpoint" in result["msg"]


def stopped_as(world, *flags: str) -> list:
    """The stop's record of how the job had been started: its selected process's command line."""
    return [" ".join([sys.executable, world.trainer, "--log", str(world.log), *flags])]


def test_a_job_resumed_as_it_had_been_started_is_not_warned_about(run_module, world):
    result = run_module(resume_training.main, world.args("--workers", "1",
                                                         stopped_command_lines=stopped_as(world, "--workers", "1")))
    assert result["failed"] is False, result["msg"]
    assert "command_difference" not in result
    assert not any("does not run the way" in warning for warning in result.get("warnings", []))


def test_a_job_resumed_otherwise_than_it_had_been_started_is_warned_about_naming_both(run_module, world):
    stopped = stopped_as(world, "--workers", "2")
    result = run_module(resume_training.main, world.args(stopped_command_lines=stopped))
    assert result["failed"] is False, result["msg"]  # a warning, not a refusal: the job trains
    resumed = " ".join([sys.executable, world.trainer, "--log", str(world.log), "--resume", str(world.checkpoint)])
    assert result["command_difference"]["stopped"] == stopped
    assert result["command_difference"]["resumed"] == [resumed]
    said = result["command_difference"]["msg"]
    assert said.startswith(f"The resumed job does not run the way the stopped one had been started: the stop recorded "
                           f"{stopped[0]}, the resumed job runs {resumed} (compared word by word without what the "
                           "resume command adds for the checkpoint: --resume {checkpoint}).")
    assert said in result["warnings"]
    # the second run finds the job it started, and says so again
    again = run_module(resume_training.main, world.args(stopped_command_lines=stopped))
    assert again["already_running"] is True and again["command_difference"]["msg"] == said


def test_a_job_still_starting_at_the_timeout_is_left_running_and_recognised_next_time(run_module, world):
    result = run_module(resume_training.main, world.args("--silent", timeout=0.5))
    assert result["failed"] is True
    assert "but it is not training after" in result["msg"] and "no step logged since the start" in result["msg"]
    assert "It was left running: run again to keep waiting" in result["msg"]
    pids = world.job_pids()
    assert result["pid"] in pids
    again = run_module(resume_training.main, world.args("--silent", timeout=0.3))
    assert again["already_running"] is True and again["failed"] is True
    assert world.job_pids() == pids


def test_a_command_that_cannot_run_says_so(run_module, world):
    result = run_module(resume_training.main, world.args(command=[str(world.tmp_path / "missing.sh"), "{checkpoint}"]))
    assert result["failed"] is True
    assert result["msg"].startswith(f"Cannot start {world.tmp_path / 'missing.sh'} {world.checkpoint}: ")
    assert not (world.state_dir / "resume.json").exists()


def test_the_result_reads_as_finished_to_async_status(run_module, world):
    """async_wrapper's status file holds ``started`` while a job runs; a final result must not have it."""
    result = run_module(resume_training.main, world.args())
    assert result["failed"] is False, result["msg"]
    assert "started" not in result and result["launched"] is True


def test_bad_inputs_fail_before_anything(run_module, world):
    assert "command is empty" in run_module(resume_training.main, world.args(command=[]))["msg"]
    assert "expect_processes must be at least 1" in run_module(
        resume_training.main, world.args(expect_processes=0))["msg"]
    result = run_module(resume_training.main, world.args(log_step_regex="step=("))
    assert "is not a valid regular expression" in result["msg"]
    assert world.job_pids() == []


# --- launcher=systemd-run -----------------------------------------------------------------------------------------


class FakeSystemd:
    """systemctl, systemd-run and journalctl for a transient service: systemd-run starts the command in a session of
    its own (as the service manager would, outside the module's process tree) and systemctl names its main PID."""

    def __init__(self, world) -> None:
        self.world = world
        self.popens = []
        self.start_error = ""
        self.journal = []

    def run_command(self, cmd: list) -> tuple:
        program = os.path.basename(cmd[0])
        if program == "systemd-run":
            return self.systemd_run(cmd[1:])
        if program == "journalctl":
            return 0, "".join(line + "\n" for line in self.journal), ""
        assert program == "systemctl", cmd
        if cmd[1] == "reset-failed":
            return 1, "", f"Unit {cmd[-1]} not loaded."
        if cmd[1] == "show" and cmd[2:4] == ["-p", "MainPID"]:
            return 0, f"MainPID={self.popens[-1].pid if self.popens else 0}\n", ""
        if cmd[1] == "show":
            return 0, "Result=success\n", ""
        if cmd[1] == "stop":
            for pid in self.world.job_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            return 0, "", ""
        raise AssertionError(f"unexpected command {cmd}")

    def systemd_run(self, options: list) -> tuple:
        if self.start_error:
            return 1, "", self.start_error
        argv = options[options.index("--") + 1:]
        chdir = next((option.split("=", 1)[1] for option in options if option.startswith("--working-directory=")),
                     None)
        output = next((option.split(":", 1)[1] for option in options
                       if option.startswith("--property=StandardOutput=append:")), None)
        if output:
            os.makedirs(os.path.dirname(output), exist_ok=True)
        with open(output or os.devnull, "ab") as sink:
            self.popens.append(subprocess.Popen(argv, cwd=chdir, stdin=subprocess.DEVNULL, stdout=sink,
                                                stderr=subprocess.STDOUT, start_new_session=True))
        return 0, "", ""

    def close(self) -> None:
        self.world.cleanup()
        for popen in self.popens:
            popen.wait(timeout=10)


@pytest.fixture
def systemd(world, monkeypatch):
    fake = FakeSystemd(world)

    def run_command(self, cmd, **kwargs):
        world.calls.append(cmd)
        if os.path.basename(cmd[0]) == "nvidia-smi":
            return world.smi(cmd)
        return fake.run_command(cmd)

    monkeypatch.setattr(resume_training.AnsibleModule, "run_command", run_command)
    yield fake
    fake.close()


def test_systemd_run_starts_the_job_as_a_transient_service(run_module, world, systemd):
    result = run_module(resume_training.main, world.args(launcher="systemd-run", unit="dflash-training"))
    assert result["failed"] is False, result["msg"]
    assert result["pid"] == systemd.popens[0].pid and result["launched"] is True
    assert read_record(world)["unit"] == "dflash-training.service"
    systemd_calls = [cmd for cmd in world.calls if os.path.basename(cmd[0]) != "nvidia-smi"]
    assert systemd_calls == [
        ["/usr/bin/systemctl", "reset-failed", "dflash-training.service"],
        ["/usr/bin/systemd-run", *result["launch_command"][1:]],
        ["/usr/bin/systemctl", "show", "-p", "MainPID", "dflash-training.service"],
    ]
    assert "resuming at step 400" in world.output.read_text()


def test_systemd_run_failing_starts_nothing_and_says_so(run_module, world, systemd):
    systemd.start_error = "Failed to start transient service unit: Unit dflash-training.service was already loaded."
    result = run_module(resume_training.main, world.args(launcher="systemd-run", unit="dflash-training"))
    assert result["failed"] is True
    assert result["msg"] == (
        "systemd-run could not start dflash-training.service (exit 1): Failed to start transient service unit: Unit "
        "dflash-training.service was already loaded. Nothing is running; check the resume command.")
    assert result["rc"] == 1 and world.job_pids() == []


def test_a_transient_service_that_exits_fails_with_the_end_of_its_journal(run_module, world, systemd):
    systemd.journal = ["error: cannot load the checkpoint (simulated)"]
    result = run_module(resume_training.main, world.args("--die", launcher="systemd-run", unit="dflash-training",
                                                         output_file=None))
    assert result["failed"] is True
    assert result["msg"].startswith(f"The training job started from {world.checkpoint} exited before it trained")
    assert result["output_tail"] == "error: cannot load the checkpoint (simulated)"
    assert ["/usr/bin/journalctl", "_SYSTEMD_UNIT=dflash-training.service", "--lines", "20", "--no-pager", "--output",
            "cat"] in world.calls


def test_a_transient_service_that_starts_over_is_stopped_through_systemd(run_module, world, systemd):
    result = run_module(resume_training.main, world.args("--scratch", launcher="systemd-run", unit="dflash-training"))
    assert result["failed"] is True and "Pivot stopped it again." in result["msg"]
    assert ["/usr/bin/systemctl", "stop", "dflash-training.service"] in world.calls
    assert world.job_pids() == []


def test_without_systemd_run_nothing_is_started(run_module, world, systemd, monkeypatch):
    monkeypatch.setattr(resume_training.AnsibleModule, "get_bin_path",
                        lambda self, name, *a, **k: None if name == "systemd-run" else f"/usr/bin/{name}")
    result = run_module(resume_training.main, world.args(launcher="systemd-run", unit="dflash-training"))
    assert result["failed"] is True
    assert result["msg"] == ("Unit dflash-training.service needs systemd-run, which is not on this host's PATH: run "
                             "the task on the host whose systemd manages the unit. Nothing was started.")
    assert systemd.popens == [] and world.job_pids() == []


def test_the_documented_options_are_the_argument_spec():
    """DOCUMENTATION and argument_spec() name the same options with the same type, default, choices and elements."""
    documented = yaml.safe_load(resume_training.DOCUMENTATION)["options"]
    spec = resume_training.argument_spec()

    def shape(options: dict) -> dict:
        keys = ("type", "default", "choices", "elements", "required")
        return {name: {key: option.get(key) for key in keys if option.get(key) not in (None, False)}
                | ({"options": shape(option["options"] if "options" in option else option["suboptions"])}
                   if "options" in option or "suboptions" in option else {})
                for name, option in options.items()}

    assert shape(documented) == shape(spec)
