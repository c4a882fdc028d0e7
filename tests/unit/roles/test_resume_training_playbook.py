"""playbooks/resume_training.yml end to end on this machine, without the lab: the training host is localhost (local
connection), the job is the lab's training simulator copied to a temporary directory (found by its full path, so no
other trainer on this machine is ever taken for it), and nvidia-smi is the lab's double with a private GPU registry.
The controller's record of the last stop is written the way the stop_training role writes it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from conftest import run_playbook_json

REPO = Path(__file__).resolve().parents[3]
FILES = REPO / "lab" / "files"
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


class Controller:
    """A training "host" in a temporary directory and the inventory that names it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.trainsim = root / "trainsim"
        shutil.copytree(FILES / "trainsim", self.trainsim)
        self.trainer = str(self.trainsim / "train_dflash_pipeline.py")
        self.checkpoints = root / "checkpoints"
        self.log = root / "train.log"
        self.state = root / "state"
        self.artifacts = root / "artifacts"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        (bin_dir / "python3").symlink_to(PYTHON)
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f'#!/bin/sh\nexec {PYTHON} {FILES / "nvidia-smi"} "$@"\n')
        smi.chmod(0o755)
        shutil.copy(FILES / "gpus-h200x8.json", root / "gpus.json")
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                    "FAKE_NVIDIA_CONFIG": str(root / "gpus.json"), "FAKE_NVIDIA_STATE_DIR": str(root / "fake-nvidia"),
                    "PIVOT_LAB_LIB": str(FILES)}
        self.write_inventory()

    def trainer_flags(self) -> list[str]:
        return ["--checkpoint-dir", str(self.checkpoints), "--log-file", str(self.log), "--step-seconds", "0.05",
                "--checkpoint-seconds", "0", "--save-every", "0", "--gpus", "0,1", "--gpu-mib", "4096"]

    def write_inventory(self, host_vars: dict | None = None, **resume: object) -> None:
        host = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "pivot_training_job": {"cmdline_match": [self.trainer]},
            "pivot_training_checkpoint": {"path": str(self.checkpoints), "glob": "step_*", "marker": "COMPLETE"},
            "pivot_training_log_file": str(self.log),
            "pivot_training_gpu_count": 2,
            "pivot_state_dir": str(self.state),
            "pivot_training_resume": {
                "command": [str(self.trainsim / "run.sh"), *self.trainer_flags(), "--resume-from", "{checkpoint}"],
                "chdir": str(self.root), "output_file": str(self.root / "nohup.out"), "gpus": [0, 1],
                "expect_processes": 1, "timeout": 60, "gpu_free_timeout": 2, **resume,
            },
            # this machine's own /run and /var/lib are not the test's
            "run_lock_path": str(self.root / "run" / "pivot.lock"),
            "resume_training_state_dir": str(self.root / "host-state"),
            "resume_training_poll_delay": 1,
            **(host_vars or {}),
        }
        # as inventory/*/group_vars/all.yml: the controller writes the report
        inventory = {"all": {"vars": {"pivot_report_dir": str(self.artifacts)},
                             "children": {"training": {"hosts": {"ct200": host}}}}}
        (self.root / "hosts.yml").write_text(yaml.safe_dump(inventory))

    def train(self, *flags: str) -> None:
        """Runs the trainer to its end, leaving its final checkpoint."""
        subprocess.run([PYTHON, self.trainer, *self.trainer_flags(), "--gpu-mib", "0", *flags], env=self.env,
                       check=True, capture_output=True, timeout=60)

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:09d}"

    def started_as(self) -> str:
        """The command line of the trainer as run.sh starts it with the flags of trainer_flags."""
        return " ".join(["python3", "-u", self.trainer, *self.trainer_flags()])

    def record_stop(self, step: int | None, previous: int | None = None, forced: bool = False,
                    cmdline: str | None = None) -> None:
        """state/ct200/last-stop.json as the stop_training role writes it, for a job started as ``cmdline`` (by
        default as the resume command starts it, without the checkpoint)."""
        def entry(value: int | None) -> dict:
            if value is None:
                return {"path": None, "step": None}
            path = self.checkpoint(value)
            return {"path": str(path), "step": value, "size_bytes": sum(f.stat().st_size for f in path.iterdir())}

        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        record = {"outcome": "stopped", "run_id": "20261201T100000Z-4242", "started_at": now, "stopped_at": now,
                  "msg": "Stopped", "checkpoint": entry(step), "previous_checkpoint": entry(previous),
                  "last_logged_step": step or previous, "forced": forced, "work_lost": None, "host": "ct200",
                  "job": {"selector": {"cmdline_match": [self.trainer]},
                          "processes": [{"pid": 4242, "ppid": 4240, "sid": 4240, "pgid": 4240, "matched_by": "selected",
                                         "cmdline": cmdline or self.started_as()},
                                        {"pid": 4243, "ppid": 4242, "sid": 4240, "pgid": 4240,
                                         "matched_by": "descendant", "cmdline": "pt_data_worker"}]}}
        (self.state / "ct200").mkdir(parents=True, exist_ok=True)
        (self.state / "ct200" / "last-stop.json").write_text(json.dumps(record, indent=2) + "\n")

    def run(self, *args: str) -> dict:
        returncode, result = run_playbook_json(str(self.root / "hosts.yml"), "playbooks/resume_training.yml", *args,
                                               env=self.env)
        result["rc"] = returncode
        return result

    def job_pids(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if self.trainer.encode() in argv and state not in ("Z", "X"):
                found.append(int(entry.name))
        return sorted(found)

    def report(self, result: dict) -> dict:
        reports = sorted(self.artifacts.glob("resume_training-2*.json"))
        assert reports, f"no report in {self.artifacts}: {failures(result)}"
        return json.loads(reports[-1].read_text())

    def cleanup(self) -> None:
        for pid in self.job_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def failures(result: dict) -> list[str]:
    """The failure messages, a looped task's per item (its own message is only "One or more items failed")."""
    failed = [res for play in result.get("plays", []) for task in play["tasks"] for res in task["hosts"].values()
              if res.get("failed") and not res.get("ignore_errors")]
    items = [[item for item in res.get("results", []) if item.get("failed") or item.get("evaluated_to") is False]
             or [res] for res in failed]
    return [" ".join(str(item.get("msg", "")).split()) for found in items for item in found]


def results(result: dict, task_name: str) -> list[dict]:
    return [res for play in result.get("plays", []) for task in play["tasks"]
            if task["task"]["name"].split(" : ")[-1] == task_name for res in task["hosts"].values()]


@pytest.fixture
def controller(tmp_path):
    world = Controller(tmp_path)
    yield world
    world.cleanup()


def test_preview_then_resume_then_a_second_run_that_changes_nothing(controller):
    controller.train("--total-steps", "40", "--save-every", "20")
    controller.record_stop(40, previous=20)

    preview = controller.run("--check", "--diff")
    assert preview["rc"] == 0, failures(preview)
    assert preview["stats"]["ct200"]["changed"] >= 1
    started = results(preview, "Start the job from the checkpoint on the training host")[0]
    assert started["msg"].startswith(f"Would start the training job from checkpoint {controller.checkpoint(40)} "
                                     "(step 40): setsid nohup ")
    assert controller.job_pids() == []
    assert controller.report(preview)["check_mode"] is True

    run = controller.run()
    assert run["rc"] == 0, failures(run)
    pids = controller.job_pids()
    assert pids
    log = controller.log.read_text()
    assert f"Resuming from checkpoint {controller.checkpoint(40)} (global step 40)" in log
    assert "step=41 " in log
    phase = controller.report(run)["phases"][-1]
    assert (phase["phase"], phase["status"], phase["host"]) == ("resume_training", "ok", "ct200")
    findings = phase["findings"]
    assert findings["checkpoint"] == str(controller.checkpoint(40)) and findings["first_step"] == 41
    assert findings["started"] is True
    assert findings["resumed_from"].startswith("confirmed by the stop of run 20261201T100000Z-4242")
    assert findings["gpus_mib"] and min(findings["gpus_mib"]) >= 4096
    assert findings["stopped_job"] == [controller.started_as()]
    assert findings["command_difference"] is None, "the job runs as the stopped one had been started"
    last = json.loads((controller.state / "ct200" / "last-resume.json").read_text())
    assert (last["outcome"], last["checkpoint"]["step"], last["first_step"]) == ("training", 40, 41)
    markdown = sorted(controller.artifacts.glob("resume_training-2*.md"))[-1].read_text()
    assert "| training resumed |" in markdown
    assert "command line vs the stopped job's" not in markdown

    again = controller.run()
    assert again["rc"] == 0, failures(again)
    assert again["stats"]["ct200"]["changed"] == 0
    assert controller.job_pids() == pids
    assert len((controller.state / "ct200" / "resumes.jsonl").read_text().splitlines()) == 1
    assert "is running: " in controller.report(again)["phases"][-1]["findings"]["result"]


def test_without_a_record_nothing_is_started(controller):
    controller.train("--total-steps", "20")
    result = controller.run()
    assert result["rc"] != 0
    assert any("There is no record of a training stop on ct200" in msg for msg in failures(result))
    assert controller.job_pids() == []
    assert controller.report(result)["phases"][-1]["status"] == "failed"


def ran_tasks(result: dict) -> list[str]:
    return [task["task"]["name"].split(" : ")[-1] for play in result.get("plays", []) for task in play["tasks"]
            if any(not res.get("skipped") for res in task["hosts"].values())]


@pytest.mark.parametrize(("inventory", "said"), [
    ({"command": ["/root/run.sh", "<CONFIRM: the trainer's resume option>", "{checkpoint}"]},
     "pivot_training_resume.command still holds the placeholder <CONFIRM: the trainer's resume option>: replace it "
     "with how the trainer takes the checkpoint to resume from"),
    ({"host_vars": {"pivot_training_log_file": "<TRAINING_LOG_FILE>"}},
     "pivot_training_log_file still holds the placeholder <TRAINING_LOG_FILE>: replace it with an absolute path on "
     "the training host"),
    ({"host_vars": {"pivot_training_log_file": "train.log"}, "chdir": "trainsim"},
     "pivot_training_log_file must be an absolute path on the training host; got train.log; "
     "pivot_training_resume.chdir must be an absolute path on the training host; got trainsim"),
])
def test_bad_inputs_are_refused_in_phase_0_before_anything_is_touched(controller, inventory, said):
    controller.train("--total-steps", "20")
    controller.record_stop(20)
    controller.write_inventory(**inventory)
    started = time.monotonic()
    result = controller.run()
    assert result["rc"] != 0
    [message] = failures(result)
    assert message.startswith(f"Invalid inputs for resuming training on ct200, nothing was touched: {said}")
    assert message.endswith("Fix them in the inventory (inventory/production/group_vars/training.yml) or with -e, then "
                            "run again.")
    assert ran_tasks(result)[-1] == "Check the resume's variables"
    assert [play["play"]["name"] for play in result["plays"]] == ["Phase 0: validate inputs"]
    assert time.monotonic() - started < 60  # ansible-playbook's own start, not a wait
    assert not (controller.root / "run").exists(), "no lock was taken"
    assert not controller.artifacts.exists() and not (controller.root / "host-state").exists()
    assert controller.job_pids() == []


def test_rollback_with_the_resume_refuses_a_placeholder_before_it_touches_the_server(controller):
    controller.write_inventory(command=["/root/run.sh", "<CONFIRM: the trainer's resume option>", "{checkpoint}"])
    inventory = yaml.safe_load((controller.root / "hosts.yml").read_text())
    # a serving host no task may reach: phase 0 must refuse before any play runs on it
    inventory["all"]["children"]["serving"] = {"hosts": {"pro6000": {"ansible_host": "192.0.2.1"}}}
    (controller.root / "hosts.yml").write_text(yaml.safe_dump(inventory))
    returncode, result = run_playbook_json(str(controller.root / "hosts.yml"), "playbooks/rollback_nextn.yml",
                                           "-e", "resume_training_after_rollback=true", env=controller.env)
    assert returncode != 0
    assert [play["play"]["name"] for play in result["plays"]] == ["Phase 0: name the run"]
    assert len(failures(result)) == 1
    assert failures(result)[0].startswith("Invalid inputs for resuming training on ct200, nothing was touched: "
                                          "pivot_training_resume.command still holds the placeholder <CONFIRM: ")
    assert ran_tasks(result)[-1] == "Check the resume's variables"


def test_after_a_forced_stop_it_resumes_from_the_checkpoint_before_it(controller):
    controller.train("--total-steps", "20")
    # a job that had been started on other GPUs than the resume command starts it on
    stopped = f"python3 -u {controller.trainer} --gpus 0,1,2,3"
    controller.record_stop(None, previous=20, forced=True, cmdline=stopped)
    result = controller.run("-e", f"pivot_resume_from={controller.checkpoint(20)}", "--check")
    assert result["rc"] == 0, failures(result)  # a checkpoint given explicitly needs no record
    result = controller.run()
    assert result["rc"] == 0, failures(result)
    said = results(result, "Say that a forced stop lost work")[0]["msg"]
    assert said.startswith(f"The last stop on ct200 was forced without a new checkpoint: resuming from "
                           f"{controller.checkpoint(20)} (step 20)")
    deadline = time.monotonic() + 10
    while "step=21 " not in controller.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"Resuming from checkpoint {controller.checkpoint(20)}" in controller.log.read_text()
    difference = controller.report(result)["phases"][-1]["findings"]["command_difference"]
    assert difference.startswith(f"The resumed job does not run the way the stopped one had been started: the stop "
                                 f"recorded {stopped}, the resumed job runs {controller.started_as()} --resume-from "
                                 f"{controller.checkpoint(20)} (compared word by word without what the resume command "
                                 "adds for the checkpoint: --resume-from {checkpoint}).")
    warned = [warning for res in results(result, "Read the resume's result") for warning in res.get("warnings", [])]
    assert any("does not run the way the stopped one had been started" in str(warning) for warning in warned), warned
    markdown = sorted(controller.artifacts.glob("resume_training-2*.md"))[-1].read_text()
    assert "| command line vs the stopped job's | **differs**: The resumed job does not run the way" in markdown


def test_the_role_alone_refuses_a_placeholder_with_the_same_rule(controller):
    """A caller without phase 0 (the role included directly) gets the same refusal before its first look at the
    host."""
    play = [{"name": "The role alone", "hosts": "ct200", "gather_facts": False, "tasks": [{
        "name": "Resume", "ansible.builtin.include_role": {"name": "pivot.ops.resume_training"},
        "vars": {"resume_training_job": {"cmdline_match": [controller.trainer]},
                 "resume_training_command": ["/root/run.sh", "--resume=<CONFIRM: option>{checkpoint}"],
                 "resume_training_log_file": str(controller.log)}}]}]
    playbook = controller.root / "role.yml"
    playbook.write_text(yaml.safe_dump(play))
    returncode, result = run_playbook_json(str(controller.root / "hosts.yml"), str(playbook), env=controller.env)
    assert returncode != 0
    [message] = failures(result)
    assert message.startswith("The resume command for ct200 still holds a placeholder: <CONFIRM: option> "
                              "(pivot_training_resume.command: /root/run.sh --resume=<CONFIRM: option>{checkpoint})")
    assert ran_tasks(result)[-1] == "Check the resume command holds no placeholder"
