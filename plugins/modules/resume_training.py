#!/usr/bin/python
# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: resume_training
short_description: Restart a training job from a checkpoint and wait until it really trains
version_added: 0.1.0
description:
  - Looks for the training job with the same selector M(pivot.ops.stop_training) uses (O(job)). When a job runs that
    this module started (per its record in O(state_dir)) from the same checkpoint, nothing is started (no change) and
    the module confirms it trains. When a job runs that it did not start, the task fails naming it and starts nothing,
    so there are never two trainers.
  - Otherwise it checks that O(checkpoint) is still there and complete (its O(checkpoint_marker); the size the stop
    recorded, O(checkpoint_size_bytes); no process writing into it; with neither a marker nor a size, the stop's
    settle rule, watched for up to twice O(checkpoint_settle_seconds)) and that no complete checkpoint with a higher
    step lies beside it (training ran after the recorded stop; O(allow_newer_checkpoints) accepts that), then that the
    O(gpus) are free (at most O(gpu_free_max_mib) used and no compute process), waiting up to O(gpu_free_timeout).
    A failed check names what is wrong (each GPU holder with PID, command and memory) and starts nothing.
  - Then it starts O(command), with C({checkpoint}), C({checkpoint_name}) and C({step}) replaced, detached from the
    connection that runs the module, so that the job outlives it. O(launcher=setsid) runs it in a new session with
    SIGHUP ignored and stdin from C(/dev/null), output appended to O(output_file), as C(setsid nohup run.sh &) does;
    O(launcher=systemd-run) runs it as the transient systemd service O(unit).
  - It records the started process (PID, start time, session, unit), the checkpoint and the log's size at the start in
    C(<state_dir>/resume.json) before it waits, so a re-run after an interruption recognises the job.
  - It then waits up to O(timeout) until the job really trains; at least O(expect_processes) processes, a step after
    the checkpoint's logged in O(log_file) since the start, and at least O(gpu_busy_min_mib) in use on every GPU of
    O(gpus). A job that exits fails the task with the end of its output. A job whose first logged step is not after
    the checkpoint's did not resume from it, so the module stops it again (SIGTERM, SIGKILL after 30 s) and fails. A
    job still starting after O(timeout) is left running and the task fails; the next run recognises it and waits
    again.
  - When the job trains (or was found training), the command lines of its selected processes (the job selector's
    roots) are compared with O(stopped_command_lines), word by word, without the words the resume command adds for
    the checkpoint (each element of O(command) holding a placeholder, with the option element right before it, as they
    read for any checkpoint in the same directory). A difference is a warning naming both, and RV(command_difference),
    not a failure (the job trains, and a change such as another batch size may be intended).
author:
  - Pivot developers (@pivot)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Makes every check (job, checkpoint, GPUs, taking one GPU reading instead of waiting; a checkpoint judged
      by the settle rule is still watched) and reports the command it would start; starts nothing and writes nothing.
  diff_mode:
    support: full
    details: Shows the job's command lines before and the command started after.
  platform:
    platforms: linux
    details: Reads C(/proc); needs C(nvidia-smi), and C(systemd-run) and C(systemctl) with O(launcher=systemd-run).
options:
  checkpoint:
    description:
      - Path of the checkpoint to resume from (a directory or a file), as the stop confirmed it.
    type: path
    required: true
  checkpoint_step:
    description:
      - The checkpoint's step. Taken from its name with O(checkpoint_step_regex) when not given.
    type: int
  checkpoint_size_bytes:
    description:
      - Total size the checkpoint had when the stop confirmed it; a different size now refuses the resume.
    type: int
  checkpoint_marker:
    description:
      - File inside the checkpoint directory whose presence marks it complete (the trainer writes it last).
    type: str
  checkpoint_settle_seconds:
    description:
      - When there is neither O(checkpoint_marker) nor O(checkpoint_size_bytes) (a checkpoint named for this run, of a
        trainer that writes no marker), the checkpoint counts as complete by the rule M(pivot.ops.stop_training)
        applies to a new checkpoint without a marker, once its files (total size, count, newest modification time)
        stay unchanged for this many seconds of watching, it is not empty, and none is open for writing. One that has
        not settled within twice this time is refused as still being written. Check mode watches too.
    type: float
    default: 30
  checkpoint_glob:
    description:
      - Shell pattern of checkpoint entries beside O(checkpoint), to find newer ones.
    type: str
    default: "*"
  checkpoint_step_regex:
    description:
      - Regular expression for the step in a checkpoint's name (named group C(step), else the first group).
    type: str
    default: '(\d+)(?!.*\d)'
  allow_newer_checkpoints:
    description:
      - Resume from O(checkpoint) although complete checkpoints with higher steps lie beside it.
    type: bool
    default: false
  command:
    description:
      - The job's command line, one argument per element (no shell). C({checkpoint}) is replaced by the checkpoint's
        path, C({checkpoint_name}) by its base name and C({step}) by its step, wherever they appear in an element.
    type: list
    elements: str
    required: true
  chdir:
    description:
      - Working directory of the job.
    type: path
  environment:
    description:
      - Variables added to the job's environment (with O(launcher=setsid) to the module's own).
    type: dict
    default: {}
  launcher:
    description:
      - V(setsid) starts the job in a new session, SIGHUP ignored, stdin from C(/dev/null), as C(setsid nohup) does.
      - V(systemd-run) starts it as the transient service O(unit) (C(systemd-run --collect -p Type=exec)).
    type: str
    choices: [setsid, systemd-run]
    default: setsid
  unit:
    description:
      - Name of the transient service with O(launcher=systemd-run) (C(.service) is added when missing).
    type: str
    default: pivot-training
  output_file:
    description:
      - File the job's stdout and stderr are appended to (its parent directory is created). Without it, the output of
        a V(setsid) job is discarded and that of a V(systemd-run) job goes to the journal.
    type: path
  pidfile:
    description:
      - File to write the started process's PID to (for a job selector that uses a pidfile).
    type: path
  job:
    description:
      - How to find the training job, as M(pivot.ops.stop_training) takes it.
    type: dict
    required: true
    suboptions:
      cmdline_match:
        description: Command-line elements that must each match one argv element (see M(pivot.ops.stop_training)).
        type: list
        elements: str
      pidfile:
        description: File holding the PID of the job's main process.
        type: path
      unit:
        description: Systemd unit running the job.
        type: str
      match_env:
        description: Environment variables that identify the job's processes.
        type: list
        elements: str
        default: []
      max_roots:
        description: How many separate process trees O(job.cmdline_match) may select.
        type: int
        default: 1
  stopped_command_lines:
    description:
      - How the stopped job had been started (the command lines of its selected processes, as the stop recorded
        them), to compare with the resumed job's. Nothing is compared when empty.
    type: list
    elements: str
    default: []
  log_file:
    description:
      - The trainer's log; only what it gains after the start counts.
    type: path
    required: true
  log_step_regex:
    description:
      - Regular expression for the step in a log line (named group C(step), else the first group).
    type: str
    default: '\bstep=(\d+)'
  gpus:
    description:
      - Indexes of the GPUs the job uses; all GPUs when empty.
    type: list
    elements: int
    default: []
  gpu_free_max_mib:
    description:
      - Highest memory use, in MiB, at which a GPU counts as free before the start.
    type: int
    default: 1024
  gpu_free_timeout:
    description:
      - Seconds to wait for the GPUs to be free before the start.
    type: float
    default: 30
  gpu_busy_min_mib:
    description:
      - Least memory, in MiB, every GPU of O(gpus) must have in use for the job to count as training.
    type: int
    default: 2048
  allowed_gpu_process_names:
    description:
      - Compute processes with these names do not keep a GPU from counting as free.
    type: list
    elements: str
    default: []
  nvidia_smi_path:
    description:
      - Path of nvidia-smi; searched on the PATH and the usual directories by default.
    type: path
  expect_processes:
    description:
      - Least number of processes the job selector must find for the job to count as up (for example 9 for a torchrun
        agent with 8 workers).
    type: int
    default: 1
  timeout:
    description:
      - Seconds to wait after the start until the job trains.
    type: float
    default: 600
  poll_interval:
    description:
      - Seconds between two looks at the job.
    type: float
    default: 2
  state_dir:
    description:
      - Directory on the host for the record of the job this module started (C(resume.json)), created root-only.
      - When it is the default and missing while C(/var/lib/pivot/training_resume) exists (where this module kept its
        state under its former name, C(training_resume)), that directory is moved here first; check mode reads it
        where it is.
    type: path
    default: /var/lib/pivot/resume_training
  progress_file:
    description:
      - File the module rewrites with one line of progress, for M(pivot.ops.async_watch). Removed when it ends.
    type: path
  run_id:
    description:
      - The controller's name for this run, kept in the record.
    type: str
    default: ""
notes:
  - The job is found before anything else, so a job that runs is never duplicated, whatever the checkpoint says.
  - The GPUs must be free before the start; the serving host is another host, so nothing there is waited for.
seealso:
  - module: pivot.ops.stop_training
  - module: pivot.ops.gpu_release
"""

EXAMPLES = r"""
- name: Resume from the checkpoint the stop confirmed, under run.sh, and wait until it trains
  pivot.ops.resume_training:
    checkpoint: /data/dflash/checkpoints/step_000005400
    checkpoint_size_bytes: 1048576
    checkpoint_marker: COMPLETE
    checkpoint_glob: step_*
    command: [/root/run.sh, --resume, "{checkpoint}"]
    chdir: /root
    output_file: /root/train/nohup.out
    job:
      cmdline_match: [train_dflash_pipeline.py]
    stopped_command_lines: ["python3 -u /root/train_dflash_pipeline.py"]  # warned about if the job runs otherwise
    log_file: /root/train/train.log
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    expect_processes: 9
    timeout: 1800

- name: A checkpoint named by hand, of a trainer that writes no marker (it must settle first, as in the stop)
  pivot.ops.resume_training:
    checkpoint: /data/dflash/checkpoints/step_000004000
    checkpoint_settle_seconds: 30
    allow_newer_checkpoints: true
    command: [/root/run.sh, --resume, "{checkpoint}"]
    job:
      cmdline_match: [train_dflash_pipeline.py]
    log_file: /root/train/train.log

- name: Resume as a transient systemd service, passing the step
  pivot.ops.resume_training:
    checkpoint: /data/ckpt/checkpoint-5400
    command: [/usr/bin/python3, -u, /root/train_dflash_pipeline.py, --resume-step, "{step}"]
    launcher: systemd-run
    unit: dflash-training
    job:
      cmdline_match: [/root/train_dflash_pipeline.py]
    log_file: /root/train/train.log

- name: Preview the resume
  pivot.ops.resume_training:
    checkpoint: /data/dflash/checkpoints/step_000005400
    command: [/root/run.sh, --resume, "{checkpoint}"]
    job:
      cmdline_match: [train_dflash_pipeline.py]
    log_file: /root/train/train.log
  check_mode: true
  diff: true
"""

RETURN = r"""
msg:
  description: What happened, in one sentence.
  returned: always
  type: str
  sample: "Started the training job from checkpoint /data/dflash/checkpoints/step_000005400 (step 5400): PID 4242;
    9 processes, step 5403 logged, GPUs in use 8 of 8."
launched:
  description:
    - Whether the job was started by this run; false in check mode (C(changed) says whether it would be). Not named
      C(started), which Ansible's async job status uses for itself.
  returned: always
  type: bool
  sample: true
already_running:
  description: Whether a job this module started earlier from the same checkpoint was found running.
  returned: always
  type: bool
  sample: false
checkpoint:
  description: The checkpoint resumed from.
  returned: always
  type: dict
  contains:
    path:
      description: Its path.
      type: str
    step:
      description: Its step; null when unknown.
      type: int
  sample: {path: /data/dflash/checkpoints/step_000005400, step: 5400}
command:
  description: The job's command line with the placeholders replaced.
  returned: always
  type: list
  elements: str
  sample: [/root/run.sh, --resume, /data/dflash/checkpoints/step_000005400]
launch_command:
  description: What was (or would be) run to start it, with the launcher.
  returned: always
  type: list
  elements: str
  sample: [systemd-run, --unit=pivot-training.service, --collect, --quiet, --property=Type=exec, --, /root/run.sh]
pid:
  description: PID of the process started (or found started earlier); null when none.
  returned: always
  type: int
  sample: 4242
processes:
  description: The job's processes at the end (or the ones refused), with PID, parent PID and command line.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4242, ppid: 1, cmdline: "bash /root/run.sh --resume /data/dflash/checkpoints/step_000005400"}]
first_step:
  description: The first step logged since the start; null when none.
  returned: always
  type: int
  sample: 5401
last_step:
  description: The last step logged since the start; null when none.
  returned: always
  type: int
  sample: 5403
last_log_line:
  description: The log line RV(last_step) comes from.
  returned: always
  type: str
  sample: "[2158m] step=5403 loss=--- acc=--- | tgt=0.48b/s dft=0.48b/s (19.5Ktok/s) | ETA=7.1d"
gpus:
  description: Memory in use on the GPUs of O(gpus) at the last reading, as C({index, memory_used_mib}).
  returned: always
  type: list
  elements: dict
  sample: [{index: 0, memory_used_mib: 61449}]
gpu_problems:
  description: Why the GPUs were not free (one sentence per GPU, naming each holder).
  returned: when the GPUs were not free
  type: list
  elements: str
  sample: ["GPU 0 (NVIDIA H200) uses 4105 MiB (limit 1024 MiB); compute processes: PID 77 'python3 x.py' (4096 MiB)"]
newer_checkpoints:
  description: Complete checkpoints beside O(checkpoint) with higher steps.
  returned: when there are any
  type: list
  elements: str
  sample: [/data/dflash/checkpoints/step_000006000]
command_difference:
  description:
    - How the resumed job's selected processes run, when that is not how the stopped job's had been started
      (O(stopped_command_lines)), compared without the words the resume command adds for the checkpoint; also a
      warning.
  returned: when the job trains and its command lines differ from the stopped job's
  type: dict
  contains:
    stopped:
      description: The stopped job's command lines.
      type: list
      elements: str
    resumed:
      description: The resumed job's command lines.
      type: list
      elements: str
    msg:
      description: The warning, naming both.
      type: str
  sample:
    stopped: ["python3 -u /root/train_dflash_pipeline.py --batch 8"]
    resumed: ["python3 -u /root/train_dflash_pipeline.py --batch 4 --resume /data/dflash/checkpoints/step_000005400"]
    msg: "The resumed job does not run the way the stopped one had been started: ..."
output_tail:
  description: The end of the job's output when it exited or did not resume.
  returned: when the job exited or did not resume
  type: str
  sample: "error: cannot resume from /data/dflash/checkpoints/step_000005400: it is not a complete checkpoint"
host_record:
  description: The record of the started job on the host (C(<state_dir>/resume.json)); null when nothing was started.
  returned: always
  type: str
  sample: /var/lib/pivot/resume_training/resume.json
started_at:
  description: UTC time the job was started (now, or by the earlier run that started it); null when not started.
  returned: always
  type: str
  sample: "2026-12-01T10:00:00Z"
timings:
  description: Seconds per part (V(checks), V(gpu_free), V(start), V(wait), V(total)).
  returned: always
  type: dict
  sample: {checks: 0.1, gpu_free: 0.2, start: 0.05, wait: 12.3, total: 12.7}
"""

import os
import re
import shlex
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pivot.ops.plugins.module_utils.checkpoint import parse_step
from ansible_collections.pivot.ops.plugins.module_utils.escalation import Escalator, Signaller, SignalLog
from ansible_collections.pivot.ops.plugins.module_utils.job import (
    JobError,
    JobSpec,
    JobTracker,
    protected_pids,
)
from ansible_collections.pivot.ops.plugins.module_utils.nvidia_smi import (
    SmiError,
    SmiQuery,
    release_problems,
    select_gpus,
)
from ansible_collections.pivot.ops.plugins.module_utils.procfs import ProcFS
from ansible_collections.pivot.ops.plugins.module_utils.progress import (
    ProgressFile,
    read_json,
    waited_text,
    write_json_atomically,
)
from ansible_collections.pivot.ops.plugins.module_utils.resume import (
    DIED,
    NOT_RESUMED,
    TRAINING,
    Launch,
    Observation,
    ResumeError,
    SettleWatch,
    checkpoint_problem,
    command_difference,
    describe,
    judge,
    names_checkpoint,
    newer_checkpoints,
    owned_pids,
    record_path,
    render_command,
    spawn_detached,
    steps_since,
)
from ansible_collections.pivot.ops.plugins.module_utils.state_dir import adopt_former_state_dir, former_state_dir
from ansible_collections.pivot.ops.plugins.module_utils.stop_record import utc_now
from ansible_collections.pivot.ops.plugins.module_utils.systemd_unit import (
    SystemdError,
    SystemdUnit,
    UnitStatus,
    service_name,
)

PROC_ROOT = "/proc"
WRONG_START_GRACE = 30.0  # SIGTERM -> SIGKILL for a job that did not resume from the checkpoint
WRONG_START_KILL_TIMEOUT = 10.0
OUTPUT_TAIL_BYTES = 2000


def process_entry(info) -> dict:
    return {"pid": info.pid, "ppid": info.ppid, "cmdline": info.command}


def quoted(argv: list) -> str:
    return " ".join(shlex.quote(arg) for arg in argv)


def read_tail(path: str | None, offset: int) -> str:
    """The end of what ``path`` gained after ``offset``."""
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(offset if size >= offset else 0, size - OUTPUT_TAIL_BYTES))
            return handle.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def file_size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


class TrainingResume:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.proc = ProcFS(PROC_ROOT)
        self.started = time.monotonic()
        self.timings = {}
        self.checkpoint = self.params["checkpoint"].rstrip("/") or "/"
        self.step = self.checkpoint_step()
        self.smi = None
        self.child = None  # PID of the process this run started with setsid (a child of this module)
        self.child_status = None  # its exit status once it has exited
        self.progress = ProgressFile(None if module.check_mode else self.params["progress_file"])
        self.state_dir = self.params["state_dir"]
        self.roots = []  # the selected processes (PIDs) of the job's last scan
        self.root_commands = []  # their command lines at the last look
        self.result = {
            "changed": False,
            "launched": False,
            "already_running": False,
            "checkpoint": {"path": self.checkpoint, "step": self.step},
            "command": [],
            "launch_command": [],
            "pid": None,
            "processes": [],
            "first_step": None,
            "last_step": None,
            "last_log_line": None,
            "gpus": [],
            "host_record": None,
            "started_at": None,
            "timings": self.timings,
        }

    # --- endings --------------------------------------------------------------------------------------------------

    def fail(self, msg: str, **extra) -> None:
        self.result.update(extra)
        self.timings["total"] = round(time.monotonic() - self.started, 3)
        self.progress.close()
        self.module.fail_json(msg=msg, **self.result)

    def finish(self, msg: str) -> None:
        self.compare_command()
        self.timings["total"] = round(time.monotonic() - self.started, 3)
        self.progress.close()
        self.module.exit_json(msg=msg, **self.result)

    def compare_command(self) -> None:
        """Warn when the job runs otherwise than the stopped one had been started (module_utils.resume)."""
        stopped = self.params["stopped_command_lines"]
        difference = command_difference(stopped, self.root_commands, self.params["command"], self.checkpoint,
                                        self.step)
        if difference:
            self.module.warn(difference)
            self.result["command_difference"] = {"stopped": stopped, "resumed": self.root_commands, "msg": difference}

    def lap(self, name: str, since: float) -> None:
        self.timings[name] = round(time.monotonic() - since, 3)

    # --- inputs ---------------------------------------------------------------------------------------------------

    def checkpoint_step(self) -> int | None:
        if self.params["checkpoint_step"] is not None:
            return self.params["checkpoint_step"]
        return parse_step(os.path.basename(self.params["checkpoint"].rstrip("/")), self.params["checkpoint_step_regex"])

    def rendered_command(self) -> list:
        try:
            argv = render_command(self.params["command"], self.checkpoint, self.step)
        except ResumeError as exc:
            self.fail(str(exc))
        if not names_checkpoint(self.params["command"]):
            self.module.warn(
                "The resume command does not name the checkpoint ({checkpoint}, {checkpoint_name} or {step}): the "
                "trainer must find %s by itself. Its first logged step shows whether it did." % self.checkpoint
            )
        return argv

    def launch_command(self, argv: list) -> list:
        if self.params["launcher"] == "setsid":
            return ["setsid", "nohup", *argv]
        return self.launch_unit().transient_command(argv, self.params["chdir"], self.params["environment"],
                                                    self.params["output_file"])

    def launch_unit(self) -> SystemdUnit:
        """The transient service that launcher=systemd-run starts the job as."""
        return SystemdUnit(self.module, service_name(self.params["unit"]))

    # --- the job --------------------------------------------------------------------------------------------------

    def unit_status(self) -> UnitStatus | None:
        name = (self.params["job"] or {}).get("unit")
        if not name:
            return None
        try:
            return SystemdUnit(self.module, name).status()
        except SystemdError as exc:
            self.fail(str(exc), **exc.details())
        return None  # unreachable, fail_json exits

    def scan_job(self) -> dict:
        """The job's live processes as its selector finds them now (a fresh look each time)."""
        job = self.params["job"]
        spec = JobSpec(pidfile=job["pidfile"], unit=self.unit_status(), cmdline_match=job["cmdline_match"] or [],
                       match_env=job["match_env"], max_roots=job["max_roots"])
        try:
            tracker = JobTracker(spec, self.proc, protected_pids(self.proc))
            members = tracker.scan(first=True)
            self.roots = tracker.roots()
            return members
        except JobError as exc:
            if self.result["launched"]:
                self.fail("Looking for the started training job (PID %s, left running): %s"
                          % (self.result["pid"], exc), processes=exc.candidates)
            self.fail(
                "Looking for a running training job: %s Nothing was started, so that no second trainer runs." % exc,
                processes=exc.candidates,
            )
        return {}  # unreachable, fail_json exits

    def prepare_state_dir(self) -> None:
        """Root-only (the record names the job's command line); made first, so the progress file can be written. A
        host's directory of the module's former name becomes this one (check mode reads it where it is)."""
        former = former_state_dir(self.state_dir)
        if self.module.check_mode:
            self.state_dir = former or self.state_dir
            return
        try:
            if former:
                adopt_former_state_dir(self.state_dir, former)
        except OSError as exc:
            self.fail("Cannot move %s, where an earlier Pivot kept this module's state, to %s: %s. Move it there by "
                      "hand. Nothing was started." % (former, self.state_dir, exc))
        try:
            os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            self.fail("Cannot create state_dir %s: %s. Choose a writable local directory. Nothing was started."
                      % (self.state_dir, exc))

    def host_record(self) -> dict | None:
        return read_json(record_path(self.state_dir))

    # --- a job is running -----------------------------------------------------------------------------------------

    def running(self, members: dict) -> None:
        record = self.host_record()
        launch = Launch.from_record(record)
        leader = self.proc.read(launch.pid) if launch else None
        owned = owned_pids(launch, members, leader, self.proc.cgroup)
        self.result["processes"] = [process_entry(info) for info in members.values()]
        if not owned:
            self.refuse_foreign(members, record)
        if (record.get("checkpoint") or "").rstrip("/") != self.checkpoint:
            self.fail(
                "The training job Pivot started on this host (run %s at %s, PID %s) is running from checkpoint %s, not "
                "from %s. Nothing was started. To resume from %s instead, stop the running job first (the pivot's stop "
                "checkpoints it and records the new checkpoint), then run again."
                % (record.get("run_id") or "-", record.get("started_at"), launch.pid, record.get("checkpoint"),
                   self.checkpoint, self.checkpoint)
            )
        self.result.update(already_running=True, pid=launch.pid, started_at=record.get("started_at"),
                           command=record.get("command") or [], host_record=record_path(self.state_dir))
        if self.module._diff:
            self.result["diff"] = {"before": self.process_lines(members), "after": self.process_lines(members)}
        if self.module.check_mode:
            observation = self.observe(launch, int(record.get("log_offset") or 0))
            self.finish("The training job Pivot started from %s (run %s at %s, PID %d) is running: %s. Nothing to do."
                        % (self.checkpoint, record.get("run_id") or "-", record.get("started_at"), launch.pid,
                           describe(observation, self.params["gpu_busy_min_mib"])))
        self.wait_training(launch, int(record.get("log_offset") or 0), int(record.get("output_offset") or 0),
                           "The training job Pivot started from %s (run %s at %s, PID %d) is running"
                           % (self.checkpoint, record.get("run_id") or "-", record.get("started_at"), launch.pid))

    def refuse_foreign(self, members: dict, record: dict | None) -> None:
        shown = list(members.values())[:3]
        more = len(members) - len(shown)
        earlier = ""
        if record:
            earlier = (" (Pivot's last start on this host, run %s at %s, PID %s, is not among them.)"
                       % (record.get("run_id") or "-", record.get("started_at"), record.get("pid")))
        self.fail(
            "A training job is already running on this host that Pivot did not start: %s%s.%s Refusing to start a "
            "second trainer; nothing was started. If it is the job you want, there is nothing to do. Otherwise stop "
            "it first (the pivot's stop checkpoints it and records the checkpoint), then run again."
            % ("; ".join("PID %d %r" % (info.pid, info.command) for info in shown),
               " and %d more process(es)" % more if more > 0 else "", earlier)
        )

    @staticmethod
    def process_lines(members: dict) -> str:
        return "".join("%d %s\n" % (info.pid, info.command) for info in members.values())

    # --- checks before a start ------------------------------------------------------------------------------------

    def settle_watch(self) -> SettleWatch:
        """The stop's settle rule, for a checkpoint with neither a marker nor a recorded size; its wait is shown."""
        def on_wait(detail: str) -> None:
            self.progress.update("checkpoint", "waiting for checkpoint %s to settle (no marker, no recorded size): %s"
                                 % (self.checkpoint, detail))

        return SettleWatch(settle_seconds=self.params["checkpoint_settle_seconds"],
                           poll_interval=self.params["poll_interval"], on_wait=on_wait)

    def check_checkpoint(self) -> None:
        problem = checkpoint_problem(self.checkpoint, self.params["checkpoint_marker"],
                                     self.params["checkpoint_size_bytes"], watch=self.settle_watch())
        if problem:
            self.fail("The checkpoint to resume from, %s, %s. Nothing was started. Find a complete checkpoint (the "
                      "report of the pivot that stopped the job names the one it confirmed and the one before) and "
                      "name it explicitly, or restore this one." % (self.checkpoint, problem))
        newer = newer_checkpoints(self.checkpoint, self.params["checkpoint_glob"], self.params["checkpoint_marker"],
                                  self.params["checkpoint_step_regex"], self.step)
        if newer and not self.params["allow_newer_checkpoints"]:
            self.fail(
                "Complete checkpoint(s) with a higher step than %s (step %d) lie beside it: %s. Training ran after "
                "the stop that recorded it, so resuming from it would throw that work away. Nothing was started. "
                "Resume from the newest one by naming it explicitly, or accept the older one with "
                "allow_newer_checkpoints." % (self.checkpoint, self.step, ", ".join(path for path, _step in newer)),
                newer_checkpoints=[path for path, _step in newer],
            )

    def nvidia_smi(self) -> SmiQuery:
        if self.smi is None:
            try:
                self.smi = SmiQuery.for_module(self.module, self.params["nvidia_smi_path"], "nvidia_smi_path",
                                               self.proc)
            except SmiError as exc:
                self.fail("%s Nothing was started." % exc)
        return self.smi

    def read_gpus(self) -> tuple:
        """(the selected GPUs, every compute process) now."""
        try:
            gpus = self.nvidia_smi().gpus()
            selected = select_gpus(gpus, self.params["gpus"])
            apps = self.nvidia_smi().apps(gpus) if gpus else []
        except SmiError as exc:
            self.fail("Reading the GPUs: %s" % exc)
        if not selected:
            self.fail("nvidia-smi lists no GPU on this host, so the training job cannot run here. Nothing was started.")
        self.result["gpus"] = [{"index": gpu["index"], "memory_used_mib": gpu["memory_used_mib"]} for gpu in selected]
        return selected, apps

    def check_gpus_free(self) -> None:
        started = time.monotonic()
        limit = 0.0 if self.module.check_mode else self.params["gpu_free_timeout"]
        while True:
            selected, apps = self.read_gpus()
            problems = release_problems(selected, apps, self.params["gpu_free_max_mib"], [],
                                        self.params["allowed_gpu_process_names"])
            waited = time.monotonic() - started
            if not problems:
                self.lap("gpu_free", started)
                return
            if waited >= limit:
                self.fail(
                    "The training GPUs are not free, so the job was not started: %s. Stop what holds them (for an "
                    "orphan: 'kill <pid>'; on the serving side the rollback frees its own host, not this one), then "
                    "run again." % " | ".join(problems),
                    gpu_problems=problems,
                )
            self.progress.update("gpus", "waiting for the training GPUs to be free: %s; %s"
                                 % (waited_text(waited, limit), problems[0]))
            time.sleep(min(self.params["poll_interval"], max(0.0, limit - waited)))

    # --- the start ------------------------------------------------------------------------------------------------

    def start_setsid(self, argv: list) -> int:
        environment = dict(os.environ)
        environment.update({name: str(value) for name, value in self.params["environment"].items()})
        output = self.params["output_file"]
        if output:
            try:
                os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
            except OSError as exc:
                self.fail("Cannot create the directory of output_file %s: %s. Nothing was started." % (output, exc))
        try:
            self.child = spawn_detached(argv, self.params["chdir"], environment, output)
        except OSError as exc:
            self.fail("Cannot start %s: %s. Nothing was started; check the resume command and its working directory."
                      % (quoted(argv), exc))
        return self.child

    def start_systemd_run(self, command: list) -> int:
        try:
            return self.launch_unit().start_transient(command)
        except SystemdError as exc:
            self.fail("%s %s" % (exc, "Nothing was started." if exc.missing
                                 else "Nothing is running; check the resume command."), **exc.details())
        return 0  # unreachable, fail_json exits

    def start(self, argv: list, command: list) -> Launch:
        if self.params["chdir"] and not os.path.isdir(self.params["chdir"]):
            self.fail("chdir %s is not a directory. Nothing was started." % self.params["chdir"])
        started = time.monotonic()
        self.progress.update("start", "starting the training job: %s" % quoted(argv))
        pid = self.start_setsid(argv) if self.params["launcher"] == "setsid" else self.start_systemd_run(command)
        self.result.update(changed=True, launched=True, pid=pid or None, started_at=utc_now())
        self.lap("start", started)
        info = self.proc.read(pid) if pid else None
        unit = service_name(self.params["unit"]) if self.params["launcher"] == "systemd-run" else ""
        return Launch(pid, info.start_time if info else 0, info.sid if info else pid, unit)

    def write_records(self, launch: Launch, argv: list, log_offset: int, output_offset: int) -> None:
        path = record_path(self.state_dir)
        record = {"run_id": self.params["run_id"], "started_at": self.result["started_at"], "pid": launch.pid,
                  "start_time": launch.start_time, "sid": launch.sid, "unit": launch.unit,
                  "launcher": self.params["launcher"], "command": argv, "checkpoint": self.checkpoint,
                  "step": self.step, "log_file": self.params["log_file"], "log_offset": log_offset,
                  "output_file": self.params["output_file"] or "", "output_offset": output_offset}
        try:
            write_json_atomically(path, record)
            os.chmod(path, 0o600)
        except OSError as exc:
            self.module.warn("Could not write %s (%s): a second run will not recognise this job as Pivot's."
                             % (path, exc))
        else:
            self.result["host_record"] = path
        if self.params["pidfile"]:
            try:
                os.makedirs(os.path.dirname(self.params["pidfile"]) or ".", exist_ok=True)
                with open(self.params["pidfile"], "w") as handle:
                    handle.write("%d\n" % launch.pid)
            except OSError as exc:
                self.module.warn("Could not write pidfile %s: %s" % (self.params["pidfile"], exc))

    # --- waiting until it trains ----------------------------------------------------------------------------------

    def reap_child(self) -> bool:
        """Whether the process this run started still runs; collects its exit status when it has ended."""
        if self.child_status is None:
            try:
                pid, status = os.waitpid(self.child, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            self.child_status = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        return False

    def launched_alive(self, launch: Launch) -> bool:
        if self.child is not None:
            return self.reap_child()
        info = self.proc.read(launch.pid)
        return info is not None and info.start_time == launch.start_time and not info.is_zombie

    def observe(self, launch: Launch, log_offset: int) -> Observation:
        members = self.scan_job()
        steps = steps_since(self.params["log_file"], log_offset, self.params["log_step_regex"])
        selected, _apps = self.read_gpus()
        self.result.update(processes=[process_entry(info) for info in members.values()], first_step=steps.first,
                           last_step=steps.last, last_log_line=steps.last_line)
        self.root_commands = [members[pid].command for pid in self.roots if pid in members]
        return Observation(len(members), self.launched_alive(launch), steps, selected)

    def wait_training(self, launch: Launch, log_offset: int, output_offset: int, what: str) -> None:
        started = time.monotonic()
        timeout = self.params["timeout"]
        while True:
            verdict = judge(self.observe(launch, log_offset), self.step, self.params["expect_processes"],
                            self.params["gpu_busy_min_mib"])
            waited = time.monotonic() - started
            if verdict.state == TRAINING:
                self.lap("wait", started)
                self.finish("%s: %s." % (what, verdict.detail))
            if verdict.state == DIED:
                self.died(launch, output_offset, verdict.detail)
            if verdict.state == NOT_RESUMED:
                self.stop_wrong_start(launch, output_offset, verdict.detail)
            if waited >= timeout:
                self.lap("wait", started)
                self.fail(
                    "%s, but it is not training after %s: %s. It was left running: run again to keep waiting (the next "
                    "run recognises it), or read its log (%s) and stop it if it is stuck."
                    % (what, waited_text(waited, None), verdict.detail, self.params["log_file"])
                )
            self.progress.update("wait", "waiting for the training job to train: %s; %s"
                                 % (waited_text(waited, timeout), verdict.detail))
            time.sleep(min(self.params["poll_interval"], max(0.0, timeout - waited)))

    def output_tail(self, launch: Launch, output_offset: int) -> str:
        if self.params["output_file"]:
            return read_tail(self.params["output_file"], output_offset)
        if not launch.unit:
            return ""
        return "\n".join(SystemdUnit(self.module, launch.unit).journal_tail(20)).strip()

    def exit_status(self) -> str:
        if self.child is None or self.child_status is None:
            return ""
        return " with status %d" % self.child_status

    def died(self, launch: Launch, output_offset: int, detail: str) -> None:
        tail = self.output_tail(launch, output_offset)
        self.fail(
            "The training job started from %s exited%s before it trained: %s. Its output ends: %s. Fix the cause "
            "(the resume command in the inventory, the checkpoint), then run again."
            % (self.checkpoint, self.exit_status(), detail, tail[-600:] or "(no output)"),
            output_tail=tail,
        )

    def stop_wrong_start(self, launch: Launch, output_offset: int, detail: str) -> None:
        """It trains from the wrong place: stop what this module started, the way the pivot's stop does."""
        if launch.unit:
            try:
                SystemdUnit(self.module, launch.unit).stop()
            except SystemdError as exc:
                self.module.warn("%s Stopping its processes by signal instead." % exc)
        escalator = Escalator(lambda: self.launched_members(launch), Signaller(self.proc, SignalLog()),
                              poll_interval=0.2)
        outcome = escalator.run(self.launched_members(launch), WRONG_START_GRACE, WRONG_START_KILL_TIMEOUT)
        if self.child is not None:
            self.reap_child()
        left = ("; %d process(es) survived SIGKILL: %s" % (len(outcome.remaining), ", ".join(
            str(info.pid) for info in outcome.remaining))) if outcome.remaining else ""
        tail = self.output_tail(launch, output_offset)
        self.fail(
            "The training job started from %s with %s: %s. Pivot stopped it again%s. Make the resume command pass the "
            "checkpoint the way train_dflash_pipeline.py takes it (pivot_training_resume.command), then run again."
            % (self.checkpoint, quoted(self.result["command"] or []), detail, left),
            output_tail=tail,
        )

    def launched_members(self, launch: Launch) -> dict:
        """What this module started: the job as its selector finds it, and what is still in the started session."""
        members = dict(self.scan_job())
        protected = protected_pids(self.proc)
        for pid, info in self.proc.table().items():
            if info.sid == launch.sid and pid not in protected and not info.is_zombie:
                members.setdefault(pid, info)
        return members

    # --- main -----------------------------------------------------------------------------------------------------

    def run(self) -> None:
        started = time.monotonic()
        for regex in (self.params["checkpoint_step_regex"], self.params["log_step_regex"]):
            try:
                re.compile(regex)
            except re.error as exc:
                self.fail("%r is not a valid regular expression: %s" % (regex, exc))
        argv = self.rendered_command()
        self.prepare_state_dir()
        members = self.scan_job()
        if members:
            self.running(members)  # ends the module: confirms the job Pivot started, or refuses another
            return
        self.check_checkpoint()
        self.lap("checks", started)
        self.check_gpus_free()
        command = self.launch_command(argv)
        self.result.update(command=argv, launch_command=command)
        if self.module._diff:
            self.result["diff"] = {"before": "no training job is running\n", "after": quoted(command) + "\n"}
        if self.module.check_mode:
            self.result["changed"] = True
            self.finish("Would start the training job from checkpoint %s (step %s): %s."
                        % (self.checkpoint, "-" if self.step is None else self.step, quoted(command)))
        log_offset = file_size(self.params["log_file"])
        output_offset = file_size(self.params["output_file"])
        launch = self.start(argv, command)
        self.write_records(launch, argv, log_offset, output_offset)
        self.wait_training(launch, log_offset, output_offset, "Started the training job from checkpoint %s (step %s): "
                           "PID %d" % (self.checkpoint, "-" if self.step is None else self.step, launch.pid))


def argument_spec() -> dict:
    return dict(
        checkpoint=dict(type="path", required=True),
        checkpoint_step=dict(type="int"),
        checkpoint_size_bytes=dict(type="int"),
        checkpoint_marker=dict(type="str"),
        checkpoint_settle_seconds=dict(type="float", default=30),
        checkpoint_glob=dict(type="str", default="*"),
        checkpoint_step_regex=dict(type="str", default=r"(\d+)(?!.*\d)"),
        allow_newer_checkpoints=dict(type="bool", default=False),
        command=dict(type="list", elements="str", required=True),
        chdir=dict(type="path"),
        environment=dict(type="dict", default={}),
        launcher=dict(type="str", choices=["setsid", "systemd-run"], default="setsid"),
        unit=dict(type="str", default="pivot-training"),
        output_file=dict(type="path"),
        pidfile=dict(type="path"),
        job=dict(
            type="dict",
            required=True,
            options=dict(
                cmdline_match=dict(type="list", elements="str"),
                pidfile=dict(type="path"),
                unit=dict(type="str"),
                match_env=dict(type="list", elements="str", default=[]),
                max_roots=dict(type="int", default=1),
            ),
            required_one_of=[("pidfile", "unit", "cmdline_match")],
            mutually_exclusive=[("pidfile", "unit"), ("unit", "cmdline_match")],
        ),
        stopped_command_lines=dict(type="list", elements="str", default=[]),
        log_file=dict(type="path", required=True),
        log_step_regex=dict(type="str", default=r"\bstep=(\d+)"),
        gpus=dict(type="list", elements="int", default=[]),
        gpu_free_max_mib=dict(type="int", default=1024),
        gpu_free_timeout=dict(type="float", default=30),
        gpu_busy_min_mib=dict(type="int", default=2048),
        allowed_gpu_process_names=dict(type="list", elements="str", default=[]),
        nvidia_smi_path=dict(type="path"),
        expect_processes=dict(type="int", default=1),
        timeout=dict(type="float", default=600),
        poll_interval=dict(type="float", default=2),
        state_dir=dict(type="path", default="/var/lib/pivot/resume_training"),
        progress_file=dict(type="path"),
        run_id=dict(type="str", default=""),
    )


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    if not module.params["command"]:
        module.fail_json(msg="command is empty: give the job's command line, one argument per element.")
    for name in ("timeout", "poll_interval", "gpu_free_timeout", "checkpoint_settle_seconds"):
        if module.params[name] < 0:
            module.fail_json(msg="%s must be zero or more seconds, got %s." % (name, module.params[name]))
    if module.params["expect_processes"] < 1:
        module.fail_json(msg="expect_processes must be at least 1, got %d." % module.params["expect_processes"])
    TrainingResume(module).run()


if __name__ == "__main__":
    main()
