"""How a run ended, in one line (pivot.ops.run_outcome): what the server ended on, and what a forced stop lost, so a run
that stopped the training without a new checkpoint never reads as a plain OK."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.pivot.ops.plugins.filter.run_outcome import run_outcome

LOST = {"reason": "No new complete checkpoint appeared within 900s.", "last_checkpoint": "/data/ckpt/step_000004000",
        "last_checkpoint_step": 4000, "last_logged_step": 5381, "steps_lost": 1381}


def stop(work_lost: dict | None = None, status: str = "ok") -> dict:
    return {"phase": "stop_training", "host": "ct200", "status": status,
            "findings": {"result": "Stopped 10 process(es).", "work_lost": work_lost}}


def switch(status: str = "ok", **findings: object) -> dict:
    return {"phase": "sglang_release", "host": "pro6000", "status": status,
            "findings": {"release": "ddtree-d16-b64-k8", **findings}}


def test_a_switch_after_a_checkpointed_stop_is_ok_and_says_what_serves() -> None:
    outcome = run_outcome([stop(), switch(switched=True)])
    assert outcome == {"status": "ok", "result": "OK: switched to ddtree-d16-b64-k8", "work_lost": ""}
    assert run_outcome([switch(switched=False)])["result"] == "OK: ddtree-d16-b64-k8 was already serving"


def test_a_forced_stop_puts_the_steps_lost_in_the_result() -> None:
    outcome = run_outcome([stop(LOST), switch(switched=True)])
    lost = ("1381 steps of training lost by a forced stop on ct200: resume from /data/ckpt/step_000004000 (step 4000); "
            "the log had reached step 5381")
    assert outcome["status"] == "ok" and outcome["work_lost"] == lost
    assert outcome["result"] == f"OK: switched to ddtree-d16-b64-k8; {lost}"


def test_a_forced_stop_with_no_checkpoint_and_no_step_count_says_so() -> None:
    lost = {**LOST, "last_checkpoint": None, "last_checkpoint_step": None, "steps_lost": None}
    outcome = run_outcome([stop(lost)])
    assert outcome["work_lost"] == ("training work lost (steps unknown) by a forced stop on ct200: no checkpoint to "
                                    "resume from; the log had reached step 5381")
    assert outcome["result"] == "OK: " + outcome["work_lost"]


def test_step_zero_is_a_step() -> None:
    lost = {**LOST, "last_checkpoint": "/c/step_0", "last_checkpoint_step": 0, "last_logged_step": 12, "steps_lost": 12}
    assert "12 steps of training lost" in run_outcome([stop(lost)])["work_lost"]
    assert "(step 0)" in run_outcome([stop(lost)])["work_lost"]


def test_a_rollback_that_worked_and_one_that_left_the_server_down_read_differently() -> None:
    rolled = run_outcome([stop(LOST), switch("failed", failure="x", rolled_back_to="nextn-baseline")])
    assert rolled["status"] == "failed"
    assert rolled["result"].startswith("FAILED: ddtree-d16-b64-k8 failed; rolled back to nextn-baseline, which "
                                       "serves again; 1381 steps of training lost by a forced stop on ct200")
    command = "ansible-playbook -i /srv/pivot/inventory/production playbooks/rollback_nextn.yml"
    down = run_outcome([switch("failed", failure="x", rollback_to="nextn-baseline", rollback_failure="y",
                               server_down=True, rollback_command=command)])
    assert down["result"] == ("FAILED: ddtree-d16-b64-k8 failed and the rollback to nextn-baseline failed too: the "
                              f"server on pro6000 is DOWN (fix the cause, then run {command})")
    assert "serves again" not in down["result"]


def test_a_release_that_serves_without_its_quality_gate_says_so() -> None:
    note = ("not compared: no baseline answers were recorded (the baseline was not serving when the release was "
            "prepared)")
    outcome = run_outcome([stop(LOST), switch(switched=True, quality_note=note)])
    assert outcome["result"].startswith(f"OK: switched to ddtree-d16-b64-k8; the quality gate did not run: {note}; "
                                        "1381 steps of training lost")
    assert run_outcome([switch(switched=True, quality_note="")])["result"] == "OK: switched to ddtree-d16-b64-k8"
    rolled = run_outcome([switch("failed", failure="x", rolled_back_to="nextn-baseline", quality_note=note)])
    assert "quality gate" not in rolled["result"]


def test_a_failure_elsewhere_names_the_phase_and_host() -> None:
    outcome = run_outcome([{"phase": "preflight", "host": "ct200", "status": "ok", "findings": {}},
                           {"phase": "stop_training", "host": "ct200", "status": "failed", "findings": {}}])
    assert outcome == {"status": "failed", "result": "FAILED: stop_training failed on ct200", "work_lost": ""}


def test_check_mode_says_what_it_would_do_and_a_run_without_a_switch_is_plain() -> None:
    assert run_outcome([switch("checked", switched=True)], check_mode=True)["result"] == (
        "OK (check mode): would switch to ddtree-d16-b64-k8")
    resume = {"phase": "resume_training", "host": "ct200", "status": "ok", "findings": {}}
    assert run_outcome([resume])["result"] == "OK"
    rollback = {"phase": "sglang_release_rollback", "host": "pro6000", "status": "ok",
                "findings": {"release": "nextn-baseline", "switched": True}}
    assert run_outcome([rollback])["result"] == "OK: switched to nextn-baseline"


def test_the_input_must_be_phase_records() -> None:
    with pytest.raises(AnsibleFilterError, match="list of phase records"):
        run_outcome({"phase": "x"})


# --- the closing judgement: what the hosts show, not the absence of a recorded failure ------------------------------

def seen(release: str = "ddtree-d16-b64-k8", healthy: bool = True, **more: object) -> dict:
    return {"reachable": True, "active_state": "active" if healthy else "inactive", "release": release,
            "healthy": healthy, "algorithm": "DDTREE", **more}


def test_a_report_written_during_the_run_never_reads_ok() -> None:
    """What a kill -9 after the NEXTN stop leaves behind."""
    outcome = run_outcome([stop(), {"phase": "gpu_release", "host": "ct200", "status": "ok", "findings": {}}],
                          finished=False)
    assert outcome["status"] == "running"
    assert outcome["result"].startswith("RUNNING: this run has not finished; the last phase recorded is gpu_release "
                                        "on ct200 (ok). If its ansible-playbook is no longer running, the run was "
                                        "interrupted: ansible-playbook playbooks/check_hosts.yml shows what serves")
    assert "OK" not in outcome["result"]
    assert run_outcome([stop(LOST)], finished=False)["result"].count("1381 steps of training lost") == 1
    # a failed phase ends the run: its report is final at once
    assert run_outcome([stop(status="failed")], finished=False)["status"] == "failed"


def test_a_switch_the_host_confirms_is_ok() -> None:
    outcome = run_outcome([stop(), switch(switched=True)], served={"pro6000": seen()}, switch_hosts=["pro6000"])
    assert outcome == {"status": "ok", "result": "OK: switched to ddtree-d16-b64-k8", "work_lost": ""}


def test_a_lost_serving_host_makes_the_run_incomplete_with_what_to_run() -> None:
    """The serving host went away after the NEXTN stop: no switch record, and the closing check cannot reach it."""
    outcome = run_outcome([stop()], served={"pro6000": {"reachable": False, "error": "ssh: connect timed out"}},
                          switch_hosts=["pro6000"])
    assert outcome["status"] == "incomplete"
    assert outcome["result"] == ("INCOMPLETE: no switch was recorded on pro6000 (the host was lost or the run stopped "
                                 "before it); what pro6000 serves could not be checked (ssh: connect timed out)")
    back = run_outcome([stop()], served={"pro6000": seen(release="nextn-baseline", algorithm="EAGLE")},
                       switch_hosts=["pro6000"])
    assert back["status"] == "incomplete" and back["result"].endswith(
        "before it); pro6000 serves nextn-baseline (EAGLE, healthy)")


def test_a_host_back_with_its_server_down_fails_the_run_and_names_the_rollback() -> None:
    down = seen(release="nextn-baseline", healthy=False, rollback_command="ansible-playbook -i inv rollback.yml")
    outcome = run_outcome([stop()], served={"pro6000": down}, switch_hosts=["pro6000"])
    assert outcome["status"] == "failed"
    assert ("the server on pro6000 is DOWN (unit inactive, current -> nextn-baseline): run ansible-playbook -i inv "
            "rollback.yml") in outcome["result"]
    recorded_ok = run_outcome([switch(switched=True)], served={"pro6000": down}, switch_hosts=["pro6000"])
    assert recorded_ok["status"] == "failed"
    assert recorded_ok["result"].startswith("FAILED: switched to ddtree-d16-b64-k8; the server on pro6000 is DOWN")


def test_another_release_than_recorded_fails_the_run() -> None:
    outcome = run_outcome([switch(switched=True)], served={"pro6000": seen(release="nextn-baseline")})
    assert outcome["status"] == "failed"
    assert outcome["result"] == ("FAILED: switched to ddtree-d16-b64-k8; pro6000 serves nextn-baseline, not "
                                 "ddtree-d16-b64-k8")
    rolled = run_outcome([switch("failed", failure="x", rolled_back_to="nextn-baseline")],
                         served={"pro6000": seen(release="nextn-baseline")})
    assert rolled["result"] == "FAILED: ddtree-d16-b64-k8 failed; rolled back to nextn-baseline, which serves again"


def test_a_recorded_down_server_that_the_check_finds_down_is_said_once() -> None:
    down = run_outcome([switch("failed", failure="x", rollback_to="nextn-baseline", rollback_failure="y",
                               server_down=True)], served={"pro6000": seen(release="nextn-baseline", healthy=False)})
    assert down["result"].count("DOWN") == 1


def test_check_mode_expects_nothing_of_a_switch_it_only_previewed() -> None:
    outcome = run_outcome([switch("checked", switched=True)], check_mode=True,
                          served={"pro6000": seen(release="nextn-baseline")}, switch_hosts=["pro6000"])
    assert outcome["status"] == "ok" and outcome["result"] == "OK (check mode): would switch to ddtree-d16-b64-k8"


def test_served_must_be_a_mapping() -> None:
    with pytest.raises(AnsibleFilterError, match="served must map"):
        run_outcome([], served=["pro6000"])
