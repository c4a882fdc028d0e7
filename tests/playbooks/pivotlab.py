"""Controller-side helpers of the playbook tests: run pivot.yml and rollback_nextn.yml on the lab like a user does
(from the repository root, `-e` values as strings), read each run's JSON report, and take snapshots of what a user
cares about on the hosts, so that a test can say "nothing else was touched"."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import labctl

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
PROBES = Path(__file__).resolve().parent / "probes"

BASELINE = "releases/nextn-baseline"
DDTREE = "releases/ddtree-d16-b64-k8"
LOCK = "/run/pivot/pivot.lock"
# What `lab/lab train` starts with --nproc-per-node 8: run.sh, the torchrun agent and 8 workers.
JOB_PROCESSES = 10
# No periodic checkpoints: every checkpoint on disk answers a request, so "no new checkpoint" means "none asked".
TRAINER_BASE_FLAGS = ("--save-every", "0")
PLAYBOOK_TIMEOUT_S = 420


# --- the hosts ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Training:
    """ct200 as the training-side probe sees it."""

    processes: list[dict]
    checkpoints: dict[str, bool]
    signal_lines: list[str]
    last_step: int | None
    log_size: int
    lock: dict | None

    @property
    def pids(self) -> set[int]:
        return {p["pid"] for p in self.processes}


@dataclass(frozen=True)
class Serving:
    """pro6000 as the serving-side probe sees it."""

    current: str | None
    files: dict[str, list]
    unit: dict[str, str]
    server: dict | None
    lock: dict | None

    @property
    def algorithm(self) -> str | None:
        return (self.server or {}).get("speculative_algorithm")

    @property
    def active(self) -> bool:
        return self.unit.get("ActiveState") == "active"


def _probe_training(*args: str, timeout: float = 60) -> labctl.Result:
    source = (PROBES / "training_probe.py").read_text()
    return labctl.pct_exec(["python3", "-", *args], stdin=source, timeout=timeout)


def training_state() -> Training:
    result = _probe_training("state")
    assert result.rc == 0, f"training probe failed: {result.stderr}"
    return Training(**json.loads(result.stdout))


def serving_state() -> Serving:
    source = (PROBES / "serving_probe.py").read_text()
    result = labctl.ssh("pro6000", "python3 - state", stdin=source)
    assert result.rc == 0, f"serving probe failed: {result.stderr}"
    return Serving(**json.loads(result.stdout))


def kill_training(state: Training) -> None:
    if state.pids:
        result = _probe_training("kill", *map(str, sorted(state.pids)))
        assert result.rc == 0, result.stderr


def start_training(*flags: str, torchrun_shutdown_timeout: float | None = None) -> Training:
    """Replaces whatever job runs on ct200 by a fresh `lab/lab train` with these trainer flags; returns once it
    trains (a step logged after the start). torchrun_shutdown_timeout: how long its torchrun agent waits after passing
    on SIGTERM before it SIGKILLs the workers (torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT; 30 s when None)."""
    before = training_state()
    kill_training(before)
    env = ({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(torchrun_shutdown_timeout)}
           if torchrun_shutdown_timeout is not None else None)
    labctl.lab("train", *TRAINER_BASE_FLAGS, *flags, env=env)
    waited = _probe_training("wait-step", str(before.log_size), "30", timeout=60)
    assert waited.rc == 0, waited.stderr
    state = training_state()
    assert len(state.pids) == JOB_PROCESSES, f"the job did not start completely: {state.processes}"
    return state


def ensure_training(*flags: str) -> Training:
    """The job with these trainer flags, running with all its processes: the one already running if it fits."""
    state = training_state()
    wanted = " ".join((*TRAINER_BASE_FLAGS, *flags))
    workers = [p for p in state.processes if "/opt/trainsim/run.sh" not in p["args"]]
    fits = len(state.pids) == JOB_PROCESSES and all(p["args"].endswith(wanted) for p in workers)
    return state if fits else start_training(*flags)


def ensure_no_training() -> Training:
    """No job on ct200, as after a pivot that stopped it."""
    kill_training(training_state())
    state = training_state()
    assert not state.pids, state.processes
    return state


def ensure_baseline() -> Serving:
    """The NEXTN baseline serving (the lab's original unit, or the recorded baseline release): rolls back if not."""
    state = serving_state()
    if state.current in (None, BASELINE) and state.active and state.algorithm == "EAGLE":
        return state
    run = run_playbook("rollback_nextn.yml")
    assert run.rc == 0, run.summary()
    state = serving_state()
    assert state.current == BASELINE and state.algorithm == "EAGLE", state
    return state


def assert_training_untouched(before: Training, after: Training) -> None:
    assert after.pids == before.pids, f"the job's processes changed: {before.processes} -> {after.processes}"
    assert after.checkpoints == before.checkpoints, "a checkpoint was written or removed"
    assert after.signal_lines == before.signal_lines, f"the job got signals: {after.signal_lines[-4:]}"


RELEASE_PREPARATION_DIRS = ("/etc/sglang/releases", "/opt/pivot")
"""Where phases 2-3 prepare a release beside what serves (its venv, wheelhouse, source and rendered unit)."""


def assert_serving_untouched(before: Serving, after: Serving, *, release_prepared: bool = False) -> None:
    """Nothing on pro6000 changed: the unit, the server and every file the probe watches. With
    ``release_prepared`` the release Pivot prepared beside the baseline (:data:`RELEASE_PREPARATION_DIRS`) may
    have appeared; everything else must be as it was."""
    changed = sorted(p for p in before.files.keys() | after.files.keys() if before.files.get(p) != after.files.get(p))
    if release_prepared:
        changed = [p for p in changed
                   if not any(p == d or p.startswith(d + "/") for d in RELEASE_PREPARATION_DIRS)]
    assert not changed, f"files changed on pro6000: {changed}"
    assert after.current == before.current
    assert after.unit == before.unit, f"the unit changed: {before.unit} -> {after.unit}"
    assert after.server == before.server


def write_lock(host: str, record: dict) -> None:
    """Puts a lock record where run_lock keeps it, as a run holding the host would have written it."""
    content = json.dumps(record, indent=2) + "\n"
    command = f"install -d -m 700 {Path(LOCK).parent} && cat > {LOCK} && chmod 600 {LOCK}"
    result = (labctl.pct_exec(["sh", "-c", command], stdin=content) if host == "ct200"
              else labctl.ssh(host, command, stdin=content))
    assert result.rc == 0, result.stderr


def remove_lock(host: str) -> None:
    result = labctl.pct_exec(["rm", "-f", LOCK]) if host == "ct200" else labctl.ssh(host, f"rm -f {LOCK}")
    assert result.rc == 0, result.stderr


def controller_id() -> str:
    """How the playbooks name this controller in a lock: `hostname`:boot id."""
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{socket.gethostname()}:{boot_id}"


# --- playbook runs and their processes ------------------------------------------------------------------------


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def kill_ansible_playbook(pid: int) -> None:
    """SIGKILL to an ansible-playbook and everything it started, as when its machine dies. Its process group is not
    enough: ansible's workers call setsid(), so each leads a process group of its own (with its ssh clients and
    local modules). The playbook's group is stopped first, so that it forks no worker while the tree is read."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGSTOP)
    children, tree, todo = _children_by_parent(), [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    groups = set()
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(member))
    for group in groups - {os.getpgrp()}:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _extra_var_args(extra_vars: tuple[str, ...]) -> list[str]:
    return [arg for value in extra_vars for arg in ("-e", value)]


@dataclass
class PlaybookRun:
    """One ansible-playbook run with the ansible.posix.json callback: its exit status, results and report."""

    playbook: str
    rc: int
    result: dict
    stderr: str
    seconds: float

    @property
    def run_id(self) -> str | None:
        """The id phase 0 named the run with on localhost; None when phase 0 did not get that far."""
        for play in self.result.get("plays", []):
            for task in play["tasks"]:
                facts = task["hosts"].get("localhost", {}).get("ansible_facts", {})
                if "pivot_run_id" in facts:
                    return facts["pivot_run_id"]
        return None

    @property
    def report(self) -> dict | None:
        """This run's own JSON report (artifacts/<playbook>-<run id>.json), None when it wrote none."""
        path = ARTIFACTS / f"{Path(self.playbook).stem}-{self.run_id}.json"
        return json.loads(path.read_text()) if self.run_id and path.exists() else None

    def stats(self, host: str) -> dict:
        return self.result.get("stats", {}).get(host, {})

    def changed(self, host: str) -> int:
        return int(self.stats(host).get("changed", 0))

    def host_results(self) -> list[tuple[str, str, dict]]:
        """(task name, host, result) for every task result, in the order they ran."""
        return [(entry["task"]["name"], host, result)
                for play in self.result.get("plays", []) for entry in play["tasks"]
                for host, result in entry["hosts"].items()]

    def changed_results(self, host: str) -> list[tuple[str, dict]]:
        return [(task, result) for task, h, result in self.host_results() if h == host and result.get("changed")]

    @property
    def message(self) -> str:
        """The message of the last failure: what the play ended with, whitespace collapsed."""
        failed = [result.get("msg", "") for _host, _task, result in self.host_results() if result.get("failed")]
        return " ".join(str(failed[-1]).split()) if failed else ""

    def phase(self, name: str, host: str | None = None) -> dict:
        report = self.report
        assert report is not None, f"run {self.run_id} wrote no report\n{self.summary()}"
        found = [p for p in report["phases"] if p["phase"] == name and host in (None, p["host"])]
        assert found, f"phase {name} is not in the report: {[p['phase'] for p in report['phases']]}"
        return found[-1]

    def phase_names(self) -> list[str]:
        return [p["phase"] for p in (self.report or {}).get("phases", [])]

    def summary(self) -> str:
        return (f"{self.playbook}: rc={self.rc} in {self.seconds:.1f}s, stats={self.result.get('stats')}\n"
                f"message: {self.message}\nstderr: {self.stderr[-2000:]}")


def _ansible_env(callback: str) -> dict[str, str]:
    return {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": callback}


def run_playbook(playbook: str, *extra_vars: str, check: bool = False, diff: bool = False,
                 limit: str | None = None) -> PlaybookRun:
    """Runs playbooks/<playbook> from the repository root against the lab; extra_vars are `-e` values as a user
    types them (key=value, or JSON)."""
    cmd = ["ansible-playbook", f"playbooks/{playbook}", *_extra_var_args(extra_vars)]
    cmd += ["--check"] * check + ["--diff"] * diff + (["--limit", limit] if limit is not None else [])
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=_ansible_env("ansible.posix.json"), capture_output=True, text=True,
                          timeout=PLAYBOOK_TIMEOUT_S, check=False)
    try:
        result = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"{cmd} printed no JSON ({exc}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}") from exc
    return PlaybookRun(playbook, proc.returncode, result, proc.stderr, time.monotonic() - started)


@dataclass
class BackgroundRun:
    """An ansible-playbook run in its own process group (as a terminal's foreground job), read line by line as it
    goes; each line is kept with the time it arrived."""

    process: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    _queue: queue.Queue[tuple[float, str] | None] = field(default_factory=queue.Queue)

    @classmethod
    def start(cls, playbook: str, *extra_vars: str, callback: str = "ansible.builtin.default",
              env: dict[str, str] | None = None) -> Self:
        process = subprocess.Popen(
            ["ansible-playbook", f"playbooks/{playbook}", *_extra_var_args(extra_vars)], cwd=REPO,
            env={**_ansible_env(callback), "ANSIBLE_NOCOLOR": "1", **(env or {})}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        run = cls(process)
        threading.Thread(target=run._read, daemon=True).start()
        return run

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put((time.monotonic(), line.rstrip("\n")))
        self._queue.put(None)

    def wait_for_line(self, pattern: str, timeout: float) -> str:
        """Waits until the run prints a line matching pattern; returns it."""
        deadline = time.monotonic() + timeout
        wanted = re.compile(pattern)
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if item is None:
                raise AssertionError(f"the run ended before printing {pattern!r}:\n{self.output[-4000:]}")
            self.lines.append(item)
            if wanted.search(item[1]):
                return item[1]
        raise AssertionError(f"the run printed no {pattern!r} within {timeout}s:\n{self.output[-4000:]}")

    @property
    def output(self) -> str:
        return "\n".join(line for _at, line in self.lines)

    def kill(self) -> None:
        """SIGKILL to the run and all it started, as when the operator's machine dies."""
        if self.process.poll() is None:
            kill_ansible_playbook(self.process.pid)
        self.process.wait(timeout=30)
