"""Shared state of the lab's GPU test double (stdlib only, Python >= 3.11).

TEST DOUBLE. The lab has no GPUs. This module stands in for two things the real
world gets from the NVIDIA driver: the GPU inventory, and the GPU memory that
processes hold. The lab's ``nvidia-smi`` double (``fake_nvidia_smi``) renders
from it, and the other doubles (training simulator, serving stand-in) register
the memory they "hold" through it.

Inventory: a JSON file, path from ``$FAKE_NVIDIA_CONFIG`` (default
``/etc/fake-nvidia/gpus.json``); see ``lab/README.md`` ("Test doubles") for
every key.

Registry: one file per holding process,
``$FAKE_NVIDIA_STATE_DIR/procs/<pid>.json`` (default state dir
``/run/fake-nvidia``), with exactly::

    {"pid": <int>, "starttime": <int>, "name": "<str>", "gpus": {"<index>": <MiB>}}

``starttime`` is field 22 of ``/proc/<pid>/stat``. A registration counts only
while ``/proc/<pid>`` exists with that same starttime and the process is not a
zombie. That mirrors the driver: GPU memory belongs to a CUDA context, and the
kernel tears the context down while the process exits (its ``/dev/nvidia*``
file descriptors are closed before it becomes a zombie). So memory is released
exactly when the holder dies, also by SIGKILL, and a reused PID never inherits
an old registration. Files of dead holders are ignored; ``gc`` removes them.

Memory arithmetic (from the H200 captures): each live holder adds its own MiB
plus a per-process context overhead (8.6 MiB by default) to the GPU's used
memory; free = total - used - reserved. Each figure is kept in KiB and rounded
to MiB on its own, as the real tool does, so used + free + reserved may differ
from total by 1 MiB (it does in the captures: 19601 + 123556 + 615 = 143772).

CLI (for tests and operators)::

    python3 -m fake_gpu hold --gpus 0:1024,1:1024 [--name X] [--pid PID]
    python3 -m fake_gpu release [--pid PID]
    python3 -m fake_gpu list
    python3 -m fake_gpu gc

``hold`` without ``--pid`` registers the ``hold`` process itself and sleeps
until it is signalled (memory is released when it dies); with ``--pid`` it
registers that other, already running process and returns at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_CONFIG_PATH = "/etc/fake-nvidia/gpus.json"
DEFAULT_STATE_DIR = "/run/fake-nvidia"
DEFAULT_CONTEXT_OVERHEAD_MIB = 8.6
KIB_PER_MIB = 1024
VALID_MODES = ("ok", "no-devices", "driver-failure", "mig")


class FakeGpuError(Exception):
    """A configuration or registration problem of the double itself."""


class GpuOutOfMemoryError(FakeGpuError):
    """A registration asked for more memory than a GPU has free (CUDA OOM)."""


def mib_to_kib(mib: float) -> int:
    return round(mib * KIB_PER_MIB)


def kib_to_display_mib(kib: int) -> int:
    """Round half up to whole MiB, the way each figure is shown by nvidia-smi."""
    return (kib + KIB_PER_MIB // 2) // KIB_PER_MIB


@dataclass(frozen=True)
class Gpu:
    """One GPU of the inventory; keys of the JSON config map 1:1 to fields."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: float
    memory_reserved_mib: float
    compute_cap: str
    persistence_mode: bool = True
    power_limit_w: float = 700.0
    power_draw_idle_w: float = 70.0
    power_draw_busy_w: float = 110.0
    temperature_c: int = 30
    fan_speed_pct: int | None = None
    perf_state: str = "P0"
    utilization_busy_pct: int = 2
    memory_utilization_busy_pct: int = 0
    ecc_errors: int | None = 0
    compute_mode: str = "Default"
    display_active: bool = False
    overrides: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Inventory:
    mode: str
    driver_version: str
    cuda_version: str
    context_overhead_mib: float
    gpus: tuple[Gpu, ...]


GPU_KEYS = frozenset(Gpu.__dataclass_fields__) - {"index"}
INVENTORY_KEYS = frozenset({"mode", "driver_version", "cuda_version", "context_overhead_mib", "gpus"})


def config_path() -> Path:
    return Path(os.environ.get("FAKE_NVIDIA_CONFIG", DEFAULT_CONFIG_PATH))


def state_dir() -> Path:
    return Path(os.environ.get("FAKE_NVIDIA_STATE_DIR", DEFAULT_STATE_DIR))


def procs_dir(base: Path | None = None) -> Path:
    return (base or state_dir()) / "procs"


def _gpu_from_json(index: int, raw: dict) -> Gpu:
    unknown = set(raw) - GPU_KEYS
    if unknown:
        raise FakeGpuError(f"GPU {index}: unknown keys {sorted(unknown)}")
    try:
        return Gpu(index=index, **raw)
    except TypeError as exc:  # a required key is missing
        raise FakeGpuError(f"GPU {index}: {exc}") from exc


def parse_inventory(raw: dict) -> Inventory:
    unknown = set(raw) - INVENTORY_KEYS
    if unknown:
        raise FakeGpuError(f"unknown top-level keys {sorted(unknown)}")
    mode = raw.get("mode", "ok")
    if mode not in VALID_MODES:
        raise FakeGpuError(f"mode {mode!r} is not one of {VALID_MODES}")
    gpus = tuple(_gpu_from_json(i, g) for i, g in enumerate(raw.get("gpus", [])))
    return Inventory(
        mode=mode,
        driver_version=raw.get("driver_version", "580.159.04"),
        cuda_version=raw.get("cuda_version", "13.0"),
        context_overhead_mib=raw.get("context_overhead_mib", DEFAULT_CONTEXT_OVERHEAD_MIB),
        gpus=gpus,
    )


def load_inventory(path: Path | None = None) -> Inventory:
    path = path or config_path()
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FakeGpuError(f"cannot read GPU config {path}: {exc}") from exc
    return parse_inventory(raw)


# --- processes -------------------------------------------------------------


def _stat_fields_after_comm(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (comm may hold spaces and parentheses)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_starttime(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), None if gone."""
    fields = _stat_fields_after_comm(pid)
    return int(fields[19]) if fields else None


def process_holds_context(pid: int, starttime: int) -> bool:
    """True while the very process that registered is alive and not a zombie."""
    fields = _stat_fields_after_comm(pid)
    if not fields:
        return False
    state, current_starttime = fields[0], int(fields[19])
    return current_starttime == starttime and state not in ("Z", "X")


def process_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().rstrip("\n")
    except OSError as exc:
        raise FakeGpuError(f"process {pid} does not exist") from exc


# --- registry --------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    pid: int
    starttime: int
    name: str
    gpus: dict[int, int]


def _holder_from_json(raw: dict) -> Holder:
    return Holder(
        pid=int(raw["pid"]),
        starttime=int(raw["starttime"]),
        name=str(raw["name"]),
        gpus={int(k): int(v) for k, v in raw["gpus"].items()},
    )


def read_registrations(base: Path | None = None) -> list[Holder]:
    """Every parseable registration file, live or not."""
    holders = []
    directory = procs_dir(base)
    if not directory.is_dir():
        return []
    for path in sorted(directory.glob("*.json")):
        try:
            holders.append(_holder_from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # being replaced right now, or garbage: it holds nothing
    return holders


def live_holders(base: Path | None = None) -> list[Holder]:
    return [h for h in read_registrations(base) if process_holds_context(h.pid, h.starttime)]


@dataclass(frozen=True)
class GpuMemory:
    used_kib: int
    free_kib: int
    reserved_kib: int
    total_kib: int
    holders: tuple[Holder, ...]

    @property
    def used_mib(self) -> int:
        return kib_to_display_mib(self.used_kib)

    @property
    def free_mib(self) -> int:
        return kib_to_display_mib(self.free_kib)

    @property
    def reserved_mib(self) -> int:
        return kib_to_display_mib(self.reserved_kib)

    @property
    def total_mib(self) -> int:
        return kib_to_display_mib(self.total_kib)


def gpu_memory(inventory: Inventory, gpu: Gpu, holders: list[Holder]) -> GpuMemory:
    on_gpu = tuple(h for h in holders if gpu.index in h.gpus)
    used = sum(mib_to_kib(h.gpus[gpu.index]) + mib_to_kib(inventory.context_overhead_mib) for h in on_gpu)
    total = mib_to_kib(gpu.memory_total_mib)
    reserved = mib_to_kib(gpu.memory_reserved_mib)
    return GpuMemory(
        used_kib=used, free_kib=max(total - used - reserved, 0), reserved_kib=reserved, total_kib=total, holders=on_gpu
    )


def _check_capacity(requested: dict[int, int], ignore_pid: int) -> None:
    """Refuse like cudaMalloc would when the request does not fit.

    Skipped when no inventory is configured (the registry is usable alone).
    """
    try:
        inventory = load_inventory()
    except FakeGpuError:
        return
    holders = [h for h in live_holders() if h.pid != ignore_pid]
    for index, mib in requested.items():
        if index >= len(inventory.gpus):
            raise FakeGpuError(f"GPU {index} does not exist (inventory has {len(inventory.gpus)})")
        memory = gpu_memory(inventory, inventory.gpus[index], holders)
        needed = mib_to_kib(mib) + mib_to_kib(inventory.context_overhead_mib)
        if needed > memory.free_kib:
            raise GpuOutOfMemoryError(
                f"CUDA out of memory on GPU {index}: tried to allocate {mib} MiB, {memory.free_mib} MiB free"
            )


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def register(
    gpus: dict[int, int], name: str | None = None, pid: int | None = None, check_capacity: bool = True
) -> Path:
    """Make ``pid`` (default: this process) hold ``gpus`` {index: MiB}.

    ``name`` defaults to the process's comm, which is what nvidia-smi shows
    (e.g. ``python3``). Raises GpuOutOfMemoryError when a GPU lacks the room.
    """
    pid = os.getpid() if pid is None else pid
    starttime = process_starttime(pid)
    if starttime is None:
        raise FakeGpuError(f"process {pid} does not exist")
    if not gpus or any(mib <= 0 for mib in gpus.values()):
        raise FakeGpuError(f"need at least one GPU and positive MiB, got {gpus}")
    if check_capacity:
        _check_capacity(gpus, ignore_pid=pid)
    record = {
        "pid": pid,
        "starttime": starttime,
        "name": name if name is not None else process_comm(pid),
        "gpus": {str(index): int(mib) for index, mib in sorted(gpus.items())},
    }
    path = procs_dir() / f"{pid}.json"
    _write_atomically(path, json.dumps(record) + "\n")
    return path


def unregister(pid: int | None = None) -> bool:
    """Drop the registration of ``pid`` (default: this process); True if one existed."""
    pid = os.getpid() if pid is None else pid
    try:
        (procs_dir() / f"{pid}.json").unlink()
    except FileNotFoundError:
        return False
    return True


def collect_garbage() -> list[int]:
    """Remove registrations whose process is gone; returns their PIDs."""
    removed = []
    for holder in read_registrations():
        path = procs_dir() / f"{holder.pid}.json"
        if process_holds_context(holder.pid, holder.starttime):
            continue
        # Re-read right before unlinking: the PID may just have been reused and re-registered.
        try:
            current = _holder_from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError):
            continue
        if current.starttime == holder.starttime:
            path.unlink(missing_ok=True)
            removed.append(holder.pid)
    return removed


# --- CLI -------------------------------------------------------------------


def parse_gpu_spec(spec: str) -> dict[int, int]:
    """``0:1024,1:2048`` -> {0: 1024, 1: 2048}."""
    result: dict[int, int] = {}
    for item in spec.split(","):
        index, sep, mib = item.partition(":")
        if not sep or not index.strip().isdigit() or not mib.strip().isdigit():
            raise argparse.ArgumentTypeError(f"bad GPU spec {item!r}, expected INDEX:MIB")
        result[int(index)] = int(mib)
    return result


def _hold_until_signalled(gpus: dict[int, int], name: str | None) -> int:
    register(gpus, name)
    stop = False

    def request_stop(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    print(f"holding {gpus} as pid {os.getpid()}", flush=True)
    while not stop:
        time.sleep(0.2)
    unregister()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fake_gpu", description="Registry of the lab's GPU test double.")
    commands = parser.add_subparsers(dest="command", required=True)
    hold = commands.add_parser("hold", help="hold GPU memory (this process, or --pid)")
    hold.add_argument("--gpus", type=parse_gpu_spec, required=True, help="INDEX:MIB[,INDEX:MIB...]")
    hold.add_argument("--name", help="process name nvidia-smi shows (default: comm of the process)")
    hold.add_argument("--pid", type=int, help="register this running process instead and return")
    hold.add_argument("--no-capacity-check", action="store_true", help="allow more than the GPU has free")
    release = commands.add_parser("release", help="drop a registration")
    release.add_argument("--pid", type=int, required=True)
    commands.add_parser("list", help="print live holders as JSON lines")
    commands.add_parser("gc", help="remove registrations of dead processes")
    args = parser.parse_args(argv)
    try:
        if args.command == "hold" and args.pid is None:
            return _hold_until_signalled(args.gpus, args.name)
        if args.command == "hold":
            register(args.gpus, args.name, pid=args.pid, check_capacity=not args.no_capacity_check)
            return 0
        if args.command == "release":
            return 0 if unregister(args.pid) else 1
        if args.command == "list":
            for holder in live_holders():
                print(json.dumps(holder.__dict__))
            return 0
        print(" ".join(str(pid) for pid in collect_garbage()))
        return 0
    except FakeGpuError as exc:
        print(f"fake_gpu: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
