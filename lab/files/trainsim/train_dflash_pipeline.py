"""Training simulator standing in for ``train_dflash_pipeline.py`` (Pivot lab TEST DOUBLE).

The real job trains a DFlash drafter on GPUs for days; the lab has no GPUs. This
stdlib-only script behaves like that job from the outside: the same log line,
checkpoints on disk, signal handling and GPU memory (in the ``fake_gpu``
registry that the lab's ``nvidia-smi`` reads). Behaviour is chosen at start by
flags; defaults come from a JSON config (``--config``, else ``$TRAINSIM_CONFIG``,
else ``/etc/trainsim/config.json`` if present; keys are flag names) and flags on
the command line override it. Full description: ``lab/README.md``, "Test doubles".

Log line, once per step, to stdout and ``--log-file``::

    [12m] step=5381 loss=--- acc=--- lr=2.97e-04 gnorm=--- | tgt=0.48b/s dft=0.48b/s (19.5Ktok/s) | ep=0.27 ETA=7.1d

``loss``/``acc``/``gnorm`` are numbers on reporting steps (``--report-every``)
and ``---`` between them. Other lines never contain ``step=``.

Signals (handled at the next step boundary, never in the middle of a save):

* SIGUSR1 -- ``--checkpoint-on sigusr1``: save a checkpoint. ``never``: the
  request is logged exactly like an honoured one and nothing is saved (the
  "checkpoint silently never lands" case). ``trigger``: no handler is
  installed, so SIGUSR1 terminates the process (Python's default), as it would
  a real trainer that does not implement signal checkpoints.
* SIGTERM -- ``--on-sigterm exit`` (log, exit 0 without saving), ``ignore``
  (log ``SIGTERM ignored``, keep training), ``checkpoint-then-exit``.
* SIGINT, SIGHUP, SIGKILL -- Python defaults (SIGINT raises KeyboardInterrupt).

Under the lab's ``torchrun`` (env ``LOCAL_RANK``) each worker holds memory on
GPU ``LOCAL_RANK``; only rank 0 logs, watches the trigger file and saves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import checkpoints

LAB_LIB_DIRS = (os.environ.get("PIVOT_LAB_LIB", "/usr/local/lib/pivot-lab"), str(Path(__file__).resolve().parents[1]))
sys.path.extend(d for d in LAB_LIB_DIRS if Path(d, "fake_gpu.py").is_file())
import fake_gpu  # noqa: E402

DEFAULT_CONFIG = "/etc/trainsim/config.json"
TOKENS_PER_BATCH = 40960
DATASET_STEPS_PER_EPOCH = 20000
WORKER_PROCESS_NAME = b"pt_data_worker"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="DFlash drafter training (Pivot lab simulator).")
    parser.add_argument("--config", help="JSON file with defaults for the flags below")
    parser.add_argument("--checkpoint-dir", default="/var/lib/trainsim/checkpoints")
    parser.add_argument("--log-file", default="/var/log/trainsim/train.log", help="'' for stdout only")
    parser.add_argument("--step-seconds", type=float, default=2.08, help="wall time of one step")
    parser.add_argument("--start-step", type=int, help="default: newest complete checkpoint, else 0")
    parser.add_argument("--resume-from", help="checkpoint directory to resume from; it must be complete "
                        "(default: the newest complete one in --checkpoint-dir)")
    parser.add_argument("--total-steps", type=int, default=300000)
    parser.add_argument("--report-every", type=int, default=50, help="steps between loss/acc reports")
    parser.add_argument("--save-every", type=int, default=1000, help="periodic checkpoints; 0 = never")
    parser.add_argument("--checkpoint-on", choices=("sigusr1", "trigger", "never"), default="sigusr1")
    parser.add_argument("--trigger-file", help="default: <checkpoint-dir>/SAVE_NOW")
    parser.add_argument("--checkpoint-seconds", type=float, default=1.0, help="how long one save takes")
    parser.add_argument("--disk-room-mib", type=float, default=None,
                        help="the checkpoint disk fills after this many MiB of a save (ENOSPC); default: never")
    parser.add_argument("--no-marker", action="store_true",
                        help="write no COMPLETE marker (resume goes by trainer_state.json, written last)")
    parser.add_argument("--on-sigterm", choices=("exit", "ignore", "checkpoint-then-exit"), default="exit")
    parser.add_argument("--gpus", default="0", help="GPU indices held by a single-process run, e.g. 0,1 or 0-7")
    parser.add_argument("--gpu-mib", type=int, default=19592, help="MiB held per GPU; 0 = none")
    parser.add_argument("--orphan", action="store_true", help="leave a dataloader worker that outlives the trainer")
    parser.add_argument("--orphan-gpu-mib", type=int, default=1024)
    return parser


def config_defaults(parser: argparse.ArgumentParser, path: str | None) -> dict:
    if path is None:
        path = os.environ.get("TRAINSIM_CONFIG") or (DEFAULT_CONFIG if Path(DEFAULT_CONFIG).is_file() else None)
    if path is None:
        return {}
    raw = json.loads(Path(path).read_text())
    known = {action.dest for action in parser._actions}
    defaults = {key.replace("-", "_"): value for key, value in raw.items()}
    unknown = set(defaults) - known
    if unknown:
        parser.error(f"unknown keys in {path}: {sorted(unknown)}")
    return defaults


def parse_options(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    first_pass, _unused = parser.parse_known_args(argv)
    parser.set_defaults(**config_defaults(parser, first_pass.config))
    options = parser.parse_args(argv)
    if options.trigger_file is None:
        options.trigger_file = str(Path(options.checkpoint_dir) / "SAVE_NOW")
    if options.resume_from is not None and options.start_step is not None:
        parser.error("--resume-from and --start-step exclude each other")
    return options


def parse_gpu_list(spec: str) -> list[int]:
    indices: list[int] = []
    for part in spec.split(","):
        low, _unused, high = part.partition("-")
        indices.extend(range(int(low), int(high or low) + 1))
    return indices


@dataclass
class Rank:
    rank: int
    local_rank: int | None
    world_size: int

    @property
    def is_zero(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> Rank:
        local = os.environ.get("LOCAL_RANK")
        return cls(int(os.environ.get("RANK", "0")), None if local is None else int(local),
                   int(os.environ.get("WORLD_SIZE", "1")))


@dataclass
class Requests:
    """Flags set by signal handlers, consumed at step boundaries."""

    checkpoint_signals: int = 0
    sigterms: int = 0
    trigger_seen: bool = False

    def on_sigusr1(self, _signum: int, _frame: object) -> None:
        self.checkpoint_signals += 1

    def on_sigterm(self, _signum: int, _frame: object) -> None:
        self.sigterms += 1


class Log:
    """Writes each line to stdout and the log file, flushed at once like a real trainer's print."""

    def __init__(self, path: str, enabled: bool, clock_start: float, minutes_before: float) -> None:
        self.enabled = enabled
        self.clock_start = clock_start
        self.minutes_before = minutes_before
        self.file: TextIO | None = None
        if enabled and path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "a")  # noqa: SIM115 - open for the life of the process

    def minutes(self) -> float:
        return self.minutes_before + (time.monotonic() - self.clock_start) / 60

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        stamped = f"[{int(self.minutes())}m] {text}"
        print(stamped, flush=True)
        if self.file:
            self.file.write(stamped + "\n")
            self.file.flush()


def format_eta(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 60:.1f}m"


def step_line(step: int, options: argparse.Namespace, seconds_per_step: float) -> str:
    reporting = options.report_every > 0 and step % options.report_every == 0
    noise = random.Random(step)
    loss = 0.85 + 2.4 * math.exp(-step / 30000) + noise.uniform(-0.05, 0.05)
    acc = min(0.99, 0.78 - 0.55 * math.exp(-step / 25000) + noise.uniform(-0.01, 0.01))
    gnorm = 0.6 + noise.uniform(0.0, 0.5)
    lr = 3e-4 * (0.5 * (1 + math.cos(math.pi * min(step, options.total_steps) / options.total_steps)))
    rate = 1 / seconds_per_step
    remaining = max(options.total_steps - step, 0) * seconds_per_step
    return (
        f"step={step} loss={f'{loss:.4f}' if reporting else '---'} acc={f'{acc:.4f}' if reporting else '---'} "
        f"lr={lr:.2e} gnorm={f'{gnorm:.3f}' if reporting else '---'} | "
        f"tgt={rate:.2f}b/s dft={rate:.2f}b/s ({rate * TOKENS_PER_BATCH / 1000:.1f}Ktok/s) | "
        f"ep={step / DATASET_STEPS_PER_EPOCH:.2f} ETA={format_eta(remaining)}"
    )


def set_process_name(name: bytes) -> None:
    """prctl(PR_SET_NAME): what PyTorch does for its dataloader workers (comm, as pgrep matches it)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes  # noqa: PLC0415 - only the worker needs it

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name), 0, 0, 0)


def start_orphan_worker(gpus: list[int], mib: int) -> int:
    """Fork a "dataloader worker" that holds GPU memory and never exits on its own."""
    pid = os.fork()
    if pid:
        return pid
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_DFL)
        set_process_name(WORKER_PROCESS_NAME)
        fake_gpu.register({gpu: mib for gpu in gpus}, check_capacity=False)
        while True:
            time.sleep(3600)
    finally:
        os._exit(0)


class ResumeError(Exception):
    """--resume-from names something that is not a complete checkpoint."""


class Trainer:
    def __init__(self, options: argparse.Namespace, rank: Rank) -> None:
        self.options = options
        self.rank = rank
        self.requests = Requests()
        self.root = Path(options.checkpoint_dir)
        self.step, resumed_from, minutes_before = self.initial_step()
        self.log = Log(options.log_file, rank.is_zero, time.monotonic(), minutes_before)
        self.last_step_end = time.monotonic()
        self.seconds_per_step = options.step_seconds
        if resumed_from:
            self.log.line(f"Resuming from checkpoint {resumed_from} (global step {self.step})")
        else:
            self.log.line(f"Starting at global step {self.step}")

    def initial_step(self) -> tuple[int, Path | None, float]:
        if self.options.start_step is not None:
            return self.options.start_step, None, 0.0
        if self.options.resume_from is not None:
            return self.resume_point(Path(self.options.resume_from))
        newest = checkpoints.newest_complete(self.root, marker=not self.options.no_marker)
        if newest is None:
            return 0, None, 0.0
        step, path = newest
        return step, path, float(checkpoints.read_trainer_state(path).get("train_minutes", 0.0))

    def resume_point(self, path: Path) -> tuple[int, Path, float]:
        """The step and minutes of the checkpoint named by --resume-from, which must be complete."""
        marker = not self.options.no_marker
        if not checkpoints.is_complete(path, marker=marker):
            what = f"no {checkpoints.MARKER} marker" if marker else "no trainer_state.json with its global_step"
            raise ResumeError(f"cannot resume from {path}: it is not a complete checkpoint ({what})")
        state = checkpoints.read_trainer_state(path)
        if not isinstance(state.get("global_step"), int):
            raise ResumeError(f"cannot resume from {path}: its trainer_state.json names no global_step")
        return state["global_step"], path, float(state.get("train_minutes", 0.0))

    def gpus(self) -> list[int]:
        if self.rank.local_rank is not None:
            return [self.rank.local_rank]
        return parse_gpu_list(self.options.gpus)

    def install_signal_handlers(self) -> None:
        if self.options.checkpoint_on in ("sigusr1", "never"):
            signal.signal(signal.SIGUSR1, self.requests.on_sigusr1)
        signal.signal(signal.SIGTERM, self.requests.on_sigterm)

    def hold_gpu_memory(self) -> None:
        if self.options.gpu_mib <= 0:
            return
        gpus = self.gpus()
        fake_gpu.register({gpu: self.options.gpu_mib for gpu in gpus})
        self.log.line(f"Holding {self.options.gpu_mib} MiB on GPU(s) {','.join(map(str, gpus))} (pid {os.getpid()})")

    def save(self, reason: str) -> None:
        target = self.root / checkpoints.directory_name(self.step)
        if checkpoints.is_complete(target, marker=not self.options.no_marker):
            self.log.line(f"Checkpoint for global step {self.step} already on disk ({reason})")
            return
        self.log.line(f"Saving checkpoint for global step {self.step} ({reason}) to {target}")
        started = time.monotonic()
        checkpoints.write_checkpoint(
            self.root, self.step, self.options.checkpoint_seconds,
            {"train_minutes": round(self.log.minutes(), 3), "world_size": self.rank.world_size},
            marker=not self.options.no_marker,
            room_bytes=None if self.options.disk_room_mib is None else int(self.options.disk_room_mib * 2**20),
        )
        self.log.line(f"Checkpoint saved: {target} ({time.monotonic() - started:.1f}s)")

    def trigger_requested(self) -> bool:
        """True once per appearance of the trigger file."""
        present = Path(self.options.trigger_file).exists()
        first_sight = present and not self.requests.trigger_seen
        self.requests.trigger_seen = present
        return first_sight

    def handle_checkpoint_requests(self) -> None:
        signals, self.requests.checkpoint_signals = self.requests.checkpoint_signals, 0
        if not self.rank.is_zero:
            return
        sources = ["SIGUSR1"] * bool(signals)
        if self.options.checkpoint_on in ("trigger", "never") and self.trigger_requested():
            sources.append(f"trigger file {self.options.trigger_file}")
        for source in sources:
            self.log.line(f"Checkpoint requested ({source})")
        if not sources or self.options.checkpoint_on == "never":
            return
        if self.options.checkpoint_on == "trigger":
            Path(self.options.trigger_file).unlink(missing_ok=True)
            self.requests.trigger_seen = False
        self.save("requested")

    def handle_sigterm(self) -> bool:
        """True when the process should now exit."""
        if not self.requests.sigterms:
            return False
        self.requests.sigterms = 0
        mode = self.options.on_sigterm
        if mode == "ignore":
            self.log.line("SIGTERM ignored")
            return False
        if mode == "checkpoint-then-exit":
            self.log.line("SIGTERM received: saving a checkpoint, then exiting")
            if self.rank.is_zero:
                self.save("SIGTERM")
        else:
            self.log.line("SIGTERM received: exiting without a checkpoint")
        return True

    def train_one_step(self) -> None:
        time.sleep(self.options.step_seconds)
        self.step += 1
        now = time.monotonic()
        # Smoothed like a real trainer's throughput meter; time spent saving is not counted.
        self.seconds_per_step = max(0.8 * self.seconds_per_step + 0.2 * (now - self.last_step_end), 1e-6)
        self.last_step_end = now
        self.log.line(step_line(self.step, self.options, self.seconds_per_step))

    def run(self) -> int:
        self.install_signal_handlers()
        self.hold_gpu_memory()
        if self.options.orphan:
            worker = start_orphan_worker(self.gpus(), self.options.orphan_gpu_mib)
            self.log.line(f"Started dataloader worker pid {worker}")
        while self.step < self.options.total_steps:
            self.train_one_step()
            self.handle_checkpoint_requests()
            if self.handle_sigterm():
                return 0
            periodic = self.options.save_every > 0 and self.step % self.options.save_every == 0
            if periodic and self.rank.is_zero:
                self.save("periodic")
            self.last_step_end = time.monotonic()
        if self.rank.is_zero:
            self.save("final")
        self.log.line("Training complete")
        return 0


def main(argv: list[str] | None = None) -> int:
    options = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        trainer = Trainer(options, Rank.from_environment())
    except ResumeError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        return trainer.run()
    except fake_gpu.GpuOutOfMemoryError as exc:
        print(f"torch.OutOfMemoryError: {exc}", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:
        # As a trainer's logger records the exception that ends it, in its log file as well as on stderr.
        trainer.log.line(f"ERROR: training stopped at global step {trainer.step}: OSError: {exc}")
        raise
    finally:
        fake_gpu.unregister()


if __name__ == "__main__":
    sys.exit(main())
