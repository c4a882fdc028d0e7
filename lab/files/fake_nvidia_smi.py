"""The lab's ``nvidia-smi`` (stdlib only, Python >= 3.11).

TEST DOUBLE for NVIDIA's ``nvidia-smi`` 580.159.04 (CUDA 13.0): the lab has no
GPUs. It answers the queries Pivot uses, in the byte-exact format of real
captures (``tests/fixtures/nvidia-smi/``): ``--query-gpu``,
``--query-compute-apps``, ``--format=csv[,noheader][,nounits]``, ``-i/--id``,
``-L``, ``-h`` and plain ``nvidia-smi``; errors print what the real tool prints,
on stdout, with its exit statuses. GPUs come from the inventory and memory from
the live holders of the ``fake_gpu`` registry, so figures follow processes that
start and die. Options of the real tool that the double does not implement
fail loudly on stderr with exit status 3 instead of pretending.

Known gaps (no capture to copy them from): plain output in MIG mode has no
"MIG devices" table and shows GI/CI ids as 0; messages for a missing or bad
``--format`` are the double's own wording.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import fake_gpu
from fake_gpu import FakeGpuError, Gpu, GpuMemory, Holder, Inventory

EXIT_INVALID_ARGUMENT = 2
EXIT_NO_DEVICES = 6
EXIT_DRIVER_FAILURE = 9
EXIT_UNKNOWN_OPTION = 255
EXIT_NOT_IMPLEMENTED = 3
EXIT_LAB_MISCONFIGURED = 70

NO_DEVICES = "No devices were found"
DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
NA = "[N/A]"

USAGE = """NVIDIA System Management Interface -- lab test double (subset of nvidia-smi 580.159.04)

    nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
    -L,   --list-gpus           List each GPU with its UUID.
    -i,   --id=                 Target GPUs by index, UUID or PCI bus id (comma-separated).
    --query-gpu=                Comma-separated GPU properties (index, uuid, name, memory.used, ...).
    --query-compute-apps=       Comma-separated compute-process properties (pid, process_name, used_memory, ...).
    --format=                   csv, optionally with noheader and/or nounits.

This is the Pivot lab's test double; every other option of the real tool is not implemented.
"""

# Options of the real tool that this double knowingly does not implement.
REAL_BUT_UNIMPLEMENTED = frozenset(
    {"-q", "--query", "-x", "--xml-format", "-l", "--loop", "-lms", "--loop-ms", "-d", "--display", "-f",
     "--filename", "-u", "--unit", "-pm", "--persistence-mode", "-r", "--gpu-reset", "-mig", "--multi-instance-gpu",
     "--version", "-B", "--list-excluded-gpus", "-e", "--ecc-config", "-c", "--compute-mode", "-pl",
     "--power-limit", "--query-accounted-apps", "--query-retired-pages", "--query-remapped-rows",
     "--query-supported-clocks", "topo", "nvlink", "clocks", "dmon", "pmon", "mig", "vgpu", "drain", "conf-compute"}
)


class SmiExit(Exception):
    """Ends the run with text on stdout and an exit status, like the real tool."""

    def __init__(self, text: str, status: int, to_stderr: bool = False) -> None:
        super().__init__(text)
        self.text = text
        self.status = status
        self.to_stderr = to_stderr


# --- command line ----------------------------------------------------------


@dataclass
class Request:
    help: bool = False
    list_gpus: bool = False
    ids: list[str] | None = None
    query_gpu: list[str] | None = None
    query_apps: list[str] | None = None
    format_tokens: list[str] | None = None


VALUED_OPTIONS = {
    "-i": "ids", "--id": "ids", "--query-gpu": "query_gpu", "--query-compute-apps": "query_apps",
    "--format": "format_tokens",
}


def unknown_option(arg: str) -> SmiExit:
    return SmiExit(f"ERROR: Option {arg} is not recognized. Please run 'nvidia-smi -h'.", EXIT_UNKNOWN_OPTION)


def split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",")]


def parse_args(argv: list[str]) -> Request:
    """getopt_long conventions: ``--opt=value``, ``--opt value``, ``-i value``, ``-ivalue``."""
    request = Request()
    position = 0
    while position < len(argv):
        arg = argv[position]
        position += 1
        name, has_inline, inline = arg.partition("=") if arg.startswith("--") else (arg, False, "")
        if name.startswith("-i") and not name.startswith("--") and len(name) > 2:
            name, has_inline, inline = "-i", True, name[2:]
        if name in ("-h", "--help"):
            request.help = True
        elif name in ("-L", "--list-gpus"):
            request.list_gpus = True
        elif name in VALUED_OPTIONS:
            if not has_inline:
                if position >= len(argv):
                    raise unknown_option(arg)
                inline = argv[position]
                position += 1
            setattr(request, VALUED_OPTIONS[name], split_list(inline))
        elif name in REAL_BUT_UNIMPLEMENTED:
            raise SmiExit(
                f"nvidia-smi (Pivot lab test double): option {name} is not implemented", EXIT_NOT_IMPLEMENTED, True
            )
        else:
            raise unknown_option(arg)
    return request


# --- field catalogue -------------------------------------------------------


@dataclass(frozen=True)
class GpuView:
    """Everything one output line about a GPU needs."""

    inventory: Inventory
    gpu: Gpu
    memory: GpuMemory

    @property
    def busy(self) -> bool:
        return bool(self.memory.holders)

    @property
    def mig(self) -> bool:
        return self.inventory.mode == "mig"


@dataclass(frozen=True)
class Field:
    header: str
    unit: str  # "" when the real tool prints no unit
    value: Callable[[GpuView], str]


def _utilization(view: GpuView, busy_pct: int) -> str:
    if view.mig:
        return NA  # NVML has no whole-GPU utilization with MIG enabled
    return str(busy_pct if view.busy else 0)


def _enabled(flag: bool) -> str:
    return "Enabled" if flag else "Disabled"


GPU_FIELDS: dict[str, Field] = {
    "index": Field("index", "", lambda v: str(v.gpu.index)),
    "uuid": Field("uuid", "", lambda v: v.gpu.uuid),
    "name": Field("name", "", lambda v: v.gpu.name),
    "pci.bus_id": Field("pci.bus_id", "", lambda v: v.gpu.pci_bus_id),
    "driver_version": Field("driver_version", "", lambda v: v.inventory.driver_version),
    "count": Field("count", "", lambda v: str(len(v.inventory.gpus))),
    "compute_cap": Field("compute_cap", "", lambda v: v.gpu.compute_cap),
    "persistence_mode": Field("persistence_mode", "", lambda v: _enabled(v.gpu.persistence_mode)),
    "display_active": Field("display_active", "", lambda v: _enabled(v.gpu.display_active)),
    "compute_mode": Field("compute_mode", "", lambda v: v.gpu.compute_mode),
    "pstate": Field("pstate", "", lambda v: v.gpu.perf_state),
    "memory.total": Field("memory.total", "MiB", lambda v: str(v.memory.total_mib)),
    "memory.reserved": Field("memory.reserved", "MiB", lambda v: str(v.memory.reserved_mib)),
    "memory.used": Field("memory.used", "MiB", lambda v: str(v.memory.used_mib)),
    "memory.free": Field("memory.free", "MiB", lambda v: str(v.memory.free_mib)),
    "utilization.gpu": Field("utilization.gpu", "%", lambda v: _utilization(v, v.gpu.utilization_busy_pct)),
    "utilization.memory": Field(
        "utilization.memory", "%", lambda v: _utilization(v, v.gpu.memory_utilization_busy_pct)
    ),
    "temperature.gpu": Field("temperature.gpu", "", lambda v: str(v.gpu.temperature_c)),
    "fan.speed": Field("fan.speed", "%", lambda v: NA if v.gpu.fan_speed_pct is None else str(v.gpu.fan_speed_pct)),
    "power.draw": Field(
        "power.draw", "W", lambda v: f"{v.gpu.power_draw_busy_w if v.busy else v.gpu.power_draw_idle_w:.2f}"
    ),
    "power.limit": Field("power.limit", "W", lambda v: f"{v.gpu.power_limit_w:.2f}"),
    "mig.mode.current": Field("mig.mode.current", "", lambda v: _enabled(v.mig)),
    "mig.mode.pending": Field("mig.mode.pending", "", lambda v: _enabled(v.mig)),
    "ecc.errors.uncorrected.volatile.total": Field(
        "ecc.errors.uncorrected.volatile.total", "", lambda v: NA if v.gpu.ecc_errors is None else str(v.gpu.ecc_errors)
    ),
}
GPU_FIELD_ALIASES = {"gpu_uuid": "uuid", "gpu_name": "name", "gpu_bus_id": "pci.bus_id"}


@dataclass(frozen=True)
class AppRow:
    holder: Holder
    view: GpuView


APP_FIELDS: dict[str, tuple[str, str, Callable[[AppRow], str]]] = {
    "pid": ("pid", "", lambda r: str(r.holder.pid)),
    "process_name": ("process_name", "", lambda r: r.holder.name),
    "used_gpu_memory": (
        "used_gpu_memory", "MiB", lambda r: NA if r.view.mig else str(r.holder.gpus[r.view.gpu.index])
    ),
    "gpu_uuid": ("gpu_uuid", "", lambda r: r.view.gpu.uuid),
    "gpu_bus_id": ("gpu_bus_id", "", lambda r: r.view.gpu.pci_bus_id),
    "gpu_name": ("gpu_name", "", lambda r: r.view.gpu.name),
}
APP_FIELD_ALIASES = {"used_memory": "used_gpu_memory", "name": "process_name"}


def canonical_fields(requested: list[str], catalogue: dict, aliases: dict[str, str]) -> list[str]:
    canonical = []
    for name in requested:
        key = aliases.get(name, name)
        if key not in catalogue:
            raise SmiExit(f'Field "{name}" is not a valid field to query.', EXIT_INVALID_ARGUMENT)
        canonical.append(key)
    return canonical


def gpu_field_value(view: GpuView, key: str) -> str:
    """The raw value (no unit); a config override replaces it."""
    override = view.gpu.overrides.get(key)
    return override if override is not None else GPU_FIELDS[key].value(view)


def with_unit(raw: str, unit: str, nounits: bool) -> str:
    if nounits or not unit or raw.startswith("["):
        return raw
    return f"{raw} {unit}"


def header_cell(name: str, unit: str, nounits: bool) -> str:
    return name if nounits or not unit else f"{name} [{unit}]"


# --- format option -----------------------------------------------------------


@dataclass(frozen=True)
class CsvFormat:
    header: bool
    units: bool


def parse_format(tokens: list[str] | None) -> CsvFormat:
    if tokens is None:
        raise SmiExit("'--format' is required with a --query-* option. Please run 'nvidia-smi -h'.", 2)
    unknown = [t for t in tokens if t not in ("csv", "noheader", "nounits")]
    if unknown or "csv" not in tokens:
        bad = unknown[0] if unknown else ",".join(tokens)
        raise SmiExit(f'"{bad}" is not a valid format. Please run \'nvidia-smi -h\'.', EXIT_INVALID_ARGUMENT)
    return CsvFormat(header="noheader" not in tokens, units="nounits" not in tokens)


# --- GPU selection -----------------------------------------------------------


def matches_id(gpu: Gpu, wanted: str) -> bool:
    if wanted.isdigit():
        return int(wanted) == gpu.index
    if wanted.upper().startswith("GPU-"):
        return wanted.lower() == gpu.uuid.lower()
    return gpu.pci_bus_id.upper().endswith(wanted.upper()) and ":" in wanted


def select_gpus(inventory: Inventory, ids: list[str] | None) -> list[Gpu]:
    if not inventory.gpus:
        raise SmiExit(NO_DEVICES, EXIT_NO_DEVICES)
    if ids is None:
        return list(inventory.gpus)
    selected = []
    for wanted in ids:
        found = [g for g in inventory.gpus if matches_id(g, wanted)]
        if not found:
            raise SmiExit(NO_DEVICES, EXIT_NO_DEVICES)
        selected.extend(g for g in found if g not in selected)
    return selected


def gpu_views(inventory: Inventory, gpus: list[Gpu]) -> list[GpuView]:
    holders = fake_gpu.live_holders()
    return [GpuView(inventory, gpu, fake_gpu.gpu_memory(inventory, gpu, holders)) for gpu in gpus]


# --- renderers ---------------------------------------------------------------


def render_query_gpu(views: list[GpuView], keys: list[str], fmt: CsvFormat) -> str:
    lines = []
    if fmt.header:
        lines.append(", ".join(header_cell(GPU_FIELDS[k].header, GPU_FIELDS[k].unit, not fmt.units) for k in keys))
    for view in views:
        lines.append(
            ", ".join(with_unit(gpu_field_value(view, k), GPU_FIELDS[k].unit, not fmt.units) for k in keys)
        )
    return "".join(line + "\n" for line in lines)


def app_rows(views: list[GpuView]) -> list[AppRow]:
    return [AppRow(h, v) for v in views for h in sorted(v.memory.holders, key=lambda h: h.pid)]


def render_query_apps(views: list[GpuView], keys: list[str], fmt: CsvFormat) -> str:
    lines = []
    if fmt.header:
        lines.append(", ".join(header_cell(APP_FIELDS[k][0], APP_FIELDS[k][1], not fmt.units) for k in keys))
    for row in app_rows(views):
        lines.append(", ".join(with_unit(APP_FIELDS[k][2](row), APP_FIELDS[k][1], not fmt.units) for k in keys))
    return "".join(line + "\n" for line in lines)


def render_list(views: list[GpuView]) -> str:
    return "".join(f"GPU {v.gpu.index}: {v.gpu.name} (UUID: {v.gpu.uuid})\n" for v in views)


# Plain output: the 580-series layout, three cells of 41/24/22 characters per GPU row.
RULE = "+" + "-" * 89 + "+"
GPU_RULE = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
GPU_DOUBLE_RULE = "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|"
GPU_TABLE_HEADER = (
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
)
PROCESS_TABLE_HEADER = (
    "| Processes:                                                                              |",
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|" + "=" * 89 + "|",
)
NAME_CELL_MAX = 27
PROCESS_NAME_MAX = 32


def table_value(view: GpuView, key: str) -> str:
    """Values as the table shows them: ``N/A`` where the CSV has ``[N/A]``/``[Not Supported]``."""
    raw = gpu_field_value(view, key)
    return "N/A" if raw.startswith("[") else raw


def truncate_right(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def truncate_left(text: str, width: int) -> str:
    return text if len(text) <= width else "..." + text[-(width - 3) :]


def number_with_unit(raw: str, unit: str) -> tuple[str, str]:
    """A figure and its unit letter(s); ``N/A`` keeps the unit's place blank."""
    return (raw, " " * len(unit)) if raw == "N/A" else (str(round(float(raw))), unit)


def gpu_row(view: GpuView) -> list[str]:
    persistence = "On" if table_value(view, "persistence_mode") == "Enabled" else "Off"
    cell1 = f"{view.gpu.index:>4}  {truncate_right(table_value(view, 'name'), NAME_CELL_MAX):<31}{persistence:<3} "
    display = "On" if table_value(view, "display_active") == "Enabled" else "Off"
    cell2 = f"{table_value(view, 'pci.bus_id'):>19} {display:>3} "
    cell3 = f"{table_value(view, 'ecc.errors.uncorrected.volatile.total'):>21} "

    fan = table_value(view, "fan.speed")
    fan = fan if fan == "N/A" else f"{fan}%"
    temperature = table_value(view, "temperature.gpu")
    temperature = temperature if temperature == "N/A" else f"{temperature}C"
    draw, draw_unit = number_with_unit(table_value(view, "power.draw"), "W")
    cap, cap_unit = number_with_unit(table_value(view, "power.limit"), "W")
    cell4 = f"{fan:>4}{temperature:>6}{table_value(view, 'pstate'):>6}{draw:>15}{draw_unit} / {cap:>4}{cap_unit} "
    used, used_unit = number_with_unit(table_value(view, "memory.used"), "MiB")
    total, total_unit = number_with_unit(table_value(view, "memory.total"), "MiB")
    cell5 = f"{used:>8}{used_unit} / {total:>6}{total_unit} "
    utilization = table_value(view, "utilization.gpu")
    utilization = utilization if utilization == "N/A" else f"{utilization}%"
    cell6 = f"{utilization:>8}{table_value(view, 'compute_mode'):>13} "
    cell9 = f"{table_value(view, 'mig.mode.current'):>21} "
    return [
        f"|{cell1}|{cell2}|{cell3}|",
        f"|{cell4}|{cell5}|{cell6}|",
        f"|{' ' * 41}|{' ' * 24}|{cell9}|",
        GPU_RULE,
    ]


def process_line(row: AppRow) -> str:
    gi_ci = "0" if row.view.mig else "N/A"
    memory = "  N/A     " if row.view.mig else f"{row.holder.gpus[row.view.gpu.index]}MiB"
    name = truncate_left(row.holder.name, PROCESS_NAME_MAX)
    return (
        f"|{row.view.gpu.index:>5}{gi_ci:>6}{gi_ci:>5}{row.holder.pid:>16}{'C':>7}   "
        f"{name:<{PROCESS_NAME_MAX}}    {memory:>10} |"
    )


def render_plain(inventory: Inventory, views: list[GpuView], now: float | None = None) -> str:
    # asctime layout (day of month space-padded), as the real tool's first line.
    lines = [time.asctime(time.localtime(now)) + " " * 7, RULE]
    lines.append(
        "| "
        + f"NVIDIA-SMI {inventory.driver_version}".ljust(34)
        + f"Driver Version: {inventory.driver_version}".ljust(31)
        + f"CUDA Version: {inventory.cuda_version}".ljust(23)
        + "|"
    )
    lines += [GPU_RULE, *GPU_TABLE_HEADER, GPU_DOUBLE_RULE]
    for view in views:
        lines += gpu_row(view)
    lines += ["", RULE, *PROCESS_TABLE_HEADER]
    rows = app_rows(views)
    if rows:
        lines += [process_line(row) for row in rows]
    else:
        lines.append("|" + "  No running processes found".ljust(89) + "|")
    lines.append(RULE)
    return "".join(line + "\n" for line in lines)


# --- main --------------------------------------------------------------------


def load_inventory_or_fail() -> Inventory:
    try:
        return fake_gpu.load_inventory()
    except FakeGpuError as exc:
        raise SmiExit(f"nvidia-smi (Pivot lab test double): {exc}", EXIT_LAB_MISCONFIGURED, True) from exc


def run(argv: list[str]) -> str:
    request = parse_args(argv)
    if request.help:
        return USAGE
    if request.query_gpu is not None and request.query_apps is not None:
        raise SmiExit("Only one --query-* option can be used at a time. Please run 'nvidia-smi -h'.", 2)
    if request.query_gpu is not None:
        keys = canonical_fields(request.query_gpu, GPU_FIELDS, GPU_FIELD_ALIASES)
        fmt = parse_format(request.format_tokens)
    elif request.query_apps is not None:
        keys = canonical_fields(request.query_apps, APP_FIELDS, APP_FIELD_ALIASES)
        fmt = parse_format(request.format_tokens)
    inventory = load_inventory_or_fail()
    if inventory.mode == "driver-failure":
        raise SmiExit(DRIVER_FAILURE, EXIT_DRIVER_FAILURE)
    if inventory.mode == "no-devices":
        raise SmiExit(NO_DEVICES, EXIT_NO_DEVICES)
    views = gpu_views(inventory, select_gpus(inventory, request.ids))
    if request.query_gpu is not None:
        return render_query_gpu(views, keys, fmt)
    if request.query_apps is not None:
        return render_query_apps(views, keys, fmt)
    if request.list_gpus:
        return render_list(views)
    return render_plain(inventory, views)


def main(argv: list[str] | None = None) -> int:
    try:
        sys.stdout.write(run(sys.argv[1:] if argv is None else argv))
    except SmiExit as stop:
        print(stop.text, file=sys.stderr if stop.to_stderr else sys.stdout)
        return stop.status
    return 0
