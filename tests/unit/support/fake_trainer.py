# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A process tree that behaves like a training job, for the stop_training unit tests.

Roles: ``single`` (one trainer process), ``agent`` (torchrun-like: workers in their own sessions, forwards SIGTERM,
dies on SIGUSR1 like torchrun's agent), ``worker``, ``dataloader`` (a worker's child in the worker's session) and
``subreaper`` (adopts orphaned descendants, as systemd --user or tini would). Every process writes
``ready_<role>_<pid>`` into ``--state-dir`` once its signal handlers are installed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
TICK = 0.02


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["single", "agent", "worker", "dataloader", "subreaper"])
    parser.add_argument("--token", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--children", type=int, default=0)
    parser.add_argument("--checkpoint", choices=["signal", "file", "never"], default="never")
    parser.add_argument("--trigger", default="")
    parser.add_argument("--ckpt-dir", default="")
    parser.add_argument("--marker", default="")
    parser.add_argument("--ckpt-delay", type=float, default=0.0)
    parser.add_argument("--die-while-saving", action="store_true", help="exit 1 after half a checkpoint, like a crash")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--children-ignore-term", action="store_true")
    parser.add_argument("--agent-abandons", action="store_true", help="agent exits on SIGTERM without forwarding")
    parser.add_argument("--log", default="")
    parser.add_argument("--start-step", type=int, default=100)
    parser.add_argument("--then", default="single", help="role the subreaper starts")
    return parser.parse_known_args(argv)[0]


def mark_ready(args: argparse.Namespace, role: str) -> None:
    path = os.path.join(args.state_dir, f"ready_{role}_{os.getpid()}")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.rename(path + ".tmp", path)


def spawn(
    args: argparse.Namespace,
    role: str,
    extra: list,
    *,
    new_session: bool = False,
    env: dict | None = None,
    inherit: bool = True,
) -> subprocess.Popen:
    """Start another role of this script; ``inherit`` passes on this process's options (the role is argv[1])."""
    options = sys.argv[2:] if inherit else ["--token", args.token, "--state-dir", args.state_dir]
    command = [sys.executable, os.path.abspath(__file__), role, *options, *extra]
    return subprocess.Popen(command, start_new_session=new_session, env=env)


def write_checkpoint(args: argparse.Namespace, step: int) -> None:
    if not args.ckpt_dir:
        return  # a trainer that accepts the request but never saves
    target = os.path.join(args.ckpt_dir, f"step_{step}")
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "model.safetensors"), "wb") as handle:
        handle.write(b"\0" * 4096)
    if args.die_while_saving:
        os._exit(1)
    if args.ckpt_delay:
        time.sleep(args.ckpt_delay)
    if args.marker:
        with open(os.path.join(target, args.marker), "w") as handle:
            handle.write("done\n")


def log_step(args: argparse.Namespace, step: int) -> None:
    if not args.log or args.rank != 0:
        return
    with open(args.log, "a") as handle:
        handle.write(f"[{step // 3}m] step={step} loss=--- acc=--- | tgt=0.48b/s dft=0.48b/s (19.5Ktok/s) | ETA=7.1d\n")


def train(args: argparse.Namespace, role: str) -> None:
    """The training loop shared by ``single`` and ``worker``: one step per tick, checkpoint when asked."""
    requested = {"save": False}
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.checkpoint == "signal":
        signal.signal(signal.SIGUSR1, lambda *_args: requested.update(save=True))
    children = [
        spawn(args, "dataloader", ["--ignore-term"] if args.children_ignore_term else [], inherit=False)
        for _child in range(args.children)
    ]
    mark_ready(args, role)
    step = args.start_step
    while True:
        step += 1
        log_step(args, step)
        if args.checkpoint == "file" and args.trigger and os.path.exists(args.trigger):
            requested["save"] = True
            os.unlink(args.trigger)
        if requested["save"]:
            requested["save"] = False
            if args.rank == 0:
                write_checkpoint(args, step)
        for child in children:
            child.poll()
        time.sleep(TICK)


def dataloader(args: argparse.Namespace) -> None:
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    mark_ready(args, "dataloader")
    while True:
        time.sleep(1)


def agent(args: argparse.Namespace) -> None:
    run_id = f"run-{args.token}"
    workers = []
    for rank in range(args.workers):
        env = dict(os.environ, TORCHELASTIC_RUN_ID=run_id, RANK=str(rank))
        workers.append(spawn(args, "worker", ["--rank", str(rank)], new_session=True, env=env))

    def shutdown(signum, _frame):
        if not args.agent_abandons:
            for worker in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signum)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(worker.poll() is None for worker in workers):
                time.sleep(TICK)
        os._exit(0)

    signal.signal(signal.SIGTERM, shutdown)
    mark_ready(args, "agent")
    while True:
        for worker in workers:
            worker.poll()
        time.sleep(TICK)


def subreaper(args: argparse.Namespace) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    spawn(args, args.then, [])
    mark_ready(args, "subreaper")
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(TICK)


def main() -> None:
    args = parse_args(sys.argv[1:])
    if args.role in ("single", "worker"):
        train(args, args.role)
    elif args.role == "dataloader":
        dataloader(args)
    elif args.role == "agent":
        agent(args)
    else:
        subreaper(args)


if __name__ == "__main__":
    main()
