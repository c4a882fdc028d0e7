"""The training simulator's --resume-from: it resumes from the checkpoint it is given, not the newest one, and
refuses one that is not complete (what Pivot's resume_training passes through the lab's resume command)."""

from __future__ import annotations

import json
import shutil

from lab_doubles_support import STEP_LINE


def test_resumes_from_the_named_checkpoint_even_when_a_newer_one_exists(trainsim):
    assert trainsim.start("--save-every", "5", "--total-steps", "11").wait(timeout=20) == 0  # 5, 10, 11
    older = trainsim.checkpoint_dir / "step_000000005"
    state = json.loads((older / "trainer_state.json").read_text())
    (older / "trainer_state.json").write_text(json.dumps({**state, "train_minutes": 2157.5}))
    trainsim.log_file.unlink()
    assert trainsim.start("--resume-from", str(older), "--total-steps", "7").wait(timeout=20) == 0
    lines = trainsim.log_lines()
    assert lines[0].endswith(f"Resuming from checkpoint {older} (global step 5)")
    assert trainsim.steps() == [6, 7]
    assert STEP_LINE.match(next(line for line in lines if "step=6" in line))["minutes"] == "2157"


def test_refuses_a_checkpoint_without_its_marker(trainsim):
    assert trainsim.start("--total-steps", "3").wait(timeout=20) == 0
    checkpoint = trainsim.checkpoint_dir / "step_000000003"
    (checkpoint / "COMPLETE").unlink()
    trainsim.log_file.unlink()
    assert trainsim.start("--resume-from", str(checkpoint)).wait(timeout=20) == 2
    assert f"error: cannot resume from {checkpoint}: it is not a complete checkpoint (no COMPLETE marker)" in (
        trainsim.stdout_file.read_text())
    assert trainsim.steps() == []


def test_refuses_a_checkpoint_that_is_gone(trainsim):
    assert trainsim.start("--total-steps", "2").wait(timeout=20) == 0
    checkpoint = trainsim.checkpoint_dir / "step_000000002"
    shutil.rmtree(checkpoint)
    assert trainsim.start("--resume-from", str(checkpoint)).wait(timeout=20) == 2
    assert f"cannot resume from {checkpoint}: it is not a complete checkpoint" in trainsim.stdout_file.read_text()


def test_without_a_marker_the_trainer_state_makes_it_complete(trainsim):
    assert trainsim.start("--no-marker", "--total-steps", "4").wait(timeout=20) == 0
    checkpoint = trainsim.checkpoint_dir / "step_000000004"
    trainsim.log_file.unlink()
    assert trainsim.start("--no-marker", "--resume-from", str(checkpoint), "--total-steps", "5").wait(timeout=20) == 0
    assert trainsim.steps() == [5]


def test_resume_from_and_start_step_exclude_each_other(trainsim):
    assert trainsim.start("--resume-from", "/nowhere", "--start-step", "3").wait(timeout=20) == 2
    assert "--resume-from and --start-step exclude each other" in trainsim.stdout_file.read_text()
