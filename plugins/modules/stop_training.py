#!/usr/bin/python
# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: stop_training
short_description: Stop a training job without losing its work
version_added: 0.1.0
description:
  - Finds a training job exactly (by pidfile, systemd unit or exact command-line elements) and discovers all of its
    processes, including launcher, torchrun-style agent, workers that run in their own sessions, their children, and
    processes that were re-parented to PID 1 or a subreaper.
  - Optionally requests a checkpoint (by signal or trigger file) and waits until a checkpoint newer than the request is
    complete on disk. If none lands in time the task fails and the job is left running, unless O(force=true).
  - Then sends SIGTERM to every process of the job (and to every process group a job process leads), waits
    O(grace_period), sends SIGKILL to whatever is left and confirms that nothing of the job remains.
  - When nothing of the job is running the module succeeds without a change, so a second run after a successful stop
    reports no change.
  - Process identities are checked before every signal (PID and start time), so a PID recycled by the kernel is never
    signalled. PID 1, the module's own process and its ancestors (for example the SSH session) are never signalled.
  - Zombie processes count as gone; they have exited, hold no memory and only wait for their parent to reap them.
  - "Run with C(async) and C(poll: 0) and watched by M(pivot.ops.async_watch), it survives the controller going away
    safely: with O(heartbeat_file) set, a stop whose heartbeat is older than O(heartbeat_timeout) is B(cancelled)
    while no signal that ends the job has been sent (the job keeps running, nothing is killed), and B(completed)
    once one has. With O(state_dir) set, every stop that did something leaves a record on the host for the
    controller to import (the C(stop_training) role does), including those that finished unattended, and only one
    stop runs on a host at a time."
  - Runs on the target with the Python standard library only; it works over any connection plugin (ssh,
    C(community.proxmox.proxmox_pct_remote)) and needs root for processes of other users.
author:
  - Pivot developers (@pivot)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports the processes found and the actions it would take; sends no signal and creates no file.
  diff_mode:
    support: full
    details: Shows the job's processes before and the processes left after.
  platform:
    platforms: linux
    details: Reads C(/proc); needs C(systemctl) only with O(unit).
options:
  pidfile:
    description:
      - File holding the PID of the job's main process (the first line is used).
      - A missing file, or a PID that is not running, means nothing is running.
      - Together with O(cmdline_match), the PID must also match those elements, otherwise the pidfile is treated as
        stale (its PID was recycled).
      - Mutually exclusive with O(unit).
    type: path
  unit:
    description:
      - Systemd unit running the job. Every process in the unit's control group is part of the job (cgroup v2 and the
        v1 C(name=systemd) hierarchy are both understood).
      - The stop phase runs C(systemctl stop) so that the unit's C(Restart=) setting does not start the job again,
        then signals whatever of the job is still alive outside the unit.
      - Mutually exclusive with O(pidfile) and O(cmdline_match).
    type: str
  cmdline_match:
    description:
      - Command-line elements that must each match one element of a process's argv, for example the script
        (V(train_dflash_pipeline.py) or V(/root/train_dflash_pipeline.py)) or a unique flag value.
      - An element matches when it equals the argv element or, for a bare file name (no V(/)), when the argv
        element is a path to that file (V(train.py) matches V(/root/train.py), not V(mytrain.py),
        V(/root/train.py.bak) or V(--config=/root/train.py)). There is no substring or pattern matching.
      - Matching processes that descend from another matching process belong to the same job tree; the number of
        separate trees is limited by O(max_roots).
      - With O(pidfile), only guards the pidfile against a recycled PID.
    type: list
    elements: str
  match_env:
    description:
      - Environment variables that identify the job's processes wherever they are in the process tree, read from
        C(/proc/<pid>/environ).
      - A plain V(NAME) learns the values from processes already known to belong to the job (for example
        V(TORCHELASTIC_RUN_ID), which torchrun sets in every worker); V(NAME=VALUE) matches a fixed value.
      - Choose variables whose values are unique to the job; a value shared with unrelated processes would pull them in.
        torchrun sets V(TORCHELASTIC_RUN_ID=none) unless it runs with C(--standalone) or C(--rdzv-id), so with several
        torchrun jobs on one host use a job-specific variable of your own instead.
    type: list
    elements: str
    default: []
  max_roots:
    description:
      - How many separate process trees O(cmdline_match) may select. More trees fail the task with a list of the
        candidates (PID and command line).
    type: int
    default: 1
  checkpoint:
    description:
      - Request a checkpoint and wait for it before stopping. Without this option no checkpoint is requested.
    type: dict
    suboptions:
      request:
        description:
          - V(signal) sends O(checkpoint.signal) to the processes chosen by O(checkpoint.signal_targets).
          - V(file) creates O(checkpoint.trigger_file); the trainer is expected to notice it. The module removes the
            file again at the end if it is still there.
          - V(none) requests nothing but still waits for a new checkpoint in O(checkpoint.path) when that is set (a
            trainer that saves periodically).
        type: str
        choices: [signal, file, none]
        default: signal
      signal:
        description:
          - Signal that asks the trainer for a checkpoint.
        type: str
        choices: [SIGUSR1, SIGUSR2, SIGHUP, SIGINT, SIGTERM, SIGQUIT, SIGALRM, SIGWINCH]
        default: SIGUSR1
      signal_targets:
        description:
          - V(catching) sends the signal to every job process that has installed a handler for it (per C(SigCgt) in
            C(/proc/<pid>/status)). Processes without a handler would be killed by SIGUSR1 and are skipped; the torchrun
            agent, for example, does not forward SIGUSR1 and has no handler for it. If no process catches the signal
            the task fails before anything is sent.
          - V(all) sends it to every job process, handler or not.
          - V(roots) sends it only to the selected processes (the pidfile PID, the unit's processes, or the roots
            matched by O(cmdline_match)).
        type: str
        choices: [catching, all, roots]
        default: catching
      trigger_file:
        description:
          - File to create when O(checkpoint.request=file). Its parent directory must exist.
        type: path
      path:
        description:
          - Directory in which checkpoints appear. Required unless O(checkpoint.request=none).
        type: path
      glob:
        description:
          - Shell pattern for checkpoint entries (files or directories) inside O(checkpoint.path), for example
            V(step_*) or V(checkpoint-*). Exclude temporary names the trainer renames from.
        type: str
        default: "*"
      marker:
        description:
          - File name inside a checkpoint directory whose presence marks the checkpoint complete (the trainer writes
            it last). This is the exact test; set it whenever the trainer writes such a file.
          - "Without it, a new checkpoint entry (file or directory) is complete when it has B(settled): (1) its
            signature (total size, number of files, newest modification time of the entry and of anything inside
            it) stayed the same for O(checkpoint.settle_seconds) of observation, so no file in it is still
            growing; (2) it is not empty; (3) no process has a file inside it open for writing (C(/proc/<pid>/fd));
            (4) no other new entry is still growing or settling (a stop in the middle of the next save would leave
            a torn checkpoint with the highest step); (5) the job is still running when it settles (a save cut short
            by a crash stops changing, too). One with fewer files than the newest checkpoint before the request (a
            save that may be paused between two files) must stay unchanged three times as long."
          - "Settling is weaker than a marker: a trainer that pauses longer than that between two files of one save
            without holding a file open (gathering sharded optimizer state, for example) looks complete too early.
            Choose O(checkpoint.settle_seconds) above the longest pause of a save."
        type: str
      settle_seconds:
        description:
          - How long a new checkpoint must stay unchanged to count as complete when no O(checkpoint.marker) is set
            (see there for the whole rule). Ignored with a marker.
          - The default, 30 s, is above the pauses a save makes between its files while it gathers and serializes
            state (a few seconds to tens of seconds for sharded optimizer state); it costs 30 s once per stop, while
            taking a save too early costs the work since the previous checkpoint.
        type: float
        default: 30
        aliases: [stable_seconds]
      step_regex:
        description:
          - Regular expression that extracts the step number from a checkpoint name; uses the named group C(step) if
            present, otherwise the first group. The default takes the last number in the name.
        type: str
        default: '(\d+)(?!.*\d)'
      timeout:
        description:
          - Seconds to wait for a new complete checkpoint after the request.
        type: float
        default: 600
  force:
    description:
      - Stop the job even if the checkpoint could not be requested or did not land in time. The work since the last
        checkpoint is lost.
    type: bool
    default: false
  grace_period:
    description:
      - Seconds to wait after SIGTERM before sending SIGKILL. torchrun gives its workers 30 seconds after it receives
        SIGTERM, so keep this above 30 for torchrun jobs.
    type: float
    default: 60
  kill_timeout:
    description:
      - Seconds to wait after SIGKILL for the processes to disappear before the task fails listing the survivors.
    type: float
    default: 30
  poll_interval:
    description:
      - Seconds between scans of the process table and the checkpoint directory.
    type: float
    default: 0.5
  state_dir:
    description:
      - Directory on the target for the stop's own state, created root-only when missing. With it, only one stop runs
        on the host at a time (an exclusive lock on C(<state_dir>/lock); a stop that finds the lock held waits, with
        progress, as long as an abandoned stop needs to cancel or finish, that is O(heartbeat_timeout) + O(grace_period)
        + O(kill_timeout) + 30 s, then fails naming the holder), and every stop that sent anything writes a record to
        C(<state_dir>/records/<UTC time>-<pid>.json) (see RV(host_record)).
      - Records stay until the controller imports and removes them (the C(stop_training) role does, on every run).
      - When it is C(/var/lib/pivot/stop_training) and missing while C(/var/lib/pivot/training_stop) exists (where
        this module kept its state under its former name, C(training_stop)), that directory, with its records, is
        moved here first; refused, doing nothing, while a stop of that earlier Pivot still holds its lock.
    type: path
  heartbeat_file:
    description:
      - File the controller refreshes while it watches this stop (M(pivot.ops.async_watch) does on every poll). The
        module touches it once when it starts.
      - "When it is older than O(heartbeat_timeout) while no signal that ends the job has been sent yet (SIGTERM,
        SIGKILL, SIGINT, SIGQUIT, SIGHUP or C(systemctl stop); a SIGUSR1 checkpoint request is not one), the stop is
        cancelled: the trigger file is removed, nothing else is sent, the job keeps running, and the task fails with
        RV(cancelled). Once such a signal went out, the stop runs to its end whatever the heartbeat says."
      - Checked at every poll while waiting for the checkpoint or for the host lock. Before the first signal that ends
        the job the stop waits for the controller to refresh it once more (its next look, a few seconds); a Ctrl-C
        pressed while the checkpoint was landing leaves the heartbeat fresh for up to O(heartbeat_timeout) but brings
        no further look, so the stop cancels instead of ending the job. Removed when the module ends.
    type: path
  heartbeat_timeout:
    description:
      - Seconds without a heartbeat after which the controller counts as gone. Keep it several times the watcher's
        poll interval. V(0) disables the check.
    type: float
    default: 60
  progress_file:
    description:
      - "File the module rewrites (JSON, at most once a second) with one human-readable line about what it is doing, for
        example 'waiting for a complete checkpoint newer than the request: 120 s of 900, newest step_000005400
        (growing, 1.2 GiB)'. M(pivot.ops.async_watch) returns that line as its C(progress). Removed when the module
        ends."
    type: path
  run_id:
    description:
      - The controller's name for this run, kept in the host record and in the lock, so a waiting stop can say whose
        stop it waits for.
    type: str
    default: ""
  log_file:
    description:
      - Training log; the last step is parsed from its tail and returned as RV(last_step).
    type: path
  log_step_regex:
    description:
      - Regular expression for the step in a log line; uses the named group C(step) if present, otherwise the first
        group. The default fits lines such as C([2158m] step=5381 loss=--- ... ETA=7.1d).
    type: str
    default: '\bstep=(\d+)'
  log_tail_bytes:
    description:
      - How many bytes from the end of O(log_file) are searched.
    type: int
    default: 65536
notes:
  - Signal-based checkpoint requests are best effort on the trainer's side; the module therefore never trusts the
    signal and confirms the checkpoint on disk before it stops anything.
  - A training job started by hand under C(nohup) shares the session of its shell; the module does not signal that
    session as a whole, only the job's own processes and the process groups and sessions they lead.
seealso:
  - module: pivot.ops.gpu_release
  - module: ansible.builtin.wait_for
"""

EXAMPLES = r"""
- name: Checkpoint on SIGUSR1, wait for a complete step_* directory, then stop the torchrun job
  pivot.ops.stop_training:
    cmdline_match:
      - /root/train/run.sh
    match_env:
      - TORCHELASTIC_RUN_ID
    checkpoint:
      request: signal
      path: /data/dflash/checkpoints
      glob: step_*
      marker: COMPLETE
      timeout: 900
    grace_period: 60
    log_file: /root/train/train.log
  register: stopped

- name: Show what was stopped
  ansible.builtin.debug:
    msg: "Stopped at step {{ stopped.last_step }}, checkpoint {{ stopped.checkpoint.path }}"

- name: Stop a job found through its pidfile, asking for a checkpoint with a trigger file
  pivot.ops.stop_training:
    pidfile: /run/train.pid
    cmdline_match:
      - train_dflash_pipeline.py
    checkpoint:
      request: file
      trigger_file: /root/train/SAVE_NOW
      path: /data/dflash/checkpoints
      glob: checkpoint-*
      settle_seconds: 45       # no marker: complete once unchanged for 45 s, nothing open for writing

- name: Start the stop on the host; it cancels itself if this controller goes away before SIGTERM
  pivot.ops.stop_training:
    cmdline_match:
      - /root/train_dflash_pipeline.py
    checkpoint:
      path: /data/dflash/checkpoints
      glob: step_*
      timeout: 900
    state_dir: /var/lib/pivot/stop_training
    heartbeat_file: /var/lib/pivot/stop_training/heartbeat-1
    progress_file: /var/lib/pivot/stop_training/progress-1.json
  async: 1200
  poll: 0
  register: started

- name: Watch it (the pivot.ops.progress callback prints each progress line)
  pivot.ops.async_watch:
    results_file: "{{ started.results_file }}"
    heartbeat_file: /var/lib/pivot/stop_training/heartbeat-1
    progress_file: /var/lib/pivot/stop_training/progress-1.json
  register: watched
  until: watched.finished
  retries: 250
  delay: 5

- name: Stop a systemd-managed trainer without any checkpoint request
  pivot.ops.stop_training:
    unit: trainer.service
    grace_period: 45

- name: Preview what would be signalled
  pivot.ops.stop_training:
    cmdline_match:
      - train_dflash_pipeline.py
    max_roots: 1
  check_mode: true
  register: preview
"""

RETURN = r"""
msg:
  description: What happened, in one sentence.
  returned: always
  type: str
  sample: Stopped 10 processes after checkpoint step_5400 (step 5400); SIGKILL was not needed.
pids:
  description: The job's processes as first discovered.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID.
      type: int
    ppid:
      description: Parent process ID.
      type: int
    sid:
      description: Session ID.
      type: int
    pgid:
      description: Process group ID.
      type: int
    cmdline:
      description: Command line, arguments joined with spaces.
      type: str
    matched_by:
      description:
        - Why the process belongs to the job (V(selected), V(descendant), V(session), V(cgroup), V(environment).
      type: str
  sample:
    - {pid: 4242, ppid: 1, sid: 4242, pgid: 4242, cmdline: "bash /root/train/run.sh", matched_by: selected}
planned:
  description: The actions the module would take (check mode) or took, in order.
  returned: always
  type: list
  elements: str
  sample: ["send SIGUSR1 to 8 processes that handle it", "SIGTERM 10 processes, SIGKILL after 60s"]
checkpoint_signal_targets:
  description:
    - The PIDs the checkpoint request's signal goes to (or, in check mode, would go to). Empty when no process of the
      job handles the signal, which refuses the stop unless O(force); the preflight calls the module in check mode
      to find that out before anything is stopped.
    - Null when the checkpoint is not requested by signal, or no job was found.
  returned: always
  type: list
  elements: int
  sample: [4243, 4244]
checkpoint:
  description: The checkpoint that was confirmed before the stop; empty when no checkpoint was requested.
  returned: always
  type: dict
  contains:
    path:
      description: Path of the checkpoint entry; null when none landed.
      type: str
    step:
      description: Step parsed from the checkpoint name with O(checkpoint.step_regex); null if it has no number.
      type: int
    size_bytes:
      description: Total size of the checkpoint.
      type: int
    requested_at:
      description: UTC time of the request (ISO 8601).
      type: str
    completed_at:
      description: UTC time the checkpoint was confirmed complete (ISO 8601).
      type: str
  sample: {path: /data/dflash/checkpoints/step_5400, step: 5400, size_bytes: 1048576,
           requested_at: "2026-11-30T15:34:01Z", completed_at: "2026-11-30T15:35:12Z"}
checkpoint_space:
  description:
    - In check mode, whether the checkpoint the stop would ask for fits where it goes; the preflight refuses the stop
      when the free space is below the size of the newest complete checkpoint (the trainer would fail with ENOSPC).
  returned: in check mode, when O(checkpoint.path) is set and a job was found
  type: dict
  contains:
    directory:
      description: The checkpoint directory.
      type: str
    free_bytes:
      description: Bytes free there for the trainer (null when they cannot be read).
      type: int
    newest:
      description: The newest complete checkpoint (null when there is none yet).
      type: str
    newest_bytes:
      description: Its size in bytes (null when there is none).
      type: int
  sample: {directory: /data/dflash/checkpoints, free_bytes: 53687091200, newest: /data/dflash/checkpoints/step_5400,
           newest_bytes: 17179869184}
previous_checkpoint:
  description: The best complete checkpoint that existed before the request (highest step); what a forced stop
    leaves to resume from.
  returned: when O(checkpoint.path) is set
  type: dict
  contains:
    path:
      description: Its path; null when there was none.
      type: str
    step:
      description: Its step; null when unknown.
      type: int
  sample: {path: /data/dflash/checkpoints/step_4000, step: 4000}
forced:
  description: Present and true when O(force=true) overrode a checkpoint that could not be requested or did not land.
  returned: when the stop was forced
  type: bool
  sample: true
work_lost:
  description: What a forced stop lost, also sent as a warning and put at the front of RV(msg).
  returned: when the stop was forced
  type: dict
  contains:
    reason:
      description: What force overrode.
      type: str
    last_checkpoint:
      description: RV(previous_checkpoint.path).
      type: str
    last_checkpoint_step:
      description: RV(previous_checkpoint.step).
      type: int
    last_logged_step:
      description: RV(last_step).
      type: int
    steps_lost:
      description: RV(last_step) minus the checkpoint's step; null when either is unknown.
      type: int
  sample: {reason: "No new complete checkpoint ...", last_checkpoint: /data/dflash/checkpoints/step_4000,
           last_checkpoint_step: 4000, last_logged_step: 5381, steps_lost: 1381}
last_step:
  description: The last training step found in the tail of O(log_file); null without a log file or a match.
  returned: always
  type: int
  sample: 5381
last_log_line:
  description: The log line RV(last_step) was read from.
  returned: when O(log_file) is set
  type: str
  sample: "[2158m] step=5381 loss=--- acc=--- | tgt=0.48b/s dft=0.48b/s (19.5Ktok/s) | ETA=7.1d"
signals:
  description: Signals sent, per process, in order.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID.
      type: int
    cmdline:
      description: Command line.
      type: str
    signals:
      description: Signal names sent to the process.
      type: list
      elements: str
    group_signals:
      description: Signal names sent to the process group this process leads.
      type: list
      elements: str
  sample: [{pid: 4242, cmdline: "bash run.sh", signals: [SIGTERM], group_signals: [SIGTERM]}]
sigkill_needed:
  description: Whether any process of the job had to be killed with SIGKILL (by the module, or by systemd's stop timeout
    with O(unit)).
  returned: always
  type: bool
  sample: false
remaining:
  description: Processes of the job still alive at the end; the task fails if this is not empty.
  returned: always
  type: list
  elements: dict
  sample: []
timings:
  description: Seconds spent per phase (V(discover), V(checkpoint), V(sigterm), V(sigkill), V(total)).
  returned: always
  type: dict
  sample: {discover: 0.05, checkpoint: 42.1, sigterm: 3.2, sigkill: 0.0, total: 45.4}
cancelled:
  description: Present and true when the stop cancelled itself because its controller's heartbeat went stale before any
    signal that ends the job was sent; the job was left running.
  returned: when cancelled
  type: bool
  sample: true
attended:
  description: Whether the controller was still watching when the module ended (its heartbeat fresh); always true
    without O(heartbeat_file).
  returned: always
  type: bool
  sample: true
committed_at:
  description: UTC time the first signal that ends the job (or C(systemctl stop)) went out; null if none did.
  returned: always
  type: str
  sample: "2026-11-30T15:35:12Z"
host_record:
  description:
    - Path of the record this stop wrote in O(state_dir) (null when it sent nothing or O(state_dir) is not set). It
      holds C(outcome) (V(stopped), V(failed) or V(cancelled)), C(attended) and C(finished_unattended) (whether the
      controller's heartbeat was fresh or stale when the module ended), C(run_id), C(started_at),
      C(stopped_at), C(msg), C(checkpoint), C(previous_checkpoint), C(last_logged_step), C(forced), C(work_lost),
      C(sigkill_needed), C(remaining), C(committed_at), C(job) (C(selector) and C(processes)) and C(log_file).
  returned: always
  type: str
  sample: /var/lib/pivot/stop_training/records/20261130T153401Z-4242.json
candidates:
  description: The processes involved when the selection was refused (ambiguous match, PID 1, an ancestor).
  returned: failure
  type: list
  elements: dict
  sample: [{pid: 100, ppid: 1, cmdline: "python3 train.py"}, {pid: 200, ppid: 1, cmdline: "python3 train.py"}]
"""

import os
import re
import signal
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pivot.ops.plugins.module_utils.checkpoint import (
    CheckpointSpec,
    CheckpointWatcher,
    describe_wait,
    disk_full_in_log,
    free_bytes,
    latest_step_in_log,
)
from ansible_collections.pivot.ops.plugins.module_utils.escalation import (
    Escalator,
    Signaller,
    SignalLog,
    signal_name,
)
from ansible_collections.pivot.ops.plugins.module_utils.job import (
    JobError,
    JobSpec,
    JobTracker,
    protected_pids,
)
from ansible_collections.pivot.ops.plugins.module_utils.procfs import ProcFS, catches_signal
from ansible_collections.pivot.ops.plugins.module_utils.progress import (
    Heartbeat,
    ProgressFile,
    read_json,
    waited_text,
)
from ansible_collections.pivot.ops.plugins.module_utils.state_dir import adopt_former_state_dir, former_state_dir
from ansible_collections.pivot.ops.plugins.module_utils.stop_record import (
    CANCELLED,
    FAILED,
    STOPPED,
    CommitState,
    HostLock,
    HostLockBusy,
    ensure_state_dir,
    record_path,
    should_cancel,
    utc_now,
    write_record,
)
from ansible_collections.pivot.ops.plugins.module_utils.systemd_unit import (
    SystemdError,
    SystemdUnit,
    UnitStatus,
)

PROC_ROOT = "/proc"
JOB_SCAN_INTERVAL = 2.0  # seconds between checks that the job still runs, while waiting for its checkpoint
GIB = 1024 ** 3
LOOK_POLL_S = 0.2  # how often the stop looks for the controller's next look before its point of no return
LOCK_WAIT_MARGIN = 30.0  # beyond heartbeat_timeout + grace_period + kill_timeout, for an abandoned stop to end


class JobEnded(Exception):
    """Every process of the job exited during the checkpoint wait, without a signal from this module that ends it."""


def process_entry(info, reason: str) -> dict:
    return {
        "pid": info.pid,
        "ppid": info.ppid,
        "sid": info.sid,
        "pgid": info.pgid,
        "cmdline": info.command,
        "matched_by": reason,
    }


def process_lines(processes) -> str:
    return "".join("%d %s\n" % (info.pid, info.command) for info in processes)


def first_commands(members, limit: int = 2) -> str:
    """``PID 4242 python3 -u /root/train.py, ...`` for a progress line: the first processes, commands cut short."""
    shown = ["PID %d %s" % (info.pid, info.command[:50]) for info in list(members)[:limit]]
    more = len(members) - len(shown)
    return ", ".join(shown) + (" and %d more" % more if more > 0 else "")


class TrainingStop:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.proc = ProcFS(PROC_ROOT)
        self.log = SignalLog()
        self.signaller = Signaller(self.proc, self.log)
        self.timings = {}
        self.result = {
            "changed": False,
            "pids": [],
            "planned": [],
            "checkpoint_signal_targets": None,
            "checkpoint": {},
            "last_step": None,
            "signals": [],
            "sigkill_needed": False,
            "remaining": [],
            "timings": self.timings,
            "attended": True,
            "committed_at": None,
            "host_record": None,
        }
        self.checkpoint_params = self.params["checkpoint"] or {}
        self.trigger_created = False
        self.started = time.monotonic()
        self.started_utc = utc_now()
        self.open_phase = None  # (name, start) of a phase a failure may interrupt, so its timing is still reported
        self.forced_because = []  # what force=true overrode
        self.commit = CommitState()
        self.cancelled = False
        live = not module.check_mode
        self.heartbeat = Heartbeat(self.params["heartbeat_file"] if live else None, self.params["heartbeat_timeout"])
        self.progress = ProgressFile(
            self.params["progress_file"] if live else None,
            identity={"run_id": self.params["run_id"], "started_at": self.started_utc},
        )
        # A host's directory of this module's former name becomes state_dir (see prepare_state); check mode looks
        # at the lock where it still is.
        self.former_state_dir = former_state_dir(self.params["state_dir"])
        lock_dir = self.former_state_dir if module.check_mode and self.former_state_dir else self.params["state_dir"]
        self.lock = HostLock(lock_dir) if lock_dir else None
        self.systemd = SystemdUnit(module, self.params["unit"]) if self.params["unit"] else None

    # --- helpers ------------------------------------------------------------------------------------------------

    def fail(self, msg: str, **extra) -> None:
        if self.open_phase is not None:
            name, phase_started = self.open_phase
            self.timings.setdefault(name, round(time.monotonic() - phase_started, 3))
        self.read_last_step()
        self.result["signals"] = self.log.as_list()
        self.timings["total"] = round(time.monotonic() - self.started, 3)
        self.result.update(extra)
        self.end(CANCELLED if self.cancelled else FAILED, msg)
        self.module.fail_json(msg=msg, **self.result)

    def end(self, outcome: str, msg: str) -> None:
        """Everything a run does last, however it ends: the host record, then the cleanup."""
        self.remove_trigger()
        self.result["attended"] = not self.heartbeat.stale()
        self.result["committed_at"] = self.commit.committed_at
        if self.lock is not None and (self.result["changed"] or self.cancelled) and not self.module.check_mode:
            self.write_host_record(outcome, msg)
        self.progress.close()
        self.heartbeat.close()
        if self.lock is not None:
            self.lock.release()

    def write_host_record(self, outcome: str, msg: str) -> None:
        path = record_path(self.params["state_dir"], self.started_utc, os.getpid())
        selector = {key: self.params[key] for key in ("pidfile", "unit", "cmdline_match", "match_env", "max_roots")
                    if self.params[key] not in (None, [])}
        record = {
            "outcome": outcome,
            "attended": self.result["attended"],
            "finished_unattended": not self.result["attended"],
            "run_id": self.params["run_id"],
            "started_at": self.started_utc,
            "stopped_at": utc_now(),
            "msg": msg,
            "checkpoint": self.result.get("checkpoint") or {},
            "previous_checkpoint": self.result.get("previous_checkpoint"),
            "last_logged_step": self.result.get("last_step"),
            "forced": bool(self.result.get("forced")),
            "work_lost": self.result.get("work_lost"),
            "sigkill_needed": self.result["sigkill_needed"],
            "remaining": self.result["remaining"],
            "committed_at": self.commit.committed_at,
            "job": {"selector": selector, "processes": self.result["pids"]},
            "log_file": self.params["log_file"] or "",
        }
        try:
            write_record(path, record)
        except OSError as exc:
            self.module.warn("Could not write the stop's host record %s: %s" % (path, exc))
            return
        self.result["host_record"] = path

    def unit_status(self) -> UnitStatus | None:
        if self.systemd is None:
            return None
        try:
            return self.systemd.status()
        except SystemdError as exc:
            hint = " On a host without systemd, select the job with pidfile or cmdline_match." if exc.missing else ""
            self.fail(str(exc) + hint, **exc.details())
        return None  # unreachable, fail_json exits

    def build_tracker(self) -> JobTracker:
        spec = JobSpec(
            pidfile=self.params["pidfile"],
            unit=self.unit_status(),
            cmdline_match=self.params["cmdline_match"] or [],
            match_env=self.params["match_env"],
            max_roots=self.params["max_roots"],
        )
        try:
            return JobTracker(spec, self.proc, protected_pids(self.proc))
        except JobError as exc:
            self.fail(str(exc), candidates=exc.candidates)
        return None  # unreachable, fail_json exits

    def checkpoint_watcher(self) -> CheckpointWatcher | None:
        path = self.checkpoint_params.get("path")
        if not path:
            return None
        step_regex = self.checkpoint_params["step_regex"]
        try:
            re.compile(step_regex)
        except re.error as exc:
            self.fail("checkpoint.step_regex %r is not a valid regular expression: %s" % (step_regex, exc))
        spec = CheckpointSpec(
            directory=path,
            pattern=self.checkpoint_params["glob"],
            marker=self.checkpoint_params["marker"],
            settle_seconds=self.checkpoint_params["settle_seconds"],
            step_regex=step_regex,
        )
        return CheckpointWatcher(spec)

    # --- the controller: heartbeat and host lock ----------------------------------------------------------------

    def cancel_if_unwatched(self) -> None:
        """Cancel while nothing that ends the job went out, if the controller stopped refreshing the heartbeat."""
        if not should_cancel(self.commit, self.heartbeat.stale()):
            return
        self.cancelled = True
        self.result["cancelled"] = True
        age = self.heartbeat.age()
        self.fail(
            "Cancelled: the controller stopped watching this stop (no heartbeat in %s for %s; the ansible-playbook "
            "that started it was interrupted or lost its connection) before any signal that ends the job was sent. "
            "The job was left running; nothing was stopped.%s"
            % (
                self.params["heartbeat_file"],
                "ever" if age is None else "%d s" % age,
                self.cancelled_checkpoint_note(),
            )
        )

    def cancelled_checkpoint_note(self) -> str:
        """What a cancelled stop says of the checkpoint it had asked for."""
        checkpoint = self.result.get("checkpoint") or {}
        if checkpoint.get("path"):
            return " The checkpoint it had asked for is complete: %s (step %s)." % (
                checkpoint["path"], checkpoint.get("step"))
        if self.result["changed"]:
            return " A checkpoint request had been sent; the checkpoint it asked for may still land."
        return ""

    def commit_to(self, what: str) -> None:
        """Last chance to cancel, then the point of no return: from here the stop runs to its end."""
        self.await_a_look(what)
        self.cancel_if_unwatched()
        self.commit.note_ending(what)

    def await_a_look(self, what: str) -> None:
        """Wait for a look of the controller made after this moment, or for its heartbeat to go stale.

        A heartbeat that is merely not stale yet is no proof anyone watches: after a Ctrl-C it stays fresh for up to
        heartbeat_timeout, and a checkpoint landing in that time would otherwise end the job behind the user's back.
        The controller looks every few seconds while it watches, so this costs one look's wait."""
        if not self.heartbeat.enabled:
            return
        ready = self.heartbeat.wall_clock()
        self.progress.update("confirm", "ready for %s: waiting for the controller's next look before it" % what)
        while not self.heartbeat.stale():
            if self.heartbeat.refreshed_since(ready):
                return
            time.sleep(min(LOOK_POLL_S, self.params["poll_interval"]))

    def lock_wait_limit(self) -> float:
        return self.params["heartbeat_timeout"] + self.params["grace_period"] + self.params["kill_timeout"] + \
            LOCK_WAIT_MARGIN

    def prepare_state(self) -> None:
        """Create state_dir and refresh the heartbeat once, so the controller has heartbeat_timeout for its first
        poll."""
        if self.params["state_dir"]:
            self.adopt_former_state_dir()
            try:
                ensure_state_dir(self.params["state_dir"])
            except OSError as exc:
                self.lock = None
                self.fail("Cannot create state_dir %s: %s. Choose a writable local directory."
                          % (self.params["state_dir"], exc))
        try:
            self.heartbeat.touch()
        except OSError as exc:
            self.fail("Cannot write heartbeat_file %s: %s. Its directory must exist and be writable."
                      % (self.params["heartbeat_file"], exc))

    def adopt_former_state_dir(self) -> None:
        """Move the host's directory of this module's former name (training_stop) to state_dir, with the records no
        run has imported yet; refused while a stop of that earlier Pivot still holds its lock there."""
        former, state_dir = self.former_state_dir, self.params["state_dir"]
        if former is None:
            return
        holder = HostLock(former).held_by()
        if holder is not None:
            self.lock = None  # not ours: no record, nothing to release
            self.fail(
                "A training stop of an earlier Pivot, from before this module was renamed, is still running on this "
                "host (%s; its state is in %s). Nothing was done. Let it finish (%s), then run again: %s is then moved "
                "to %s and the stop's record imported." % (describe_holder(holder), former, holder_progress(holder),
                                                           former, state_dir)
            )
        try:
            adopt_former_state_dir(state_dir, former)
        except OSError as exc:
            self.lock = None
            self.fail("Cannot move %s, where an earlier Pivot kept this module's state, to %s: %s. Move it there by "
                      "hand. Nothing was done." % (former, state_dir, exc))

    def take_host_lock(self) -> None:
        if self.lock is None:
            return
        holder = {"pid": os.getpid(), "run_id": self.params["run_id"], "started_at": self.started_utc,
                  "progress_file": self.params["progress_file"]}
        limit = self.lock_wait_limit()

        def waiting(other: dict, waited: float) -> None:
            self.progress.update("lock", "waiting for an earlier stop on this host to end (%s): %s; %s"
                                 % (describe_holder(other), waited_text(waited, limit), holder_progress(other)))
            self.cancel_if_unwatched()

        started = time.monotonic()
        try:
            self.lock.acquire(holder, limit, waiting)
        except HostLockBusy as busy:
            self.lock = None  # not ours: no record, nothing to release
            self.fail(
                "Another training stop is still running on this host (%s) after %d s of waiting; its controller is "
                "probably still watching it. Nothing was done. Let it finish (its progress: %s), then run again; "
                "its record is imported by the next run." % (
                    describe_holder(busy.holder), self.lock_wait_limit(), holder_progress(busy.holder))
            )
        except OSError as exc:
            self.lock = None
            self.fail("Cannot lock %s/lock: %s. Check that state_dir is a local, writable directory."
                      % (self.params["state_dir"], exc))
        self.timings["lock"] = round(time.monotonic() - started, 3)

    def lock_busy_note(self) -> str | None:
        """Check mode: who holds the host lock, without taking it (and without writing anything)."""
        holder = self.lock.held_by() if self.lock is not None else None
        if holder is None:
            return None
        return "wait for the earlier stop still running on this host (%s)" % describe_holder(holder)

    # --- planning -----------------------------------------------------------------------------------------------

    def checkpoint_signal_targets(self, members: dict, tracker: JobTracker) -> list:
        signum = signal.Signals[self.checkpoint_params["signal"]]
        targets = self.checkpoint_params["signal_targets"]
        if targets == "roots":
            roots = set(tracker.roots())
            return [info for pid, info in members.items() if pid in roots]
        if targets == "all":
            return list(members.values())
        return [info for pid, info in members.items() if catches_signal(self.proc.signal_masks(pid), signum)]

    def plan(self, members: dict, tracker: JobTracker) -> list:
        steps = []
        request = self.checkpoint_params.get("request") if self.checkpoint_params else None
        if request == "signal":
            targets = self.checkpoint_signal_targets(members, tracker)
            self.result["checkpoint_signal_targets"] = [info.pid for info in targets]
            if targets:
                steps.append(
                    "send %s to %d process(es): %s"
                    % (self.checkpoint_params["signal"], len(targets), ", ".join(str(info.pid) for info in targets))
                )
            else:
                steps.append(
                    "no process handles %s: fail without stopping anything%s"
                    % (self.checkpoint_params["signal"], " (force=true: stop anyway)" if self.params["force"] else "")
                )
        elif request == "file":
            steps.append("create trigger file %s" % self.checkpoint_params["trigger_file"])
        if self.checkpoint_params.get("path"):
            steps.append(
                "wait up to %gs for a new complete checkpoint %s/%s (%s)"
                % (self.checkpoint_params["timeout"], self.checkpoint_params["path"], self.checkpoint_params["glob"],
                   "marker %s" % self.checkpoint_params["marker"] if self.checkpoint_params["marker"]
                   else "no marker: settled for %gs" % self.checkpoint_params["settle_seconds"])
            )
        if self.params["unit"]:
            steps.append("systemctl stop %s" % self.params["unit"])
        steps.append(
            "SIGTERM %d process(es) (and the process groups they lead), SIGKILL survivors after %gs"
            % (len(members), self.params["grace_period"])
        )
        return steps

    # --- phases -------------------------------------------------------------------------------------------------

    def request_checkpoint(self, members: dict, tracker: JobTracker) -> bool:
        """Send the request; False when it could not be sent and force=true lets the stop go ahead without it."""
        request = self.checkpoint_params["request"]
        if request == "signal":
            signum = signal.Signals[self.checkpoint_params["signal"]]
            targets = self.checkpoint_signal_targets(members, tracker)
            if not targets:
                self.refuse_or_force(
                    "No process of the job has a handler for %s, so the checkpoint cannot be requested by signal "
                    "(sending it would kill them). Use checkpoint.request=file, signal_targets=all if the trainer "
                    "really handles it, or force=true to stop without a checkpoint." % signal_name(signum)
                )
                return False
            self.commit.note_signal(signum, "checkpoint request by %s" % signal_name(signum))
            for info in targets:
                self.signaller.send(info, signum)
            self.result["changed"] = True
            self.progress.update("request", "requested a checkpoint: %s sent to %d process(es)"
                                 % (signal_name(signum), len(targets)))
        elif request == "file":
            trigger = self.checkpoint_params["trigger_file"]
            try:
                with open(trigger, "w") as handle:
                    handle.write("checkpoint requested by pivot.ops.stop_training at %s\n" % utc_now())
            except OSError as exc:
                self.refuse_or_force("Cannot create checkpoint trigger file %s: %s." % (trigger, exc))
                return False
            self.trigger_created = True
            self.result["changed"] = True
        return True

    @staticmethod
    def gib(size: int) -> str:
        return "%.1f GiB" % (size / GIB)

    def disk_full_note(self) -> str:
        """A sentence naming a full disk when the training log's tail says so (ENOSPC, a quota), else ''."""
        if not self.params["log_file"]:
            return ""
        line = disk_full_in_log(self.params["log_file"], self.params["log_tail_bytes"])
        if line is None:
            return ""
        directory = self.checkpoint_params.get("path") or "the checkpoint directory"
        free = free_bytes(directory) if self.checkpoint_params.get("path") else None
        return (" The training log says the disk is full: %r. Free space where the checkpoints go (%s%s) before the "
                "next try." % (line[:300], directory, "" if free is None else ", %s free now" % self.gib(free)))

    def checkpoint_space(self) -> dict | None:
        """Free space where the checkpoints go, and the size of the newest complete one (what the next one will
        about take): the preflight refuses a stop whose checkpoint would not fit."""
        watcher = self.checkpoint_watcher()
        if watcher is None:
            return None
        watcher.take_baseline()
        newest = watcher.newest_before()
        return {"directory": watcher.spec.directory, "free_bytes": free_bytes(watcher.spec.directory),
                "newest": newest.path if newest else None, "newest_bytes": newest.size if newest else None}

    def refuse_or_force(self, msg: str) -> None:
        if self.params["force"]:
            self.forced_because.append(msg)
        if not self.params["force"]:
            self.fail(msg + " The job was left running; nothing was stopped.")
        self.module.warn(msg + " Continuing because force=true.")

    def remove_trigger(self) -> None:
        trigger = self.checkpoint_params.get("trigger_file")
        if self.trigger_created and trigger and os.path.exists(trigger):
            try:
                os.unlink(trigger)
            except OSError as exc:
                self.module.warn("Could not remove checkpoint trigger file %s: %s" % (trigger, exc))
        self.trigger_created = False

    def wait_for_checkpoint(self, watcher: CheckpointWatcher, tracker: JobTracker, previous) -> tuple:
        """Poll until a new complete checkpoint is accepted or the timeout passes: (checkpoint or None, last states).
        Reports progress, cancels when the controller is gone, raises JobEnded when the job exits meanwhile."""
        timeout = self.checkpoint_params["timeout"]
        started = time.monotonic()
        next_scan = started + JOB_SCAN_INTERVAL
        while True:
            states = watcher.poll()
            found = watcher.accept(states)
            elapsed = time.monotonic() - started
            self.progress.update("checkpoint", "waiting for a complete checkpoint newer than the request: %s, %s" % (
                waited_text(elapsed, timeout), describe_wait(states, previous, watcher.reference)))
            if found is not None and (watcher.spec.marker or tracker.scan()):
                return found, states
            if found is not None:
                raise JobEnded(found.path)
            if elapsed >= timeout:
                return None, states
            self.cancel_if_unwatched()
            if time.monotonic() >= next_scan:
                next_scan = time.monotonic() + JOB_SCAN_INTERVAL
                if not tracker.scan():
                    raise JobEnded(None)
            time.sleep(min(self.params["poll_interval"], max(0.0, timeout - elapsed)))

    def checkpoint_phase(self, members: dict, tracker: JobTracker) -> None:
        started = time.monotonic()
        self.open_phase = ("checkpoint", started)
        watcher = self.checkpoint_watcher()
        previous = None
        if watcher is not None:
            watcher.take_baseline()
            previous = watcher.newest_before()
            self.result["previous_checkpoint"] = {
                "path": previous.path if previous else None, "step": previous.step if previous else None,
            }
        requested_at = utc_now()
        requested = True
        if self.checkpoint_params["request"] != "none":
            requested = self.request_checkpoint(members, tracker)
        checkpoint = {
            "path": None,
            "step": None,
            "size_bytes": None,
            "requested_at": requested_at,
            "completed_at": None,
        }
        self.result["checkpoint"] = checkpoint
        if watcher is not None and requested:
            try:
                found, states = self.wait_for_checkpoint(watcher, tracker, previous)
            except JobEnded as ended:
                self.job_ended_during_wait(ended.args[0], previous)
                found, states = None, []
            if found is None and not self.forced_because:
                pending = watcher.pending(states)
                self.refuse_or_force(
                    "No new complete checkpoint matching %s/%s appeared within %gs after the request at %s%s.%s"
                    % (
                        watcher.spec.directory,
                        watcher.spec.pattern,
                        self.checkpoint_params["timeout"],
                        requested_at,
                        " (incomplete: %s)" % ", ".join(pending) if pending else "",
                        self.disk_full_note(),
                    )
                )
            elif found is not None:
                checkpoint.update(path=found.path, step=found.step, size_bytes=found.size, completed_at=utc_now())
        self.timings["checkpoint"] = round(time.monotonic() - started, 3)
        self.open_phase = None

    def job_ended_during_wait(self, unverified: str | None, previous) -> None:
        """The job exited by itself while its checkpoint was awaited: nothing is left to stop, and no checkpoint
        newer than the request is proven. Fails, unless force=true accepts that (then the stop reports what is lost)."""
        resume = previous.path if previous else "no checkpoint at all"
        msg = (
            "Every process of the job exited during the checkpoint wait, before this module sent anything that ends "
            "it: the trainer crashed or finished by itself. %sNo checkpoint newer than the request is proven; the "
            "newest complete one before it is %s. Read the end of the training log before resuming.%s"
            % ("%s settled, but without a marker a save cut short by a crash looks settled too, so it is not "
               "trusted. " % unverified if unverified else "", resume, self.disk_full_note())
        )
        if not self.params["force"]:
            self.fail(msg + " Nothing was stopped by this module.")
        self.forced_because.append(msg)
        self.module.warn(msg + " Continuing because force=true.")

    def systemctl_stop(self) -> None:
        try:
            if self.systemd.stop():
                self.result["sigkill_needed"] = True  # systemd killed what outlived the unit's stop timeout
        except SystemdError as exc:
            self.fail(str(exc), **exc.details())

    def report_escalation(self, signum: int, waited: float, timeout: float, members: dict) -> None:
        if signum == signal.SIGTERM:
            what = "SIGTERM sent: waiting for the job to exit, %s grace period" % waited_text(waited, timeout)
        else:
            what = "SIGKILL sent to what outlived the grace period: %s" % waited_text(waited, timeout)
        self.progress.update(signal_name(signum), "%s, %d process(es) left (%s)"
                             % (what, len(members), first_commands(members.values())))

    def stop_phase(self, tracker: JobTracker):
        self.commit_to("systemctl stop %s" % self.params["unit"] if self.params["unit"] else "SIGTERM")
        self.result["changed"] = True
        if self.params["unit"]:
            started = time.monotonic()
            self.progress.update("systemctl", "systemctl stop %s" % self.params["unit"])
            self.systemctl_stop()
            self.timings["systemctl_stop"] = round(time.monotonic() - started, 3)
        escalator = Escalator(tracker.scan, self.signaller, poll_interval=self.params["poll_interval"],
                              on_wait=self.report_escalation)
        outcome = escalator.run(tracker.scan(), self.params["grace_period"], self.params["kill_timeout"])
        self.timings.update(outcome.timings)
        self.result["sigkill_needed"] = self.result["sigkill_needed"] or outcome.sigkill_needed
        self.result["remaining"] = [
            process_entry(info, tracker.reasons.get(info.pid, "")) for info in outcome.remaining
        ]
        return outcome

    def validate_log_regex(self) -> None:
        regex = self.params["log_step_regex"]
        try:
            re.compile(regex)
        except re.error as exc:
            self.params["log_file"] = None  # nothing to read with it
            self.fail("log_step_regex %r is not a valid regular expression: %s" % (regex, exc))

    def read_last_step(self) -> None:
        """Fill last_step once, at the end of the run (success or failure), from the log's tail."""
        log_file = self.params["log_file"]
        if not log_file or "last_log_line" in self.result:
            return
        regex = self.params["log_step_regex"]
        try:
            step, line = latest_step_in_log(log_file, regex, self.params["log_tail_bytes"])
        except OSError as exc:
            self.module.warn("Cannot read log_file %s: %s; last_step is unknown." % (log_file, exc))
            step, line = None, None
        self.result["last_step"] = step
        self.result["last_log_line"] = line

    # --- main ---------------------------------------------------------------------------------------------------

    def discover(self, tracker: JobTracker) -> dict:
        try:
            members = tracker.scan(first=True)
        except JobError as exc:
            self.fail(str(exc), candidates=exc.candidates)
        self.timings["discover"] = round(time.monotonic() - self.started, 3)
        self.result["pids"] = [process_entry(info, tracker.reasons.get(pid, "")) for pid, info in members.items()]
        return members

    def preview(self, members: dict) -> None:
        busy = self.lock_busy_note()
        if busy:
            self.result["planned"].insert(0, busy)
        self.result["changed"] = True
        self.finish("Would stop %d process(es): %s." % (len(members), "; ".join(self.result["planned"])))

    def run(self) -> None:
        tracker = self.build_tracker()
        # Validate regexes before anything is signalled.
        self.checkpoint_watcher()
        self.validate_log_regex()
        if not self.module.check_mode:
            self.prepare_state()
            self.progress.update("start", "looking for the training job")
            self.take_host_lock()
        members = self.discover(tracker)
        if not members:
            notes = "; ".join(tracker.notes)
            self.finish("No process of the job is running%s; nothing to do." % (" (%s)" % notes if notes else ""))
            return
        self.result["planned"] = self.plan(members, tracker)
        if self.module._diff:
            self.result["diff"] = {"before": process_lines(members.values()), "after": ""}
        if self.module.check_mode:
            self.result["checkpoint_space"] = self.checkpoint_space()
            self.preview(members)
            return
        if self.checkpoint_params:
            self.checkpoint_phase(members, tracker)
        outcome = self.stop_phase(tracker)
        if self.module._diff:
            self.result["diff"]["after"] = process_lines(outcome.remaining)
        if outcome.remaining:
            self.fail(
                "%d process(es) of the job survived SIGKILL after %gs: %s. They may be stuck in the kernel "
                "(state D) or in a PID namespace this module cannot signal; inspect them with "
                "'ps -o pid,stat,wchan,cmd -p <pid>'."
                % (
                    len(outcome.remaining),
                    self.params["kill_timeout"],
                    "; ".join("PID %d %s" % (info.pid, info.command) for info in outcome.remaining),
                )
            )
        checkpoint = self.result["checkpoint"]
        saved = (
            " after checkpoint %s (step %s)" % (checkpoint["path"], checkpoint["step"])
            if checkpoint.get("path")
            else ""
        )
        stopped = "Stopped %d process(es)%s; SIGKILL was %sneeded." % (
            len(outcome.terminated) or len(members), saved, "" if self.result["sigkill_needed"] else "not ")
        self.read_last_step()
        if self.forced_because:
            stopped = self.report_lost_work() + " " + stopped
        self.finish(stopped)

    def report_lost_work(self) -> str:
        """force=true overrode a missing checkpoint: say, in the result and as a warning, what is lost."""
        previous = self.result.get("previous_checkpoint") or {"path": None, "step": None}
        last_step = self.result.get("last_step")
        steps_lost = None
        if last_step is not None and previous["step"] is not None and last_step >= previous["step"]:
            steps_lost = last_step - previous["step"]
        self.result["forced"] = True
        self.result["work_lost"] = {
            "reason": " ".join(self.forced_because),
            "last_checkpoint": previous["path"],
            "last_checkpoint_step": previous["step"],
            "last_logged_step": last_step,
            "steps_lost": steps_lost,
        }
        message = "FORCED STOP WITHOUT A NEW CHECKPOINT: resume from %s (step %s); the log had reached step %s%s." % (
            previous["path"] or "no checkpoint at all",
            "-" if previous["step"] is None else previous["step"],
            "-" if last_step is None else last_step,
            ", so %d steps of training are lost" % steps_lost if steps_lost is not None
            else "; the work since then is lost",
        )
        self.module.warn(message)
        return message

    def finish(self, msg: str) -> None:
        self.read_last_step()
        self.result["signals"] = self.log.as_list()
        self.timings["total"] = round(time.monotonic() - self.started, 3)
        self.end(STOPPED, msg)
        self.module.exit_json(msg=msg, **self.result)


def describe_holder(holder: dict) -> str:
    if not holder:
        return "holder unknown"
    return "PID %s, run %s, started %s" % (holder.get("pid", "?"), holder.get("run_id") or "-",
                                           holder.get("started_at", "?"))


def holder_progress(holder: dict) -> str:
    """The holder's own last progress line, if it writes one."""
    path = holder.get("progress_file")
    data = read_json(path) if path else None
    return "it reports: %s" % data["line"] if data and data.get("line") else "it reports no progress"


def argument_spec() -> dict:
    return dict(
        pidfile=dict(type="path"),
        unit=dict(type="str"),
        cmdline_match=dict(type="list", elements="str"),
        match_env=dict(type="list", elements="str", default=[]),
        max_roots=dict(type="int", default=1),
        checkpoint=dict(
            type="dict",
            options=dict(
                request=dict(type="str", choices=["signal", "file", "none"], default="signal"),
                signal=dict(
                    type="str",
                    choices=["SIGUSR1", "SIGUSR2", "SIGHUP", "SIGINT", "SIGTERM", "SIGQUIT", "SIGALRM", "SIGWINCH"],
                    default="SIGUSR1",
                ),
                signal_targets=dict(type="str", choices=["catching", "all", "roots"], default="catching"),
                trigger_file=dict(type="path"),
                path=dict(type="path"),
                glob=dict(type="str", default="*"),
                marker=dict(type="str"),
                settle_seconds=dict(type="float", default=30, aliases=["stable_seconds"]),
                step_regex=dict(type="str", default=r"(\d+)(?!.*\d)"),
                timeout=dict(type="float", default=600),
            ),
            required_if=[("request", "signal", ["path"]), ("request", "file", ["path", "trigger_file"])],
        ),
        force=dict(type="bool", default=False),
        grace_period=dict(type="float", default=60),
        kill_timeout=dict(type="float", default=30),
        poll_interval=dict(type="float", default=0.5),
        state_dir=dict(type="path"),
        heartbeat_file=dict(type="path"),
        heartbeat_timeout=dict(type="float", default=60),
        progress_file=dict(type="path"),
        run_id=dict(type="str", default=""),
        log_file=dict(type="path"),
        log_step_regex=dict(type="str", default=r"\bstep=(\d+)"),
        log_tail_bytes=dict(type="int", default=65536),
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec(),
        required_one_of=[("pidfile", "unit", "cmdline_match")],
        mutually_exclusive=[("pidfile", "unit"), ("unit", "cmdline_match")],
        supports_check_mode=True,
    )
    for name in ("grace_period", "kill_timeout", "poll_interval", "heartbeat_timeout"):
        if module.params[name] < 0:
            module.fail_json(msg="%s must be zero or more seconds, got %s." % (name, module.params[name]))
    settle = (module.params["checkpoint"] or {}).get("settle_seconds")
    if settle is not None and settle < 0:
        module.fail_json(msg="checkpoint.settle_seconds must be zero or more seconds, got %s." % settle)
    if module.params["max_roots"] < 1:
        module.fail_json(msg="max_roots must be at least 1, got %d." % module.params["max_roots"])
    TrainingStop(module).run()


if __name__ == "__main__":
    main()
