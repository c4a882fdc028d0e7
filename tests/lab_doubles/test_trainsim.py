"""The training simulator (lab/files/trainsim): every behaviour does what it says."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import time

import pytest
from lab_doubles_support import (
    REAL_LOG_LINE,
    STEP_LINE,
    TRAINSIM,
    children_of,
    is_running,
    proc_cmdline,
    proc_ppid,
    wait_for,
)

NOHEADER_NOUNITS = "--format=csv,noheader,nounits"


def compute_apps(trainsim) -> list[tuple[int, int, str]]:
    out = trainsim.smi.smi_ok("--query-compute-apps=pid,used_memory,gpu_bus_id", NOHEADER_NOUNITS)
    return [(int(pid), int(mib), bus) for pid, mib, bus in (line.split(", ") for line in out.splitlines())]


# --- log ----------------------------------------------------------------------------


def test_step_line_regex_matches_the_real_line():
    match = STEP_LINE.match(REAL_LOG_LINE)
    assert match is not None
    assert (match["minutes"], match["step"], match["loss"]) == ("2158", "5381", "---")


def test_log_has_the_real_format_on_stdout_and_in_the_log_file(trainsim):
    trainer = trainsim.start("--report-every", "4", "--total-steps", "9")
    assert trainer.wait(timeout=20) == 0
    lines = trainsim.log_lines()
    assert trainsim.stdout_file.read_text().splitlines() == lines
    step_lines = [line for line in lines if STEP_LINE.match(line)]
    assert trainsim.steps() == list(range(1, 10))
    for line in step_lines:
        match = STEP_LINE.match(line)
        reporting = int(match["step"]) % 4 == 0
        assert (match["loss"] != "---") == reporting
        assert (match["acc"] != "---") == reporting
        assert (" gnorm=---" not in line) == reporting
        assert " lr=" in line
    assert all("step=" not in line for line in lines if not STEP_LINE.match(line))
    assert lines[-1].endswith("] Training complete")


def test_log_file_is_appended_across_runs(trainsim):
    assert trainsim.start("--total-steps", "2").wait(timeout=20) == 0
    assert trainsim.start("--total-steps", "4").wait(timeout=20) == 0
    assert trainsim.steps() == [1, 2, 3, 4]  # the second run resumed from the final checkpoint of the first


# --- checkpoints -------------------------------------------------------------------


def assert_complete_checkpoint(directory, step: int) -> None:
    marker = json.loads((directory / "COMPLETE").read_text())
    assert marker["step"] == step
    assert sorted(marker["files"]) == ["model.safetensors", "optimizer.pt", "trainer_state.json"]
    for name, expected in marker["files"].items():
        payload = (directory / name).read_bytes()
        assert len(payload) == expected["bytes"]
        assert hashlib.sha256(payload).hexdigest() == expected["sha256"]
        assert (directory / name).stat().st_mtime_ns <= (directory / "COMPLETE").stat().st_mtime_ns
    assert json.loads((directory / "trainer_state.json").read_text())["global_step"] == step
    model = (directory / "model.safetensors").read_bytes()
    header_size = struct.unpack("<Q", model[:8])[0]
    header = json.loads(model[8 : 8 + header_size])
    assert header["__metadata__"]["global_step"] == str(step)
    (begin, end) = header["draft.lm_head.weight"]["data_offsets"]
    assert len(model) == 8 + header_size + end - begin


def test_periodic_checkpoints_are_complete_with_marker_last(trainsim):
    trainer = trainsim.start("--save-every", "5", "--total-steps", "12")
    assert trainer.wait(timeout=20) == 0
    assert trainsim.complete_steps() == [5, 10, 12]  # 12: the final save
    for step in (5, 10, 12):
        assert_complete_checkpoint(trainsim.checkpoint_dir / f"step_{step:09d}", step)
    assert not list(trainsim.checkpoint_dir.rglob("*.tmp"))


def test_sigusr1_requests_a_checkpoint_at_the_next_step(trainsim):
    trainer = trainsim.start()
    trainsim.wait_for_step(3)
    requested_after = trainsim.last_step()
    trainer.send_signal(signal.SIGUSR1)
    wait_for(trainsim.complete_steps, what="a checkpoint")
    [step] = trainsim.complete_steps()
    assert requested_after <= step <= requested_after + 3
    assert_complete_checkpoint(trainsim.checkpoint_dir / f"step_{step:09d}", step)
    assert trainsim.wait_for_log("Checkpoint requested (SIGUSR1)")
    assert is_running(trainer.pid)


def test_trigger_file_requests_a_checkpoint_and_is_removed(trainsim):
    trainer = trainsim.start("--checkpoint-on", "trigger")
    trainsim.wait_for_step(2)
    trigger = trainsim.checkpoint_dir / "SAVE_NOW"
    trigger.parent.mkdir(parents=True, exist_ok=True)
    trigger.touch()
    wait_for(trainsim.complete_steps, what="a checkpoint")
    assert not trigger.exists()
    assert trainsim.wait_for_log(f"Checkpoint requested (trigger file {trigger})")
    assert is_running(trainer.pid)


def test_custom_trigger_file_path(trainsim):
    trigger = trainsim.smi.root / "please-save"
    trainsim.start("--checkpoint-on", "trigger", "--trigger-file", str(trigger))
    trainsim.wait_for_step(1)
    trigger.touch()
    wait_for(trainsim.complete_steps, what="a checkpoint")
    assert not trigger.exists()


def test_sigusr1_kills_a_trigger_file_trainer_without_saving(trainsim):
    trainer = trainsim.start("--checkpoint-on", "trigger")
    trainsim.wait_for_step(2)
    trainer.send_signal(signal.SIGUSR1)
    assert trainer.wait(timeout=10) == -signal.SIGUSR1
    assert trainsim.complete_steps() == []


def test_slow_checkpoint_shows_files_progressively_and_marker_only_at_the_end(trainsim):
    trainer = trainsim.start("--checkpoint-seconds", "1.5")
    trainsim.wait_for_step(2)
    trainer.send_signal(signal.SIGUSR1)
    directory = wait_for(lambda: next(trainsim.checkpoint_dir.glob("step_*"), None), what="checkpoint directory")
    appeared = time.monotonic()
    sizes_seen = set()
    while not (directory / "COMPLETE").exists():
        assert time.monotonic() - appeared < 10
        model = directory / "model.safetensors"
        if model.exists():
            sizes_seen.add(model.stat().st_size)
        time.sleep(0.01)
    completed = time.monotonic()
    assert completed - appeared >= 1.0
    assert len(sizes_seen) >= 2  # the file grew while we watched
    assert_complete_checkpoint(directory, int(directory.name.removeprefix("step_")))


def test_never_mode_logs_requests_and_saves_nothing(trainsim):
    trainer = trainsim.start("--checkpoint-on", "never")
    trainsim.wait_for_step(2)
    trainer.send_signal(signal.SIGUSR1)
    trigger = trainsim.checkpoint_dir / "SAVE_NOW"
    trigger.parent.mkdir(parents=True, exist_ok=True)
    trigger.touch()
    trainsim.wait_for_log("Checkpoint requested (SIGUSR1)")
    trainsim.wait_for_log("Checkpoint requested (trigger file")
    trainsim.wait_for_step(trainsim.last_step() + 10)
    assert trainsim.complete_steps() == []
    assert trigger.exists()
    assert not any("Saving checkpoint" in line for line in trainsim.log_lines())
    assert sum("Checkpoint requested (trigger file" in line for line in trainsim.log_lines()) == 1
    assert is_running(trainer.pid)


def test_a_request_during_a_save_is_honoured_at_the_next_step(trainsim):
    trainer = trainsim.start("--save-every", "3", "--checkpoint-seconds", "0.5")
    trainsim.wait_for_log("Saving checkpoint for global step 3 (periodic)")
    trainer.send_signal(signal.SIGUSR1)
    wait_for(lambda: 4 in trainsim.complete_steps(), what="checkpoint of step 4")
    # the files are complete a moment before the trainer logs that it saved them
    trainsim.wait_for_log(f"Checkpoint saved: {trainsim.checkpoint_dir}/step_000000004")
    events = [re.sub(r" \(\d+\.\ds\)$", "", line.split("] ", 1)[1])
              for line in trainsim.log_lines() if "heckpoint" in line]
    assert events[:5] == [
        f"Saving checkpoint for global step 3 (periodic) to {trainsim.checkpoint_dir}/step_000000003",
        f"Checkpoint saved: {trainsim.checkpoint_dir}/step_000000003",
        "Checkpoint requested (SIGUSR1)",
        f"Saving checkpoint for global step 4 (requested) to {trainsim.checkpoint_dir}/step_000000004",
        f"Checkpoint saved: {trainsim.checkpoint_dir}/step_000000004",
    ]


def test_a_step_already_saved_is_not_saved_twice(trainsim):
    trainer = trainsim.start("--save-every", "1")
    trainsim.wait_for_step(2)
    trainer.send_signal(signal.SIGUSR1)
    line = trainsim.wait_for_log("already on disk")
    step = int(line.split("global step ")[1].split()[0])
    saves = [entry for entry in trainsim.log_lines() if f"Saving checkpoint for global step {step} " in entry]
    assert saves == [saves[0]]
    assert "(requested)" in saves[0]


# --- SIGTERM -------------------------------------------------------------------------


def test_sigterm_exit_stops_promptly_without_saving_and_releases_memory(trainsim):
    trainer = trainsim.start("--on-sigterm", "exit", "--gpus", "0,1")
    trainsim.wait_for_step(2)
    assert {(pid, mib) for pid, mib, _unused in compute_apps(trainsim)} == {(trainer.pid, 1000)}
    sent = time.monotonic()
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(timeout=5) == 0
    assert time.monotonic() - sent < 2
    assert trainsim.complete_steps() == []
    assert trainsim.log_lines()[-1].endswith("SIGTERM received: exiting without a checkpoint")
    assert trainsim.smi.memory_used() == [0] * 8


def test_sigterm_ignore_keeps_training_until_sigkill(trainsim):
    trainer = trainsim.start("--on-sigterm", "ignore")
    trainsim.wait_for_step(2)
    trainer.send_signal(signal.SIGTERM)
    trainsim.wait_for_log("SIGTERM ignored")
    step_after = trainsim.last_step()
    trainsim.wait_for_step(step_after + 5)
    assert is_running(trainer.pid)
    assert trainsim.smi.memory_used()[0] == 1009
    trainer.send_signal(signal.SIGKILL)
    assert trainer.wait(timeout=5) == -signal.SIGKILL
    assert trainsim.smi.memory_used()[0] == 0


def test_sigterm_checkpoint_then_exit(trainsim):
    trainer = trainsim.start("--on-sigterm", "checkpoint-then-exit", "--checkpoint-seconds", "0.3")
    trainsim.wait_for_step(3)
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(timeout=10) == 0
    [step] = trainsim.complete_steps()
    assert step == trainsim.last_step()
    assert_complete_checkpoint(trainsim.checkpoint_dir / f"step_{step:09d}", step)


def restore_default_sigint() -> None:
    # A background job of a non-interactive shell inherits SIGINT ignored; Python then keeps ignoring it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_is_a_keyboard_interrupt(trainsim):
    trainer = trainsim.start(preexec_fn=restore_default_sigint)
    trainsim.wait_for_step(1)
    trainer.send_signal(signal.SIGINT)
    assert trainer.wait(timeout=10) != 0
    assert "KeyboardInterrupt" in trainsim.stdout_file.read_text()
    assert trainsim.smi.memory_used()[0] == 0


def saved_steps(trainsim) -> list[int]:
    """Steps whose directory holds all three files (what a checkpoint without a marker consists of)."""
    names = {"model.safetensors", "optimizer.pt", "trainer_state.json"}
    return sorted(int(p.name.removeprefix("step_")) for p in trainsim.checkpoint_dir.glob("step_*")
                  if names <= {f.name for f in p.iterdir()})


def test_no_marker_writes_the_same_checkpoint_without_its_marker(trainsim):
    trainer = trainsim.start("--no-marker", "--save-every", "5", "--total-steps", "7")
    assert trainer.wait(timeout=20) == 0
    assert saved_steps(trainsim) == [5, 7]
    for step in (5, 7):
        directory = trainsim.checkpoint_dir / f"step_{step:09d}"
        files = sorted(f.name for f in directory.iterdir())
        assert files == ["model.safetensors", "optimizer.pt", "trainer_state.json"]
        assert json.loads((directory / "trainer_state.json").read_text())["global_step"] == step
    assert trainsim.complete_steps() == [], "no COMPLETE anywhere"


def test_no_marker_checkpoints_grow_on_request_and_resume_works(trainsim):
    trainer = trainsim.start("--no-marker", "--checkpoint-seconds", "1.0", "--save-every", "0")
    trainsim.wait_for_step(2)
    trainer.send_signal(signal.SIGUSR1)
    directory = wait_for(lambda: next(trainsim.checkpoint_dir.glob("step_*"), None), what="checkpoint directory")
    sizes_seen = set()
    while not (directory / "trainer_state.json").exists():
        model = directory / "model.safetensors"
        if model.exists():
            sizes_seen.add(model.stat().st_size)
        time.sleep(0.01)
    assert len(sizes_seen) >= 2, "its files grow while it is written"
    trainsim.wait_for_log("Checkpoint saved")
    assert not (directory / "COMPLETE").exists()
    step = int(directory.name.removeprefix("step_"))
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(timeout=10) == 0
    debris = trainsim.checkpoint_dir / f"step_{step + 50:09d}"
    debris.mkdir()
    (debris / "model.safetensors").write_bytes(b"partial")  # a save killed half way: no trainer_state.json
    trainsim.log_file.unlink()
    resumed = trainsim.start("--no-marker")
    trainsim.wait_for_step(step + 1)
    assert trainsim.log_lines()[0].endswith(f"Resuming from checkpoint {directory} (global step {step})")
    resumed.send_signal(signal.SIGTERM)
    resumed.wait(timeout=10)


# --- resume -----------------------------------------------------------------------------


def test_resumes_from_the_newest_complete_checkpoint(trainsim):
    assert trainsim.start("--save-every", "5", "--total-steps", "11").wait(timeout=20) == 0  # 5, 10, 11
    incomplete = trainsim.checkpoint_dir / "step_000000015"
    incomplete.mkdir()
    (incomplete / "model.safetensors").write_bytes(b"partial")
    trainsim.log_file.unlink()
    trainer = trainsim.start()
    trainsim.wait_for_step(13)
    assert trainsim.steps()[0] == 12
    assert trainsim.log_lines()[0].endswith(f"Resuming from checkpoint {trainsim.checkpoint_dir}/step_000000011 "
                                            "(global step 11)")
    trainer.send_signal(signal.SIGTERM)
    trainer.wait(timeout=10)


def test_start_step_overrides_resume(trainsim):
    assert trainsim.start("--total-steps", "3").wait(timeout=20) == 0
    trainsim.log_file.unlink()
    assert trainsim.start("--start-step", "5000", "--total-steps", "5002").wait(timeout=20) == 0
    assert trainsim.steps() == [5001, 5002]
    assert trainsim.complete_steps() == [3, 5002]


def test_minutes_counter_continues_from_the_checkpoint(trainsim):
    state_dir = trainsim.checkpoint_dir / "step_000000100"
    assert trainsim.start("--start-step", "99", "--total-steps", "100").wait(timeout=20) == 0
    state = json.loads((state_dir / "trainer_state.json").read_text())
    state["train_minutes"] = 2157.5
    (state_dir / "trainer_state.json").write_text(json.dumps(state))
    trainsim.log_file.unlink()
    assert trainsim.start("--total-steps", "101").wait(timeout=20) == 0
    assert STEP_LINE.match(trainsim.log_lines()[2])["minutes"] == "2157"


# --- GPU memory ----------------------------------------------------------------------------


def test_gpu_memory_is_visible_while_training(trainsim):
    trainer = trainsim.start("--gpus", "0-2", "--gpu-mib", "19592")
    trainsim.wait_for_log("Holding 19592 MiB on GPU(s) 0,1,2")
    assert compute_apps(trainsim) == [
        (trainer.pid, 19592, "00000000:18:00.0"), (trainer.pid, 19592, "00000000:2A:00.0"),
        (trainer.pid, 19592, "00000000:3A:00.0"),
    ]
    assert trainsim.smi.memory_used()[:4] == [19601, 19601, 19601, 0]


def test_out_of_gpu_memory_fails_like_cuda(trainsim):
    trainer = trainsim.start("--gpu-mib", "150000")
    assert trainer.wait(timeout=10) == 1
    assert "torch.OutOfMemoryError: CUDA out of memory on GPU 0" in trainsim.stdout_file.read_text()


def test_a_full_checkpoint_disk_ends_the_save_and_the_trainer_with_enospc_in_its_log(trainsim):
    trainer = trainsim.start("--disk-room-mib", "0.001")
    trainsim.wait_for_step(2)
    trainer.send_signal(signal.SIGUSR1)
    assert trainer.wait(timeout=20) == 1
    logged = trainsim.wait_for_log("ERROR: training stopped at global step")
    assert "OSError: [Errno 28] No space left on device" in logged and str(trainsim.checkpoint_dir) in logged
    assert "OSError: [Errno 28] No space left on device" in trainsim.stdout_file.read_text(), "the traceback"
    assert trainsim.complete_steps() == [], "a save cut short leaves no complete checkpoint"
    [partial] = list(trainsim.checkpoint_dir.iterdir())
    assert not (partial / "COMPLETE").exists() and not (partial / "trainer_state.json").exists()


def test_orphan_worker_keeps_gpu_memory_after_the_trainer_exits(trainsim, processes):
    trainer = trainsim.start("--orphan", "--orphan-gpu-mib", "2048")
    line = trainsim.wait_for_log("Started dataloader worker pid")
    worker = int(line.rsplit(" ", 1)[1])
    processes.track(worker)
    assert proc_ppid(worker) == trainer.pid
    wait_for(lambda: any(pid == worker for pid, _unused, _unused in compute_apps(trainsim)), what="worker registration")
    with open(f"/proc/{worker}/comm") as comm:
        assert comm.read().strip() == "pt_data_worker"
    assert proc_cmdline(worker) == proc_cmdline(trainer.pid)  # forked, not exec'd
    assert os.getsid(worker) == os.getsid(trainer.pid)
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(timeout=10) == 0
    time.sleep(0.3)
    assert is_running(worker)
    assert proc_ppid(worker) != trainer.pid
    assert compute_apps(trainsim) == [(worker, 2048, "00000000:18:00.0")]
    assert trainsim.smi.memory_used()[0] == 2057
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: not is_running(worker), what="worker to die")
    assert trainsim.smi.memory_used()[0] == 0


# --- configuration ---------------------------------------------------------------------------


def test_config_file_supplies_defaults_and_flags_override_it(trainsim):
    config = trainsim.smi.root / "trainsim.json"
    config.write_text(json.dumps({"total-steps": 3, "report_every": 1, "save-every": 2}))
    trainsim.env["TRAINSIM_CONFIG"] = str(config)
    assert trainsim.start().wait(timeout=20) == 0  # fast_flags say --save-every 0: the flag wins
    assert trainsim.steps() == [1, 2, 3]
    assert all(STEP_LINE.match(line)["loss"] != "---" for line in trainsim.log_lines() if STEP_LINE.match(line))
    assert trainsim.complete_steps() == [3]


def test_config_file_with_unknown_key_is_rejected(trainsim):
    config = trainsim.smi.root / "trainsim.json"
    config.write_text(json.dumps({"step_sekonds": 1}))
    trainer = trainsim.start("--config", str(config))
    assert trainer.wait(timeout=10) == 2
    assert "unknown keys" in trainsim.stdout_file.read_text()


# --- run.sh and launch ---------------------------------------------------------------------------


def test_run_sh_is_the_parent_of_the_trainer_and_passes_trainsim_args(trainsim, processes):
    trainsim.env["TRAINSIM_ARGS"] = "--report-every 2 --gpus 3"
    run = trainsim.start(command=["bash", str(TRAINSIM / "run.sh")])
    trainsim.wait_for_log("Holding 1000 MiB on GPU(s) 3")
    [trainer] = children_of(run.pid)
    processes.track(trainer)
    # the user's shape: python3 -u /root/train_dflash_pipeline.py (a path, found by the file name)
    assert proc_cmdline(trainer)[:3] == ["python3", "-u", str(TRAINSIM / "train_dflash_pipeline.py")]
    assert "--report-every" in proc_cmdline(trainer)
    assert compute_apps(trainsim) == [(trainer, 1000, "00000000:5D:00.0")]
    os.kill(trainer, signal.SIGTERM)
    assert run.wait(timeout=10) == 0


def test_sigterm_to_run_sh_alone_leaves_the_trainer_running(trainsim, processes):
    run = trainsim.start(command=["bash", str(TRAINSIM / "run.sh")])
    trainsim.wait_for_step(1)
    [trainer] = children_of(run.pid)
    processes.track(trainer)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=10) == -signal.SIGTERM
    step = trainsim.last_step()
    trainsim.wait_for_step(step + 3)
    assert is_running(trainer)


def test_launch_detaches_run_sh_in_its_own_session(trainsim, processes):
    pidfile = trainsim.smi.root / "run" / "train.pid"
    stdout = trainsim.smi.root / "nohup.out"
    result = subprocess.run(
        [str(TRAINSIM / "launch"), "--pidfile", str(pidfile), f"--stdout={stdout}", *trainsim.fast_flags()],
        env=trainsim.env, capture_output=True, text=True, timeout=30, check=True,
    )
    run_pid = int(result.stdout.strip())
    processes.track(run_pid)
    assert int(pidfile.read_text()) == run_pid
    trainsim.wait_for_step(2)
    [trainer] = children_of(run_pid)
    processes.track(trainer)
    assert proc_cmdline(run_pid)[1] == str(TRAINSIM / "run.sh")
    assert os.getsid(run_pid) == run_pid != os.getsid(0)
    assert os.getsid(trainer) == run_pid
    wait_for(lambda: "step=2 " in stdout.read_text(), what="stdout file")
    os.kill(trainer, signal.SIGTERM)
    wait_for(lambda: not is_running(run_pid), what="run.sh to exit")


@pytest.mark.parametrize("value", ["TRAINSIM_PIDFILE", "TRAINSIM_STDOUT"])
def test_launch_paths_come_from_the_environment(trainsim, processes, value):
    path = trainsim.smi.root / "from-env" / value.lower()
    trainsim.env[value] = str(path)
    defaults = {"TRAINSIM_PIDFILE": trainsim.smi.root / "pid", "TRAINSIM_STDOUT": trainsim.smi.root / "out"}
    for name, default in defaults.items():
        trainsim.env.setdefault(name, str(default))
    result = subprocess.run(
        [str(TRAINSIM / "launch"), *trainsim.fast_flags(), "--on-sigterm", "exit"],
        env=trainsim.env, capture_output=True, text=True, timeout=30, check=True,
    )
    run_pid = int(result.stdout)
    processes.track(run_pid)
    trainsim.wait_for_step(1)
    processes.track(*children_of(run_pid))
    assert path.exists()
    for pid in children_of(run_pid):
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not is_running(run_pid), what="run.sh to exit")
