"""A single-node ``torchrun`` (Pivot lab TEST DOUBLE of torch.distributed.elastic).

What it copies from torchrun (torch 2.x, checked against torch 2.13's sources):

* each worker is ``python3 -u SCRIPT ARGS`` started with ``start_new_session``:
  its own session and process group, so signalling the agent's process group
  does not reach the workers;
* workers get ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``, ``ROLE_RANK``,
  ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
  ``TORCHELASTIC_*``, and ``OMP_NUM_THREADS=1`` when unset and N > 1;
* the agent handles the signals named in ``$TORCHELASTIC_SIGNALS_TO_HANDLE``
  (default ``SIGTERM,SIGINT,SIGHUP,SIGQUIT``): it sends the same signal to every
  live worker's process group, waits up to the shutdown timeout (``--shutdown-
  timeout``, else ``$TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30 s), SIGKILLs the
  process groups still alive, and dies of an uncaught ``SignalException``
  (traceback, exit status 1);
* every other signal keeps its default action: SIGUSR1 to the agent TERMINATES
  the agent and orphans the workers -- checkpoint requests by signal must go to
  the workers, never to the agent; SIGKILL of the agent orphans them as well
  (they re-parent to PID 1 and keep running and holding GPU memory);
* a worker that exits non-zero makes the agent stop the others (SIGTERM, same
  timeout) and exit 1 (``ChildFailedError``); all workers exiting 0 -> exit 0.

Not modelled: rendezvous, restarts (``--max-restarts``), multiple nodes, log
redirection/tee; those options are refused.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from types import FrameType

MONITOR_INTERVAL_SECONDS = 0.1


class SignalException(Exception):
    """Named like torch's, so the agent's dying traceback reads the same."""

    def __init__(self, message: str, sigval: signal.Signals) -> None:
        super().__init__(message)
        self.sigval = sigval


def log(level: str, message: str) -> None:
    """glog-style line on stderr, like torch.distributed.elastic's logger."""
    now = datetime.now()
    stamp = f"{level}{now:%m%d %H:%M:%S}.{now.microsecond:06d} {os.getpid()} torchrun_agent.py]"
    print(f"{stamp} {message}", file=sys.stderr, flush=True)


def raise_signal_exception(signum: int, _frame: FrameType | None) -> None:
    sigval = signal.Signals(signum)
    raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=sigval)


def handled_signals() -> list[signal.Signals]:
    names = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    return [signal.Signals[name.strip()] for name in names.split(",") if name.strip()]


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="torchrun", description="Single-node torchrun (Pivot lab test double).")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1)
    parser.add_argument("--nnodes", default="1", choices=("1", "1:1"))
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, choices=(0,))
    parser.add_argument("--standalone", action="store_true")
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
    parser.add_argument("--master-port", "--master_port", type=int, default=29500)
    parser.add_argument("--shutdown-timeout", "--shutdown_timeout", type=float)
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    # Like torchrun: --standalone picks a random run id; otherwise it is "none".
    options.run_id = uuid.uuid4().hex if options.standalone else "none"
    if options.shutdown_timeout is None:
        options.shutdown_timeout = float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
    return options


def worker_environment(options: argparse.Namespace, local_rank: int) -> dict[str, str]:
    size = str(options.nproc_per_node)
    env = dict(os.environ)
    env.update(
        RANK=str(local_rank), LOCAL_RANK=str(local_rank), GROUP_RANK="0", ROLE_RANK=str(local_rank),
        ROLE_NAME="default", LOCAL_WORLD_SIZE=size, WORLD_SIZE=size, ROLE_WORLD_SIZE=size,
        MASTER_ADDR=options.master_addr, MASTER_PORT=str(options.master_port), TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_RUN_ID=options.run_id, TORCHELASTIC_USE_AGENT_STORE="True",
    )
    if "OMP_NUM_THREADS" not in os.environ and options.nproc_per_node > 1:
        env["OMP_NUM_THREADS"] = "1"
    return env


def start_workers(options: argparse.Namespace, workers: list[subprocess.Popen]) -> None:
    """Start the workers; a death signal arriving meanwhile is held until the worker is on the list."""
    command = [sys.executable, "-u", options.training_script, *options.training_script_args]
    usual_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])

    def restore_mask() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, usual_mask)

    for rank in range(options.nproc_per_node):
        signal.pthread_sigmask(signal.SIG_BLOCK, handled_signals())
        try:
            # preexec_fn: the worker must not inherit the temporary mask (the agent has no threads).
            worker = subprocess.Popen(
                command, env=worker_environment(options, rank), start_new_session=True,
                preexec_fn=restore_mask,  # noqa: PLW1509
            )
            workers.append(worker)
        finally:
            restore_mask()


def close_workers(workers: list[subprocess.Popen], death_sig: signal.Signals, timeout: float) -> None:
    for worker in workers:
        if worker.poll() is None:
            log("W", f"Sending process {worker.pid} closing signal {death_sig.name}")
            os.killpg(worker.pid, death_sig)
    deadline = time.monotonic() + timeout
    for worker in workers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(remaining)
    for worker in workers:
        if worker.poll() is None:
            log("W", f"Unable to shutdown process {worker.pid} via {death_sig.name}, forcefully exiting via SIGKILL")
            os.killpg(worker.pid, signal.SIGKILL)
            try:
                worker.wait(timeout)
            except subprocess.TimeoutExpired:
                log("E", f"Process {worker.pid} did not exit after SIGKILL within {timeout}s; abandoning it")


def monitor(workers: list[subprocess.Popen]) -> int:
    """0 when every worker exited 0; else the first failing rank's exit status."""
    while True:
        statuses = [worker.poll() for worker in workers]
        failed = [(rank, code) for rank, code in enumerate(statuses) if code not in (None, 0)]
        if failed:
            return failed[0][1]
        if all(code == 0 for code in statuses):
            return 0
        time.sleep(MONITOR_INTERVAL_SECONDS)


def main(argv: list[str] | None = None) -> int:
    options = parse_arguments(sys.argv[1:] if argv is None else argv)
    if "OMP_NUM_THREADS" not in os.environ and options.nproc_per_node > 1:
        log("W", "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default")
    for signum in handled_signals():
        signal.signal(signum, raise_signal_exception)
    workers: list[subprocess.Popen] = []
    try:
        start_workers(options, workers)
        failure = monitor(workers)
    except SignalException as exc:
        log("W", f"Received {exc.sigval} death signal, shutting down workers")
        close_workers(workers, exc.sigval, options.shutdown_timeout)
        raise
    if failure:
        close_workers(workers, signal.SIGTERM, options.shutdown_timeout)
        log("E", f"failed (exitcode: {failure}) local_rank: see above")
        print(f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: {options.training_script} FAILED",
              file=sys.stderr, flush=True)
        return 1
    return 0
