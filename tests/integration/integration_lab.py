"""Controller-side helpers of the integration tests: training jobs in ct200 and playbook runs with JSON results."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import labctl

HERE = Path(__file__).resolve().parent
PLAYBOOKS = HERE / "playbooks"

LAUNCH = "/opt/trainsim/launch"
RUN_SH = "/opt/trainsim/run.sh"
JOBS_ROOT = "/srv/train/it"
JOBCTL = "/usr/local/lib/pivot-it/jobctl.py"
MARKER_VARIABLE = "PIVOT_IT_JOB"

# Short steps keep every test quick; no periodic checkpoints, so every checkpoint on disk answers a request.
FAST_TRAINER = ("--step-seconds", "0.1", "--checkpoint-seconds", "0.2", "--save-every", "0")


def install_jobctl() -> None:
    """Puts jobctl.py into ct200 (through pct, like everything else that reaches ct200)."""
    source = (HERE / "jobctl.py").read_text()
    result = labctl.pct_exec(["sh", "-c", f"mkdir -p {Path(JOBCTL).parent} && cat > {JOBCTL}"], stdin=source)
    assert result.rc == 0, result.stderr


def jobctl(*args: str, timeout: float = 60) -> labctl.Result:
    return labctl.pct_exec(["python3", JOBCTL, *args], timeout=timeout)


@dataclass(frozen=True)
class TrainJob:
    """A training job started in ct200 with /opt/trainsim/launch (setsid nohup run.sh ...), as an operator does."""

    name: str
    pid: int  # run.sh, as written to the pidfile

    @property
    def root(self) -> str:
        return f"{JOBS_ROOT}/{self.name}"

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.root}/checkpoints"

    @property
    def log_file(self) -> str:
        return f"{self.root}/logs/train.log"

    @property
    def pidfile(self) -> str:
        return f"{self.root}/run.pid"

    @property
    def trigger_file(self) -> str:
        return f"{self.checkpoint_dir}/SAVE_NOW"

    def processes(self) -> list[dict]:
        """The job's live processes in ct200, wherever they were re-parented."""
        result = jobctl("ps", self.name)
        assert result.rc == 0, result.stderr
        return json.loads(result.stdout)

    def pids(self) -> set[int]:
        return {info["pid"] for info in self.processes()}

    def log(self) -> str:
        result = labctl.pct_exec(["cat", self.log_file])
        assert result.rc == 0, result.stderr
        return result.stdout

    def checkpoints(self) -> list[dict]:
        result = jobctl("checkpoints", self.checkpoint_dir)
        assert result.rc == 0, result.stderr
        return json.loads(result.stdout)

    def wait_for_step(self, step: int, timeout: float = 15) -> int:
        result = jobctl("wait-step", self.log_file, str(step), str(timeout), timeout=timeout + 30)
        assert result.rc == 0, result.stderr
        return int(result.stdout)

    def wait_for_log_text(self, text: str, timeout: float = 15) -> None:
        result = jobctl("wait-text", self.log_file, text, str(timeout), timeout=timeout + 30)
        assert result.rc == 0, result.stderr

    def kill(self) -> list[int]:
        """SIGKILL whatever is left of the job; returns the PIDs that had to be killed."""
        result = jobctl("kill", self.name, "10")
        assert result.rc == 0, result.stderr
        return json.loads(result.stdout)

    def remove_files(self) -> None:
        labctl.pct_exec(["rm", "-rf", self.root])


def start_job(name: str, *trainer_flags: str, nproc_per_node: int = 0) -> TrainJob:
    """Starts run.sh detached in ct200 (through pct), as /opt/trainsim/launch does it for an operator."""
    root = f"{JOBS_ROOT}/{name}"
    run_sh_args = [f"--nproc-per-node={nproc_per_node}"] if nproc_per_node else []
    run_sh_args += ["--checkpoint-dir", f"{root}/checkpoints", "--log-file", f"{root}/logs/train.log"]
    command = [
        # The checkpoint directory exists before the job starts, as on the real host (the trigger file goes there).
        "sh", "-c", 'mkdir -p "$1" && shift && exec "$@"', "sh", f"{root}/checkpoints",
        "env", f"{MARKER_VARIABLE}={name}",
        LAUNCH, "--pidfile", f"{root}/run.pid", "--stdout", f"{root}/logs/nohup.out",
        *run_sh_args, *FAST_TRAINER, *trainer_flags,
    ]
    result = labctl.pct_exec(command)
    assert result.rc == 0, f"launch failed: {result.stdout}{result.stderr}"
    return TrainJob(name=name, pid=int(result.stdout.strip()))


@dataclass
class PlaybookRun:
    rc: int
    stdout: str
    stderr: str
    report: dict

    def result(self, task: str, host: str) -> dict:
        """The registered result of ``task`` on ``host``, as the ansible.posix.json callback reports it."""
        for play in self.report.get("plays", []):
            for entry in play["tasks"]:
                if entry["task"]["name"] == task and host in entry["hosts"]:
                    return entry["hosts"][host]
        raise AssertionError(f"task {task!r} did not run on {host}: rc={self.rc}\n{self.stdout[-3000:]}\n{self.stderr}")

    def ran(self, task: str, host: str) -> bool:
        try:
            result = self.result(task, host)
        except AssertionError:
            return False
        return not result.get("skipped")


def run_playbook(
    playbook: str, extra_vars: dict, *, check: bool = False, diff: bool = False, timeout: float = 180
) -> PlaybookRun:
    """Runs a playbook of tests/integration/playbooks/ against the lab inventory; returns its JSON report."""
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="pivot-it-vars-") as handle:
        json.dump(extra_vars, handle)
        handle.flush()
        cmd = ["ansible-playbook", str(PLAYBOOKS / playbook), "-e", f"@{handle.name}"]
        cmd += ["--check"] * check + ["--diff"] * diff
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    try:
        report = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"{cmd} printed no JSON report ({exc}):\n{proc.stdout}\n{proc.stderr}") from exc
    return PlaybookRun(rc=proc.returncode, stdout=proc.stdout, stderr=proc.stderr, report=report)


def signals_by_pid(stop_result: dict) -> dict[int, list[str]]:
    """Every signal stop_training sent, per PID, to the process and to the process group it leads."""
    return {entry["pid"]: entry["signals"] + entry["group_signals"] for entry in stop_result["signals"]}
