"""pivot.ops.stop_training and pivot.ops.gpu_release on ct200, reached the production way: paramiko to the Proxmox node,
then `pct exec 200 -- ...` (community.proxmox.proxmox_pct_remote). Each test starts its own training job with the
lab's simulator and leaves ct200 quiet again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import labctl
import pytest
from integration_lab import RUN_SH, TrainJob, run_playbook, signals_by_pid

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]

StartJob = Callable[..., TrainJob]

STOP = "Stop the training job"
RELEASE = "Wait until the job's GPUs are released"
HOST = "ct200"


def stop_vars(job: TrainJob, *, checkpoint: dict | None = None, **extra: object) -> dict:
    """Extra vars for stop_training.yml: the job selected the way users do (run.sh's path), its log for last_step."""
    variables: dict = {"job_cmdline": [RUN_SH], "job_log_file": job.log_file, **extra}
    if checkpoint is not None:
        variables["job_checkpoint"] = checkpoint
    return variables


def signal_checkpoint(job: TrainJob, timeout: float = 10) -> dict:
    return {"request": "signal", "path": job.checkpoint_dir, "glob": "step_*", "marker": "COMPLETE", "timeout": timeout}


def trainers(processes: list[dict]) -> list[dict]:
    """The trainer processes (single process or torchrun workers), not run.sh, the agent or forked dataloaders."""
    return [
        info for info in processes
        if "train_dflash_pipeline.py" in info["cmdline"] and info["comm"] != "pt_data_worker"
        and not any(word.endswith("torchrun") for word in info["cmdline"].split())
    ]


def command_of(pid: int, processes: list[dict]) -> str:
    [cmdline] = [info["cmdline"] for info in processes if info["pid"] == pid]
    return cmdline


def identities(processes: list[dict]) -> list[tuple]:
    """What must not change about a process left alone (its scheduler state may)."""
    return [(info["pid"], info["ppid"], info["pgid"], info["sid"], info["cmdline"]) for info in processes]


def no_signal_of(stopped: dict, *names: str) -> bool:
    return not any(name in sent for sent in signals_by_pid(stopped).values() for name in names)


def checkpoint_dir_name(step: int) -> str:
    return f"step_{step:09d}"


def test_cooperative_job_is_checkpointed_then_stopped_without_sigkill(start_job: StartJob) -> None:
    job = start_job("--gpus", "0,1")
    [trainer] = trainers(job.processes())
    # An older checkpoint on disk must not be mistaken for the one the stop asks for.
    assert labctl.pct_exec(["kill", "-USR1", str(trainer["pid"])]).rc == 0
    job.wait_for_log_text("Checkpoint saved")
    [older] = job.checkpoints()
    job.wait_for_step(int(older["name"].removeprefix("step_")) + 3)
    before = job.pids()

    run = run_playbook("stop_training.yml", stop_vars(job, checkpoint=signal_checkpoint(job), job_gpus=[0, 1]))

    assert run.rc == 0, run.stdout[-3000:]
    stopped = run.result(STOP, HOST)
    assert stopped["changed"] is True
    assert {entry["pid"] for entry in stopped["pids"]} == before
    checkpoint = stopped["checkpoint"]
    assert checkpoint["path"] == f"{job.checkpoint_dir}/{checkpoint_dir_name(checkpoint['step'])}"
    assert checkpoint["path"] != f"{job.checkpoint_dir}/{older['name']}"
    assert checkpoint["step"] > int(older["name"].removeprefix("step_"))
    assert checkpoint["size_bytes"] > 0
    assert datetime.fromisoformat(checkpoint["requested_at"]) <= datetime.fromisoformat(checkpoint["completed_at"])
    assert {"name": checkpoint_dir_name(checkpoint["step"]), "complete": True} in job.checkpoints()
    log = job.log()
    assert f"Checkpoint saved: {checkpoint['path']}" in log
    # last_step is the last step= line of the log, written after the checkpoint's step.
    assert stopped["last_step"] == int(log.rsplit("step=", 1)[1].split()[0])
    assert stopped["last_step"] >= checkpoint["step"]
    assert f"step={stopped['last_step']} " in stopped["last_log_line"]
    # Checkpoint request to the trainer only (run.sh's bash would die of SIGUSR1), then SIGTERM; no SIGKILL.
    sent = signals_by_pid(stopped)
    assert sent[trainer["pid"]] == ["SIGUSR1", "SIGTERM"]
    assert "SIGUSR1" not in sent[job.pid]
    assert stopped["sigkill_needed"] is False
    assert no_signal_of(stopped, "SIGKILL")
    assert "SIGTERM received: exiting without a checkpoint" in log
    assert stopped["remaining"] == []
    assert job.processes() == []
    released = run.result(RELEASE, HOST)
    assert released["released"] is True and released["selected"] == [0, 1]
    assert not released.get("failed")


def test_job_ignoring_sigterm_is_killed_after_the_grace_period(start_job: StartJob) -> None:
    job = start_job("--on-sigterm", "ignore", "--gpus", "3")
    [trainer] = trainers(job.processes())

    run = run_playbook("stop_training.yml", stop_vars(job, job_grace_period=1, job_gpus=[3]))

    assert run.rc == 0, run.stdout[-3000:]
    stopped = run.result(STOP, HOST)
    assert stopped["changed"] is True
    assert stopped["sigkill_needed"] is True
    assert signals_by_pid(stopped)[trainer["pid"]] == ["SIGTERM", "SIGKILL"]
    assert stopped["timings"]["sigterm"] >= 1.0  # the whole grace period passed before SIGKILL
    assert "SIGKILL was needed" in stopped["msg"]
    assert "SIGTERM ignored" in job.log()
    assert stopped["remaining"] == []
    assert job.processes() == []
    assert run.result(RELEASE, HOST)["released"] is True


def test_checkpoint_that_never_lands_fails_and_leaves_the_job_running(start_job: StartJob) -> None:
    job = start_job("--checkpoint-on", "never", "--gpus", "4")
    before = job.processes()
    [trainer] = trainers(before)

    run = run_playbook(
        "stop_training.yml", stop_vars(job, checkpoint=signal_checkpoint(job, timeout=2), job_gpus=[4])
    )

    assert run.rc != 0
    stopped = run.result(STOP, HOST)
    assert stopped["failed"] is True
    assert "No new complete checkpoint" in stopped["msg"] and job.checkpoint_dir in stopped["msg"]
    assert "left running" in stopped["msg"]
    assert stopped["timings"]["checkpoint"] >= 2.0
    assert stopped["checkpoint"]["path"] is None
    # Only the checkpoint request was sent; nothing that ends a process.
    assert signals_by_pid(stopped) == {trainer["pid"]: ["SIGUSR1"]}
    assert not run.ran(RELEASE, HOST)  # the play stops at the failed task
    assert identities(job.processes()) == identities(before)  # same PIDs, same parents
    log = job.log()
    assert "Checkpoint requested (SIGUSR1)" in log
    assert "SIGTERM" not in log
    assert job.checkpoints() == []
    job.wait_for_step(stopped["last_step"] + 2)  # still training


def test_slow_checkpoint_within_the_timeout_is_waited_for(start_job: StartJob) -> None:
    job = start_job("--checkpoint-seconds", "2", "--gpus", "5")

    run = run_playbook(
        "stop_training.yml", stop_vars(job, checkpoint=signal_checkpoint(job, timeout=15), job_gpus=[5])
    )

    assert run.rc == 0, run.stdout[-3000:]
    stopped = run.result(STOP, HOST)
    checkpoint = stopped["checkpoint"]
    assert checkpoint["path"] is not None
    assert stopped["timings"]["checkpoint"] >= 2.0  # the save takes 2 s and the module waited for it
    assert {"name": checkpoint_dir_name(checkpoint["step"]), "complete": True} in job.checkpoints()
    log = job.log()
    # The stop came only after the save had finished.
    assert log.index(f"Checkpoint saved: {checkpoint['path']}") < log.index("SIGTERM received")
    assert stopped["sigkill_needed"] is False
    assert job.processes() == []
    assert run.result(RELEASE, HOST)["released"] is True


def test_torchrun_job_with_workers_in_their_own_sessions_is_stopped_completely(start_job: StartJob) -> None:
    workers_count = 4
    # --orphan: every worker also forks a dataloader-like child that holds memory on the worker's GPU.
    job = start_job("--orphan", nproc_per_node=workers_count)
    before = job.processes()
    workers = trainers(before)
    assert len(workers) == workers_count
    assert all(worker["sid"] == worker["pid"] for worker in workers)  # each leads its own session
    assert len([info for info in before if info["comm"] == "pt_data_worker"]) == workers_count

    checkpoint = signal_checkpoint(job) | {"signal_targets": "catching"}
    run = run_playbook(
        "stop_training.yml",
        stop_vars(job, checkpoint=checkpoint, job_match_env=["TORCHELASTIC_RUN_ID"], job_gpus=[0, 1, 2, 3]),
    )

    assert run.rc == 0, run.stdout[-3000:]
    stopped = run.result(STOP, HOST)
    assert {info["pid"] for info in before} <= {entry["pid"] for entry in stopped["pids"]}
    assert stopped["checkpoint"]["path"] is not None
    sent = signals_by_pid(stopped)
    # SIGUSR1 only to the workers, which handle it; the agent and run.sh would die of it and orphan the workers.
    assert {pid for pid, names in sent.items() if "SIGUSR1" in names} == {worker["pid"] for worker in workers}
    assert stopped["remaining"] == []
    # Nothing of the job is left anywhere in ct200, re-parented to PID 1 or not.
    assert job.processes() == []
    ps = labctl.pct_exec(["ps", "-eo", "pid,ppid,stat,args"])
    assert job.checkpoint_dir not in ps.stdout, ps.stdout
    released = run.result(RELEASE, HOST)
    assert released["released"] is True and released["selected"] == [0, 1, 2, 3]


def test_trigger_file_checkpoint_request(start_job: StartJob) -> None:
    job = start_job("--checkpoint-on", "trigger", "--gpus", "6")
    [trainer] = trainers(job.processes())
    checkpoint = signal_checkpoint(job) | {"request": "file", "trigger_file": job.trigger_file}

    run = run_playbook("stop_training.yml", stop_vars(job, checkpoint=checkpoint, job_gpus=[6]))

    assert run.rc == 0, run.stdout[-3000:]
    stopped = run.result(STOP, HOST)
    assert stopped["checkpoint"]["path"] is not None
    assert {"name": checkpoint_dir_name(stopped["checkpoint"]["step"]), "complete": True} in job.checkpoints()
    assert f"Checkpoint requested (trigger file {job.trigger_file})" in job.log()
    assert no_signal_of(stopped, "SIGUSR1", "SIGKILL")  # this trainer would die of SIGUSR1
    assert signals_by_pid(stopped)[trainer["pid"]] == ["SIGTERM"]
    assert labctl.pct_exec(["test", "-e", job.trigger_file]).rc == 1
    assert job.processes() == []
    assert run.result(RELEASE, HOST)["released"] is True


def test_nothing_running_is_no_change() -> None:
    checkpoint = {"request": "signal", "path": "/srv/train/checkpoints", "glob": "step_*", "marker": "COMPLETE"}
    run = run_playbook("stop_training.yml", {"job_cmdline": [RUN_SH], "job_checkpoint": checkpoint})

    assert run.rc == 0, run.stdout[-3000:]
    stopped = run.result(STOP, HOST)
    assert stopped["changed"] is False
    assert not stopped.get("failed")
    assert stopped["pids"] == [] and stopped["signals"] == []
    assert stopped["checkpoint"] == {}
    assert "nothing to do" in stopped["msg"]


def test_check_mode_reports_the_plan_and_sends_nothing(start_job: StartJob) -> None:
    job = start_job()
    before = job.processes()
    [trainer] = trainers(before)

    run = run_playbook("stop_training.yml", stop_vars(job, checkpoint=signal_checkpoint(job)), check=True, diff=True)

    assert run.rc == 0, run.stdout[-3000:]
    stopped = run.result(STOP, HOST)
    assert stopped["changed"] is True
    assert {entry["pid"] for entry in stopped["pids"]} == {info["pid"] for info in before}
    planned = stopped["planned"]
    assert planned[0] == f"send SIGUSR1 to 1 process(es): {trainer['pid']}"
    assert f"wait up to 10s for a new complete checkpoint {job.checkpoint_dir}/step_* (marker COMPLETE)" in planned
    assert planned[-1].startswith("SIGTERM 2 process(es)")
    assert f"{job.pid} {command_of(job.pid, before)}\n" in stopped["diff"]["before"]
    assert stopped["signals"] == []
    assert identities(job.processes()) == identities(before)
    assert job.checkpoints() == []
    log = job.log()
    assert "Checkpoint requested" not in log and "SIGTERM" not in log
    job.wait_for_step(stopped["last_step"] + 2)  # still training


def test_orphan_holding_gpu_memory_makes_the_release_check_fail(start_job: StartJob) -> None:
    job = start_job("--orphan", "--gpus", "7")
    [trainer] = trainers(job.processes())
    [orphan] = [info for info in job.processes() if info["comm"] == "pt_data_worker"]
    # The trainer crashes (OOM killer); run.sh ends with it; its dataloader worker lives on under PID 1.
    assert labctl.pct_exec(["kill", "-KILL", str(trainer["pid"])]).rc == 0
    left = job.processes()
    for _unused in range(50):
        if len(left) == 1:
            break
        left = job.processes()
    assert [(info["pid"], info["ppid"]) for info in left] == [(orphan["pid"], 1)]

    run = run_playbook(
        "stop_training.yml",
        {"job_pidfile": job.pidfile, "job_cmdline": [RUN_SH], "job_gpus": [7], "release_timeout": 1},
    )

    assert run.rc != 0
    stopped = run.result(STOP, HOST)
    assert stopped["changed"] is False  # the job itself is gone: the pidfile names a dead PID
    assert "stale pidfile" in stopped["msg"]
    released = run.result(RELEASE, HOST)
    assert released["failed"] is True and released["released"] is False
    msg = released["msg"]
    assert f"PID {orphan['pid']} " in msg
    assert orphan["cmdline"] in msg
    assert "(1024 MiB)" in msg
    assert "orphan" in msg and f"kill {orphan['pid']}" in msg
    [holder] = [app for app in released["processes"] if app["pid"] == orphan["pid"]]
    assert holder["gpu_index"] == 7 and holder["ppid"] == 1 and holder["used_memory_mib"] == 1024

    # Following the hint frees the GPU.
    assert labctl.pct_exec(["kill", str(orphan["pid"])]).rc == 0
    after = run_playbook(
        "gpu_release.yml",
        {"target": HOST, "gpu_state": "released", "gpu_indexes": [7], "release_timeout": 5,
         "release_poll_interval": 0.2},
    )
    assert after.rc == 0, after.stdout[-3000:]
    assert after.result("Query GPU memory", HOST)["released"] is True


def test_forked_worker_of_a_running_job_is_stopped_with_it(start_job: StartJob) -> None:
    job = start_job("--orphan", "--gpus", "2")
    [worker] = [info for info in job.processes() if info["comm"] == "pt_data_worker"]

    run = run_playbook("stop_training.yml", stop_vars(job, job_gpus=[2]))

    assert run.rc == 0, run.stdout[-3000:]
    stopped = run.result(STOP, HOST)
    assert worker["pid"] in {entry["pid"] for entry in stopped["pids"]}
    assert job.processes() == []
    assert run.result(RELEASE, HOST)["released"] is True


def test_second_stop_after_success_reports_no_change(start_job: StartJob) -> None:
    job = start_job()
    variables = stop_vars(job, checkpoint=signal_checkpoint(job))
    first = run_playbook("stop_training.yml", variables)
    assert first.rc == 0, first.stdout[-3000:]
    assert first.result(STOP, HOST)["changed"] is True
    checkpoints = job.checkpoints()

    second = run_playbook("stop_training.yml", variables)

    assert second.rc == 0, second.stdout[-3000:]
    again = second.result(STOP, HOST)
    assert again["changed"] is False
    assert again["pids"] == [] and again["signals"] == []
    assert job.checkpoints() == checkpoints  # no new checkpoint was asked for
    assert again["last_step"] == first.result(STOP, HOST)["last_step"]


def test_ambiguous_match_is_refused_with_the_candidates_and_nothing_is_touched(start_job: StartJob) -> None:
    first, second = start_job(), start_job()
    before = {job.name: job.processes() for job in (first, second)}

    run = run_playbook("stop_training.yml", {"job_cmdline": [RUN_SH], "job_checkpoint": signal_checkpoint(first)})

    assert run.rc != 0
    stopped = run.result(STOP, HOST)
    assert stopped["failed"] is True
    assert "ambiguous" in stopped["msg"]
    assert {candidate["pid"] for candidate in stopped["candidates"]} == {first.pid, second.pid}
    for job in (first, second):
        assert f"PID {job.pid}: {command_of(job.pid, before[job.name])}" in stopped["msg"]
    assert stopped["signals"] == []
    for job in (first, second):
        assert identities(job.processes()) == identities(before[job.name])
        assert job.checkpoints() == []
        assert "Checkpoint requested" not in job.log() and "SIGTERM" not in job.log()
