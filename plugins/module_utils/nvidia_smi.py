# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one place that finds and runs ``nvidia-smi``: its CSV queries (GPUs, compute processes, compute
capabilities) parsed, its failures worded once, and whether GPUs are released."""

from __future__ import annotations

import csv
import os
import re
from typing import Callable

from ansible_collections.pivot.ops.plugins.module_utils.procfs import ProcFS

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "memory.free", "utilization.gpu")
APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")
CSV_FORMAT = "--format=csv,noheader,nounits"
# Where the driver's packages put nvidia-smi when it is not on the PATH a module runs with.
SEARCH_DIRS = ["/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/opt/nvidia/bin"]
CAPABILITY = re.compile(r"^\d+\.\d+$")

# Bracketed values nvidia-smi prints instead of a number when a field has no value on this device or driver.
UNAVAILABLE_PREFIXES = ("[N/A", "N/A", "[Not Supported", "[Unknown Error", "[Insufficient Permissions", "[GPU is lost")

DRIVER_FAILURE_TEXT = "couldn't communicate with the NVIDIA driver"
NO_DEVICES_TEXT = "No devices were found"
RC_NO_DEVICES = 6
RC_DRIVER_FAILURE = 9


class SmiError(Exception):
    """nvidia-smi failed or printed something unexpected; carries what the module should report."""

    def __init__(
        self, message: str, rc: int | None = None, stdout: str = "", stderr: str = "", cmd: list | None = None
    ) -> None:
        super().__init__(message)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.cmd = cmd or []

    def details(self) -> dict:
        return {"rc": self.rc, "stdout": self.stdout, "stderr": self.stderr, "cmd": self.cmd}


def is_unavailable(value: str) -> bool:
    return value.strip().startswith(UNAVAILABLE_PREFIXES)


def parse_int(value: str) -> int | None:
    """An integer field, tolerating a unit suffix (``19601 MiB``, ``2 %``); None for [N/A]-style values."""
    text = value.strip()
    if not text or is_unavailable(text):
        return None
    number = text.split()[0]
    try:
        return int(number)
    except ValueError:
        return int(float(number))


def parse_text(value: str) -> str | None:
    text = value.strip()
    if not text or is_unavailable(text):
        return None
    return text


def parse_rows(stdout: str, fields: tuple, cmd: list) -> list:
    """CSV rows as dicts keyed by field name; a row with the wrong number of columns is an error, not a guess."""
    rows = []
    for row in csv.reader((line for line in stdout.splitlines() if line.strip()), skipinitialspace=True):
        if len(row) != len(fields):
            raise SmiError(
                "nvidia-smi printed a line with %d fields where %d (%s) were expected: %r. Is this an nvidia-smi "
                "build that supports these query fields?" % (len(row), len(fields), ",".join(fields), ", ".join(row)),
                rc=0,
                stdout=stdout,
                cmd=cmd,
            )
        rows.append({name: row[position] for position, name in enumerate(fields)})
    return rows


def parse_gpus(stdout: str, cmd: list | None = None) -> list:
    gpus = []
    for row in parse_rows(stdout, GPU_FIELDS, cmd or []):
        gpus.append(
            {
                "index": parse_int(row["index"]),
                "uuid": parse_text(row["uuid"]),
                "name": parse_text(row["name"]),
                "memory_used_mib": parse_int(row["memory.used"]),
                "memory_total_mib": parse_int(row["memory.total"]),
                "memory_free_mib": parse_int(row["memory.free"]),
                "utilization_gpu_percent": parse_int(row["utilization.gpu"]),
            }
        )
    return gpus


def names_agree(smi_name: str | None, comm: str, argv: tuple) -> bool:
    """Whether the /proc process plausibly is the one nvidia-smi reports (a PID from another PID namespace, e.g. the
    host's PID seen from a container, can name an unrelated local process)."""
    if not smi_name:
        return True
    base = os.path.basename(smi_name)
    candidates = {comm}
    if argv:
        candidates.add(os.path.basename(argv[0]))
    return base in candidates or base[:15] == comm


def parse_apps(stdout: str, gpus: list, proc: ProcFS | None = None, cmd: list | None = None) -> list:
    index_by_uuid = {gpu["uuid"]: gpu["index"] for gpu in gpus if gpu["uuid"]}
    apps = []
    for row in parse_rows(stdout, APP_FIELDS, cmd or []):
        pid = parse_int(row["pid"])
        name = parse_text(row["process_name"])
        uuid = parse_text(row["gpu_uuid"])
        app = {
            "pid": pid,
            "name": name,
            "used_memory_mib": parse_int(row["used_memory"]),
            "gpu_uuid": uuid,
            "gpu_index": index_by_uuid.get(uuid),
            "cmdline": None,
            "ppid": None,
            "visible": False,
        }
        info = proc.read(pid) if proc is not None and pid else None
        if info is not None and names_agree(name, info.comm, info.argv):
            app.update(cmdline=info.command, ppid=info.ppid, visible=True)
        apps.append(app)
    return apps


def classify_failure(rc: int, stdout: str, stderr: str, cmd: list) -> SmiError:
    output = "\n".join(part for part in (stdout.strip(), stderr.strip()) if part)
    if rc == RC_DRIVER_FAILURE or DRIVER_FAILURE_TEXT in output:
        message = (
            "nvidia-smi cannot communicate with the NVIDIA driver (exit %d): %s Check that the driver is loaded "
            "(lsmod | grep nvidia), that its version matches the user-space libraries, and that the device nodes "
            "/dev/nvidia* exist in this host or container." % (rc, output)
        )
    elif rc == RC_NO_DEVICES or NO_DEVICES_TEXT in output:
        message = (
            "nvidia-smi found no GPUs (exit %d: %s). Check that the GPUs are passed through to this host or container "
            "and visible in nvidia-smi -L." % (rc, output)
        )
    else:
        message = "nvidia-smi failed (exit %d): %s" % (rc, output or "no output")
    return SmiError(message, rc=rc, stdout=stdout, stderr=stderr, cmd=cmd)


def find_nvidia_smi(module, given: str | None, option: str) -> str:
    """The nvidia-smi to run: ``given`` (the module's option ``option``) when it is a path, which must be an
    executable file; otherwise the program of that name (default ``nvidia-smi``) on the PATH or in SEARCH_DIRS."""
    if given and os.sep in given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise SmiError("%s %s does not exist or is not executable; point it at the nvidia-smi binary."
                           % (option, given))
        return given
    found = module.get_bin_path(given or "nvidia-smi", required=False, opt_dirs=SEARCH_DIRS)
    if not found:
        raise SmiError("%s was not found on the PATH or in %s. Install the NVIDIA driver utilities on this host, or "
                       "set %s (in Pivot's inventory: pivot_nvidia_smi_path)." % (given or "nvidia-smi",
                                                                                  ", ".join(SEARCH_DIRS), option))
    return found


class SmiQuery:
    """Runs the queries through ``run(args) -> (rc, stdout, stderr)`` (``AnsibleModule.run_command`` in the
    module, a fake in tests)."""

    def __init__(self, binary: str, run: Callable[[list], tuple], proc: ProcFS | None = None) -> None:
        self.binary = binary
        self.run = run
        self.proc = proc

    @classmethod
    def for_module(cls, module, given: str | None, option: str, proc: ProcFS | None = None) -> SmiQuery:
        """The query a module runs: nvidia-smi found with :func:`find_nvidia_smi`, run with ``module.run_command``."""
        binary = find_nvidia_smi(module, given, option)

        def run(cmd: list) -> tuple:
            try:
                return module.run_command(cmd)
            except OSError as exc:
                raise SmiError("Cannot run %s: %s. Check %s." % (cmd[0], exc, option), cmd=cmd) from exc

        return cls(binary, run, proc)

    def _run(self, query: str) -> str:
        cmd = [self.binary, query, CSV_FORMAT]
        rc, stdout, stderr = self.run(cmd)
        if rc != 0:
            raise classify_failure(rc, stdout, stderr, cmd)
        if DRIVER_FAILURE_TEXT in stdout:
            raise classify_failure(RC_DRIVER_FAILURE, stdout, stderr, cmd)
        return stdout

    def gpus(self) -> list:
        query = "--query-gpu=" + ",".join(GPU_FIELDS)
        try:
            stdout = self._run(query)
        except SmiError as exc:
            if exc.rc == RC_NO_DEVICES:
                return []
            raise
        if NO_DEVICES_TEXT in stdout:
            return []
        return parse_gpus(stdout, [self.binary, query, CSV_FORMAT])

    def apps(self, gpus: list) -> list:
        query = "--query-compute-apps=" + ",".join(APP_FIELDS)
        stdout = self._run(query)
        if NO_DEVICES_TEXT in stdout:
            return []
        return parse_apps(stdout, gpus, self.proc, [self.binary, query, CSV_FORMAT])

    def compute_capabilities(self) -> list:
        """The GPUs' distinct compute capabilities as nvidia-smi prints them (``9.0``, ``12.0``), sorted; an error
        when it names none."""
        query = "--query-gpu=compute_cap"
        stdout = self._run(query)
        found = sorted({line.strip() for line in stdout.splitlines() if CAPABILITY.match(line.strip())})
        if found:
            return found
        cmd = [self.binary, query, CSV_FORMAT]
        if NO_DEVICES_TEXT in stdout:
            raise classify_failure(0, stdout, "", cmd)
        raise SmiError(
            "nvidia-smi reported no compute capability (%s). Check 'nvidia-smi --query-gpu=name,compute_cap "
            "--format=csv' on this host; a driver too old to report it needs an update."
            % (stdout.strip()[:200] or "no output"),
            rc=0,
            stdout=stdout,
            cmd=cmd,
        )


def select_gpus(gpus: list, wanted: list | None) -> list:
    """The GPUs to check: all when ``wanted`` is empty; unknown indexes are an error naming what exists."""
    if not wanted:
        return list(gpus)
    present = {gpu["index"]: gpu for gpu in gpus}
    missing = [index for index in wanted if index not in present]
    if missing:
        raise SmiError(
            "GPU index %s not found; nvidia-smi lists %s. Fix the gpus option for this host."
            % (", ".join(str(index) for index in missing), ", ".join(str(index) for index in sorted(present)) or "none")
        )
    return [present[index] for index in wanted]


def app_allowed(app: dict, allowed_pids: list, allowed_names: list) -> bool:
    if app["pid"] in allowed_pids:
        return True
    name = app["name"] or ""
    return name in allowed_names or os.path.basename(name) in allowed_names


def describe_app(app: dict, service_of: Callable[[int], str | None] | None = None) -> str:
    """One process holding GPU memory, with a hint how to stop it. ``service_of(pid)`` names the systemd service whose
    main process ``pid`` is (None otherwise): such a process has parent PID 1 too, but it is no orphan."""
    memory = "%d MiB" % app["used_memory_mib"] if app["used_memory_mib"] is not None else "memory not reported"
    if app["visible"]:
        text = "PID %d %r (%s)" % (app["pid"], app["cmdline"], memory)
        if app["ppid"] == 1:
            service = service_of(app["pid"]) if service_of is not None else None
            if service:
                text += ", main process of systemd unit %s: stop it with 'systemctl stop %s'" % (service, service)
            else:
                text += ", parent is PID 1: probably an orphan of a stopped job; stop it with 'kill %d'" % app["pid"]
        return text
    return "PID %s %s (%s), not visible in this PID namespace" % (app["pid"], app["name"], memory)


def release_problems(
    selected: list,
    apps: list,
    max_used_mib: int,
    allowed_pids: list,
    allowed_names: list,
    *,
    service_of: Callable[[int], str | None] | None = None,
) -> list:
    """Why the selected GPUs are not released yet: one sentence per GPU, empty when they are."""
    problems = []
    for gpu in selected:
        holders = [
            app for app in apps if app["gpu_uuid"] == gpu["uuid"] and not app_allowed(app, allowed_pids, allowed_names)
        ]
        over_limit = gpu["memory_used_mib"] is not None and gpu["memory_used_mib"] > max_used_mib
        if not holders and not over_limit:
            continue
        text = "GPU %s (%s)" % (gpu["index"], gpu["name"])
        if over_limit:
            text += " uses %d MiB (limit %d MiB)" % (gpu["memory_used_mib"], max_used_mib)
        if holders:
            text += "; compute processes: " + "; ".join(describe_app(app, service_of) for app in holders)
        else:
            text += (
                "; nvidia-smi lists no compute process, so the holder may live in another PID namespace (a container):"
                " look for it with 'fuser -v /dev/nvidia*' on the host"
            )
        problems.append(text)
    strays = [app for app in apps if app["gpu_index"] is None and not app_allowed(app, allowed_pids, allowed_names)]
    if strays:
        # Under MIG or with an unexpected UUID the process cannot be tied to a GPU index; never ignore it.
        problems.append(
            "compute processes on a device nvidia-smi does not list as a GPU (a MIG instance?): "
            + "; ".join("%s on %s" % (describe_app(app, service_of), app["gpu_uuid"]) for app in strays)
        )
    return problems
