"""Bad inputs stop pivot.yml in phase 0 (validation on the controller), phase 1 (preflight on the hosts) or phase 3
(the release validated with its own venv's SGLang), with a message naming the input, while the training job keeps
running and the baseline keeps serving, untouched."""

from __future__ import annotations

import json
from collections.abc import Callable

import labctl
import pivotlab
import pytest
import stopwatch
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_up")]
CHECKPOINT_DIR = "/data/dflash/checkpoints"

PHASE0_CASES = {
    # -e values arrive as strings, as a user types them.
    # The plugin's own rule decides, in its own words (draft length 1 used to pass phase 0 and fail at start).
    "draft-length-1": (["pivot_ddtree_draft_tokens=1"],
                       ["The DDTree plugin would refuse pivot_ddtree_draft_tokens=1",
                        "must be in 2..16 for DDTREE, got 1"]),
    "draft-length-17": (["pivot_ddtree_draft_tokens=17"],
                        ["The DDTree plugin would refuse pivot_ddtree_draft_tokens=17", "got 17"]),
    "budget-0": (["pivot_ddtree_budget=0"], ["The DDTree plugin would refuse", "pivot_ddtree_budget=0",
                                             "DDTREE_BUDGET must be a positive integer, got 0"]),
    # The lab's flags are production's (mamba-radix-cache-strategy extra_buffer, SGLang's default track interval 256):
    # the plugin would refuse a verify window of 257 at start, so phase 0 does, naming the setting that serves it.
    "budget-256-mamba": (["pivot_ddtree_budget=256"],
                         ["The DDTree plugin would refuse pivot_ddtree_budget=256 with pivot_serving_common_args",
                          "mamba_track_interval 256 is below the verify width 257",
                          "pass --mamba-track-interval 512"]),
    # Two bad tree settings at once: both are named.
    "draft-abc-budget-0": (["pivot_ddtree_draft_tokens=abc", "pivot_ddtree_budget=0"],
                           ["--speculative-num-draft-tokens must be an integer, got 'abc'",
                            "DDTREE_BUDGET must be a positive integer, got 0"]),
    "unknown-host": (["pivot_serving_hosts=nohost"],
                     ["'nohost' matches []", "exactly one training host and one serving host"]),
}


@pytest.mark.parametrize("case", PHASE0_CASES, ids=list(PHASE0_CASES))
def test_bad_input_fails_in_phase_0_and_touches_nothing(
    case: str, training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    extra_vars, expected = PHASE0_CASES[case]
    job = training()

    run = pivotlab.run_playbook("pivot.yml", *extra_vars)

    assert run.rc != 0, run.summary()
    for fragment in expected:
        assert fragment in run.message, run.summary()
    # Phase 0 runs on the controller only: no host was contacted, no lock taken, no phase started, no report.
    assert set(run.result["stats"]) == {"localhost"}, run.summary()
    assert run.report is None
    after_training, after_serving = pivotlab.training_state(), pivotlab.serving_state()
    pivotlab.assert_training_untouched(job, after_training)
    pivotlab.assert_serving_untouched(baseline, after_serving)
    assert after_training.lock is None and after_serving.lock is None


def assert_container_refusal_touched_nothing(run: pivotlab.PlaybookRun, job: pivotlab.Training,
                                             baseline: pivotlab.Serving) -> None:
    """A training container named as not running: no traceback of the connection, no phase, and the job, the baseline
    and both locks as they were (an earlier failed run may have left a stale lock)."""
    assert "Failed to create temporary directory" not in run.stderr + json.dumps(run.result)
    assert run.report is None, "refused before any phase"
    after_training, after_serving = pivotlab.training_state(), pivotlab.serving_state()
    pivotlab.assert_training_untouched(job, after_training)
    pivotlab.assert_serving_untouched(baseline, after_serving)
    assert (after_training.lock, after_serving.lock) == (job.lock, baseline.lock), "no lock was taken or released"


def test_a_training_container_that_does_not_run_is_named_before_anything_is_touched(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    """ct200 is reached through its Proxmox node: a container that does not run (here a container id the node does
    not have) used to end in "Failed to create temporary directory" and a traceback; the node is asked first."""
    job = training()

    run = pivotlab.run_playbook("pivot.yml", "proxmox_vmid=999")

    assert run.rc != 0, run.summary()
    assert "ct200 is Proxmox container 999 on the node" in run.message, run.summary()
    assert "and it does not run: `pct status 999` there says" in run.message, run.summary()
    assert "'nodes/pve/lxc/999.conf' does not exist" in run.message, run.summary()
    assert "Start it (`pct start 999` on the node) or correct proxmox_vmid" in run.message, run.summary()
    assert_container_refusal_touched_nothing(run, job, baseline)


@pytest.mark.parametrize(("playbook", "limit"), [
    ("pivot.yml", "pro6000"), ("pivot.yml", "localhost,pro6000"), ("rollback_nextn.yml", "pro6000"),
])
def test_limit_is_refused_before_anything_is_touched(
    playbook: str, limit: str, training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    """Without localhost, phase 0 (run name, input checks) would be skipped and the next play fail on
    hostvars['localhost']; the playbooks choose hosts with pivot_*_hosts instead."""
    job = training()

    run = pivotlab.run_playbook(playbook, limit=limit)

    assert run.rc != 0, run.summary()
    assert f"--limit is not supported (given: {limit})" in run.message, run.summary()
    assert "-e pivot_training_hosts=HOST -e pivot_serving_hosts=HOST" in run.message, run.summary()
    assert run.report is None
    after_training, after_serving = pivotlab.training_state(), pivotlab.serving_state()
    pivotlab.assert_training_untouched(job, after_training)
    pivotlab.assert_serving_untouched(baseline, after_serving)
    assert after_training.lock is None and after_serving.lock is None


# How long ct200 takes no connection from its node (its sshd stopped, every session ended): the lab's `pct` stand-in
# then reports the container as stopped, and `pct exec` fails with 255, as on a node whose container is down.
STOPPED_S = 15


def test_a_stopped_training_container_is_named_before_anything_is_touched(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    """The container of the inventory exists but does not run (the node says "status: stopped"): named from the node
    before any phase, not "Failed to create temporary directory"."""
    job = training()
    down = labctl.pct_exec(["sh", "-c", labctl.sshd_outage(STOPPED_S)])
    assert down.rc == 0, down.stderr
    try:
        stopwatch.wait_until(lambda: "status: stopped" in labctl.ssh("pve", "/usr/sbin/pct status 200").stdout, 20,
                             "ct200 reported stopped by its node")
        run = pivotlab.run_playbook("pivot.yml")
    finally:
        stopwatch.wait_until(lambda: labctl.pct_exec(["true"]).rc == 0, STOPPED_S + 60, "ct200 running again")

    assert run.rc != 0, run.summary()
    assert "ct200 is Proxmox container 200 on the node" in run.message, run.summary()
    assert 'and it does not run: `pct status 200` there says "status: stopped"' in run.message, run.summary()
    assert "Start it (`pct start 200` on the node)" in run.message, run.summary()
    assert_container_refusal_touched_nothing(run, job, baseline)


def test_missing_drafter_fails_in_preflight_and_touches_nothing(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    job = training()

    run = pivotlab.run_playbook("pivot.yml", "pivot_serving_drafter_model=/root/models/nope")

    assert run.rc != 0, run.summary()
    assert "Preflight failed on pro6000, nothing was changed" in run.message, run.summary()
    assert "cannot read /root/models/nope/config.json" in run.message, run.summary()
    assert run.report is not None and run.report["status"] == "failed"
    assert set(run.phase_names()) == {"preflight"}, "nothing after preflight may run"
    failed = run.phase("preflight", "pro6000")
    assert failed["status"] == "failed"
    drafter_check = next(c for c in failed["findings"]["checks"] if c["name"] == "drafter_config")
    assert drafter_check["ok"] is False and "/root/models/nope" in drafter_check["detail"]
    # The training side's own checks passed: it found the job it would have stopped.
    training_checks = {c["name"]: c for c in run.phase("preflight", "ct200")["findings"]["checks"]}
    assert training_checks["training_job"]["ok"] is True, training_checks
    assert "found the job" in training_checks["training_job"]["detail"]
    for host in ("ct200", "pro6000"):
        assert run.changed(host) == 0, f"{host}: {[task for task, _unused in run.changed_results(host)]}"

    after_training, after_serving = pivotlab.training_state(), pivotlab.serving_state()
    pivotlab.assert_training_untouched(job, after_training)
    pivotlab.assert_serving_untouched(baseline, after_serving)
    # The run's lock (bookkeeping in /run) stays behind naming its dead ansible-playbook: the next run from this
    # controller takes it over (test_pivot_lock.py).
    for lock in (after_training.lock, after_serving.lock):
        assert lock is not None and lock["run_id"] == run.run_id


def test_a_trainer_without_a_handler_for_the_checkpoint_signal_is_refused_in_preflight(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    """A trainer that saves only on a trigger file, with the inventory's request by SIGUSR1: the stop would refuse
    (SIGUSR1 would kill it); preflight says so before the release venv is built, and touches nothing."""
    job = training("--checkpoint-on", "trigger")

    run = pivotlab.run_playbook("pivot.yml")

    assert run.rc != 0, run.summary()
    # the run's message names whichever host's failure came last; ct200's phase record says why
    assert run.phase("preflight", "ct200")["status"] == "failed", run.summary()
    assert set(run.phase_names()) == {"preflight"}, "nothing after preflight may run"
    training_checks = {c["name"]: c for c in run.phase("preflight", "ct200")["findings"]["checks"]}
    assert training_checks["training_job"]["ok"] is False, training_checks
    assert "none of its processes handles SIGUSR1" in training_checks["training_job"]["detail"]
    for host in ("ct200", "pro6000"):
        assert run.changed(host) == 0, f"{host}: {[task for task, _unused in run.changed_results(host)]}"
    pivotlab.assert_training_untouched(job, pivotlab.training_state())
    pivotlab.assert_serving_untouched(baseline, pivotlab.serving_state())


def test_a_checkpoint_disk_without_room_for_the_next_checkpoint_is_refused_in_preflight(
    training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    """The checkpoint the stop asks for would not fit (here the newest checkpoint holds a sparse 8 TiB file: larger
    than the disk's free space, using none of it): preflight refuses before anything is signalled, naming the space."""
    training()
    oversized = f"{CHECKPOINT_DIR}/step_99999999"
    # a copy of the newest checkpoint (as many files as it: still a complete one without a marker) plus the big file
    script = (f'cd {CHECKPOINT_DIR} && newest=$(ls -d step_* 2>/dev/null | sort -V | tail -1) && '
              f'{{ if [ -z "$newest" ]; then mkdir {oversized}; else cp -a "$newest" {oversized}; fi; }} && '
              f'truncate -s 8T {oversized}/oversized.bin')
    made = labctl.pct_exec(["sh", "-c", script])
    assert made.rc == 0, made.stderr
    try:
        job = pivotlab.training_state()
        run = pivotlab.run_playbook("pivot.yml")

        assert run.rc != 0, run.summary()
        assert set(run.phase_names()) == {"preflight"}, "nothing after preflight may run"
        checks = {c["name"]: c for c in run.phase("preflight", "ct200")["findings"]["checks"]}
        detail = checks["checkpoint_space"]["detail"]
        assert checks["checkpoint_space"]["ok"] is False, checks
        assert f"the newest checkpoint ({oversized}) takes 8192.0 GiB: the checkpoint the stop asks for would not fit" \
            in detail, detail
        pivotlab.assert_training_untouched(job, pivotlab.training_state())
        pivotlab.assert_serving_untouched(baseline, pivotlab.serving_state())
    finally:
        labctl.pct_exec(["rm", "-rf", oversized])


SERVING_VARS = pivotlab.REPO / "inventory" / "production" / "group_vars" / "serving.yml"
RELEASE_REFUSALS = {
    # SGLang's own parser, in the release venv, refuses a flag it does not know (argparse, exit 2).
    "unknown-flag": ({"no-such-flag": 1}, ["--no-such-flag"]),
    # The plugin's validate_server_args, run through SGLang's own hook, refuses a backend it cannot verify trees on.
    "plugin-refuses-fa3": ({"attention-backend": "fa3"}, ["--attention-backend fa3 cannot verify DDTree trees"]),
}


@pytest.mark.parametrize("case", RELEASE_REFUSALS, ids=list(RELEASE_REFUSALS))
def test_a_release_its_own_sglang_refuses_fails_before_the_stop_and_touches_nothing(
    case: str, training: Callable[..., pivotlab.Training], baseline: pivotlab.Serving
) -> None:
    """Issue 13: every check that can run while training still runs does, so a flag the release cannot start with
    costs nothing: the pivot ends in phase 3, before the training stop."""
    flags, expected = RELEASE_REFUSALS[case]
    common = yaml.safe_load(SERVING_VARS.read_text())["pivot_serving_common_args"]
    job = training()

    run = pivotlab.run_playbook("pivot.yml", json.dumps({"pivot_serving_common_args": {**common, **flags}}))

    assert run.rc != 0, run.summary()
    for fragment in expected:
        assert fragment in run.message, run.summary()
    assert run.report is not None and run.report["status"] == "failed"
    phases = run.phase_names()
    assert "sglang_release_prepare" in phases and not {"stop_training", "gpu_release", "sglang_release"} & set(
        phases), phases
    assert run.phase("sglang_release_prepare", "pro6000")["status"] == "failed"
    after_training, after_serving = pivotlab.training_state(), pivotlab.serving_state()
    pivotlab.assert_training_untouched(job, after_training)
    pivotlab.assert_serving_untouched(baseline, after_serving, release_prepared=True)
