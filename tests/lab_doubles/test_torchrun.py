"""The lab's torchrun-like launcher: workers in their own sessions, signal forwarding, orphans."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from lab_doubles_support import (
    PYTHON,
    TRAINSIM,
    children_of,
    is_running,
    proc_cmdline,
    proc_environ,
    proc_ppid,
    wait_for,
)

NOHEADER_NOUNITS = "--format=csv,noheader,nounits"
TRAINER = str(TRAINSIM / "train_dflash_pipeline.py")


def start_torchrun(trainsim, nproc: int, *flags: str, agent_flags: tuple[str, ...] = (), **popen: object):
    """The agent and its worker PIDs (all tracked for clean-up)."""
    command = [PYTHON, str(TRAINSIM / "torchrun"), f"--nproc-per-node={nproc}", *agent_flags, TRAINER]
    agent = trainsim.start(*flags, command=command, **popen)
    workers = wait_for(lambda: len(children_of(agent.pid)) == nproc and children_of(agent.pid), what="workers")
    trainsim.processes.track(*workers)
    return agent, workers


def holders(trainsim) -> dict[int, list[int]]:
    out = trainsim.smi.smi_ok("--query-compute-apps=pid,gpu_bus_id", NOHEADER_NOUNITS)
    bus_to_index = {
        bus: int(index)
        for index, bus in (
            line.split(", ")
            for line in trainsim.smi.smi_ok("--query-gpu=index,pci.bus_id", NOHEADER_NOUNITS).splitlines()
        )
    }
    found: dict[int, list[int]] = {}
    for pid, bus in (line.split(", ") for line in out.splitlines()):
        found.setdefault(int(pid), []).append(bus_to_index[bus])
    return found


def test_workers_run_in_their_own_sessions_with_rank_environment(trainsim):
    agent, workers = start_torchrun(trainsim, 3)
    trainsim.wait_for_step(2)
    assert len({os.getsid(w) for w in workers}) == 3
    for worker in workers:
        assert os.getsid(worker) == worker == os.getpgid(worker)
        assert os.getsid(worker) != os.getsid(agent.pid)
        assert proc_cmdline(worker)[1:3] == ["-u", TRAINER]
    ranks = sorted(
        (int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"]), env["OMP_NUM_THREADS"])
        for env in map(proc_environ, workers)
    )
    assert ranks == [(0, 0, 3, "1"), (1, 1, 3, "1"), (2, 2, 3, "1")]
    by_rank = {int(proc_environ(w)["LOCAL_RANK"]): w for w in workers}
    wait_for(lambda: len(holders(trainsim)) == 3, what="three registrations")
    assert holders(trainsim) == {by_rank[0]: [0], by_rank[1]: [1], by_rank[2]: [2]}
    steps = trainsim.steps()
    assert steps == sorted(set(steps))  # only rank 0 logs


def test_sigterm_to_agent_stops_every_worker(trainsim):
    agent, workers = start_torchrun(trainsim, 2, "--on-sigterm", "exit")
    trainsim.wait_for_step(2)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=20) == 1
    assert not any(is_running(w) for w in workers)
    output = trainsim.stdout_file.read_text()
    # Worded like torch's agent log; Python >= 3.11 formats the signal as its number.
    assert re.search(r"Received (Signals\.SIGTERM|15) death signal, shutting down workers", output)
    assert "SignalException: Process" in output
    assert "forcefully" not in output
    assert trainsim.smi.memory_used() == [0] * 8


def test_agent_sigkills_workers_that_ignore_sigterm_after_the_shutdown_timeout(trainsim):
    agent, workers = start_torchrun(
        trainsim, 2, "--on-sigterm", "ignore", agent_flags=("--shutdown-timeout", "1")
    )
    trainsim.wait_for_step(2)
    sent = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=20) == 1
    assert time.monotonic() - sent >= 1.0
    assert not any(is_running(w) for w in workers)
    assert trainsim.wait_for_log("SIGTERM ignored")
    assert "forcefully exiting via SIGKILL" in trainsim.stdout_file.read_text()
    assert trainsim.smi.memory_used() == [0] * 8


def test_shutdown_timeout_from_environment(trainsim):
    trainsim.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "0"
    agent, workers = start_torchrun(trainsim, 1, "--on-sigterm", "ignore")
    trainsim.wait_for_step(1)
    agent.send_signal(signal.SIGINT)
    assert agent.wait(timeout=10) == 1
    # With a 0 s timeout the agent SIGKILLs at once and does not wait for the worker to be gone.
    wait_for(lambda: not is_running(workers[0]), what="worker to die")
    assert "forcefully exiting via SIGKILL" in trainsim.stdout_file.read_text()
    assert re.search(r"Received (Signals\.SIGINT|2) death signal", trainsim.stdout_file.read_text())


def test_sigkill_of_the_agent_orphans_the_workers(trainsim):
    agent, workers = start_torchrun(trainsim, 2)
    trainsim.wait_for_step(2)
    wait_for(lambda: len(holders(trainsim)) == 2, what="two registrations")
    agent.send_signal(signal.SIGKILL)
    agent.wait(timeout=10)
    step = trainsim.last_step()
    trainsim.wait_for_step(step + 3)
    for worker in workers:
        assert is_running(worker)
        assert proc_ppid(worker) != agent.pid
    assert sorted(holders(trainsim)) == sorted(workers)
    for worker in workers:
        os.kill(worker, signal.SIGKILL)
    wait_for(lambda: not any(is_running(w) for w in workers), what="workers to die")
    assert trainsim.smi.memory_used() == [0] * 8


def test_killing_the_agents_process_group_does_not_reach_the_workers(trainsim):
    agent, workers = start_torchrun(trainsim, 2, start_new_session=True)
    trainsim.wait_for_step(1)
    os.killpg(agent.pid, signal.SIGKILL)  # what `kill -9 -PGID` of the launcher's group does
    agent.wait(timeout=10)
    time.sleep(0.3)
    assert all(is_running(w) for w in workers)


def test_sigusr1_to_the_agent_terminates_it_and_orphans_workers(trainsim):
    """The real agent has no SIGUSR1 handler: the default action kills it."""
    agent, workers = start_torchrun(trainsim, 2)
    trainsim.wait_for_step(1)
    agent.send_signal(signal.SIGUSR1)
    assert agent.wait(timeout=10) == -signal.SIGUSR1
    assert all(is_running(w) for w in workers)
    assert trainsim.complete_steps() == []


def test_sigusr1_to_rank_zero_checkpoints(trainsim):
    agent, workers = start_torchrun(trainsim, 2)
    rank0 = next(w for w in workers if proc_environ(w)["RANK"] == "0")
    rank1 = next(w for w in workers if w != rank0)
    trainsim.wait_for_step(2)
    os.kill(rank1, signal.SIGUSR1)  # handled (same script), but only rank 0 saves
    os.kill(rank0, signal.SIGUSR1)
    wait_for(trainsim.complete_steps, what="a checkpoint")
    assert len(trainsim.complete_steps()) == 1
    assert all(is_running(w) for w in workers)
    assert agent.poll() is None


def test_a_failing_worker_makes_the_agent_stop_the_others(trainsim):
    # GPU 1 is already full: rank 1 runs out of memory at start, rank 0 would train on.
    filler = trainsim.smi.fake_gpu("hold", "--gpus", "1:143000", "--pid", str(os.getpid()))
    assert filler.returncode == 0, filler.stderr
    try:
        agent = trainsim.start(command=[PYTHON, str(TRAINSIM / "torchrun"), "--nproc-per-node", "2", TRAINER])
        assert agent.wait(timeout=20) == 1
    finally:
        trainsim.smi.fake_gpu("release", "--pid", str(os.getpid()))
    output = trainsim.stdout_file.read_text()
    assert "CUDA out of memory on GPU 1" in output
    assert "ChildFailedError" in output
    assert children_of(agent.pid) == []


def test_all_workers_finishing_ends_the_agent_with_status_zero(trainsim):
    agent = trainsim.start("--total-steps", "3",
                           command=[PYTHON, str(TRAINSIM / "torchrun"), "--nproc_per_node=2", TRAINER])
    assert agent.wait(timeout=20) == 0
    assert trainsim.steps() == [1, 2, 3]
    assert trainsim.complete_steps() == [3]


def test_run_sh_in_torchrun_mode_keeps_the_real_process_tree(trainsim, processes):
    run = trainsim.start(command=["bash", str(TRAINSIM / "run.sh"), "--nproc-per-node", "2"])

    def torchrun_child() -> int | None:
        # bash forks, then execs ./torchrun through `env python`: wait until the exec chain has settled. A child
        # seen on the way may be gone by the time its command line is read (CI once failed so): not yet, then.
        kids = children_of(run.pid)
        try:
            argv = proc_cmdline(kids[0]) if kids else []
        except FileNotFoundError:
            return None
        return kids[0] if argv[1:2] and argv[1].endswith("torchrun") else None

    agent = wait_for(torchrun_child, what="agent")
    processes.track(agent)
    workers = wait_for(lambda: len(children_of(agent)) == 2 and children_of(agent), what="workers")
    processes.track(*workers)
    assert proc_cmdline(agent)[1].endswith("torchrun")
    assert os.getsid(agent) == os.getsid(run.pid)
    assert all(os.getsid(w) == w for w in workers)
    os.kill(agent, signal.SIGTERM)
    assert run.wait(timeout=20) == 1
    assert not any(is_running(w) for w in workers)


def test_unsupported_torchrun_options_are_refused(trainsim):
    result = subprocess.run(
        [PYTHON, str(TRAINSIM / "torchrun"), "--nnodes=2", TRAINER], env=trainsim.env, capture_output=True,
        text=True, timeout=30, check=False,
    )
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
