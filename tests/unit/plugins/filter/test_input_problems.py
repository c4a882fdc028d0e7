"""Phase 0's rules, as the pivot_inputs role asks them: the two hosts' variables in (the training host's alone for a
resume), one sentence per problem out."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.pivot.ops.plugins.filter.input_problems import input_problems
from ansible_collections.pivot.ops.plugins.filter.placeholders import placeholders
from ansible_collections.pivot.ops.plugins.filter.resume_input_problems import resume_input_problems
from conftest import REPO

GROUP_VARS = REPO + "/inventory/production/group_vars"


def production(name: str) -> dict[str, Any]:
    with open(f"{GROUP_VARS}/{name}.yml") as handle:
        return yaml.safe_load(handle)


def serving(**changes: Any) -> dict[str, Any]:
    return {**production("all"), **production("serving"), **changes}


def training(**changes: Any) -> dict[str, Any]:
    # The example leaves the trainer's log file for the user to fill in (a placeholder phase 0 refuses).
    return {**production("all"), **production("training"), "pivot_training_log_file": "/root/train.log", **changes}


def test_the_production_example_has_no_problem_once_its_placeholder_is_filled() -> None:
    assert input_problems(serving(), training()) == []
    shipped = {**production("all"), **production("training")}
    assert input_problems(serving(), shipped) == [
        "pivot_training_log_file still holds the placeholder <TRAINING_LOG_FILE>: replace it with an absolute path on "
        "the training host"]


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"pivot_ddtree_draft_tokens": "1"}, "would refuse pivot_ddtree_draft_tokens=1"),
    ({"pivot_ddtree_draft_tokens": 17}, "must be in 2..16 for DDTREE, got 17"),
    ({"pivot_ddtree_budget": "2048"}, "DDTREE_BUDGET must be at most 1024"),
    ({"pivot_ddtree_topk": "0"}, "DDTREE_TOPK must be a positive integer"),
    ({"pivot_ddtree_min_accept_length": "0"}, "pivot_ddtree_min_accept_length must be a number > 0; got 0"),
    ({"pivot_quality_min_agreement": "1.5"}, "pivot_quality_min_agreement must be a number from 0"),
    ({"pivot_serving_port": "70000"}, "pivot_serving_port must be a TCP port; got 70000"),
    ({"pivot_serving_health_timeout": "soon"}, "pivot_serving_health_timeout"),
    ({"pivot_serving_venv": "ml-env"}, "pivot_serving_venv must be an absolute path on the serving host; got ml-env"),
    ({"pivot_release_python": "python3.12"}, "pivot_release_python must be an absolute path"),
    ({"pivot_release_wheelhouse": ""}, "pivot_release_wheelhouse must name the release wheelhouse's directory"),
    ({"pivot_serving_common_args": {"config": "/etc/x.yaml"}}, "must not set config"),
])
def test_each_bad_serving_setting_is_named(changes: dict[str, Any], fragment: str) -> None:
    problems = input_problems(serving(**changes), training())
    assert len(problems) == 1 and fragment in problems[0], problems


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"pivot_training_job": {"max_roots": 1}}, "pivot_training_job needs one of cmdline_match, pidfile or unit"),
    ({"pivot_training_checkpoint": {"request": "signal", "path": "checkpoints"}},
     "pivot_training_checkpoint.path must be an absolute path on the training host; got checkpoints"),
    ({"pivot_training_log_file": "train.log"}, "pivot_training_log_file must be an absolute path"),
])
def test_each_bad_training_setting_is_named(changes: dict[str, Any], fragment: str) -> None:
    problems = input_problems(serving(), training(**changes))
    assert len(problems) == 1 and fragment in problems[0], problems


def test_a_budget_wider_than_the_mamba_track_interval_is_refused_with_the_setting_that_serves_it() -> None:
    """The production mamba flags (extra_buffer, SGLang's default interval 256) take budgets up to 255; a wider tree
    needs --mamba-track-interval, which the refusal names, and which then lets it through."""
    (problem,) = input_problems(serving(pivot_ddtree_budget=256), training())
    assert problem.startswith("The DDTree plugin would refuse pivot_ddtree_budget=256 with pivot_serving_common_args")
    assert "mamba_track_interval 256 is below the verify width 257" in problem
    assert "pass --mamba-track-interval 512" in problem and "a budget of at most 255" in problem
    flags = {**production("serving")["pivot_serving_common_args"], "mamba-track-interval": 1280}
    assert input_problems(serving(pivot_ddtree_budget="1024", pivot_serving_common_args=flags), training()) == []
    assert input_problems(serving(pivot_ddtree_budget=255), training()) == []
    no_buffer = {**flags, "mamba-radix-cache-strategy": "no_buffer"}
    del no_buffer["mamba-track-interval"]
    assert input_problems(serving(pivot_ddtree_budget=1024, pivot_serving_common_args=no_buffer), training()) == []


def test_two_bad_tree_settings_are_both_named() -> None:
    (problem,) = input_problems(serving(pivot_ddtree_draft_tokens="abc", pivot_ddtree_budget="0"), training())
    assert "--speculative-num-draft-tokens must be an integer, got 'abc'" in problem
    assert "DDTREE_BUDGET must be a positive integer, got 0" in problem


def production_host(group: str, host: str) -> dict[str, Any]:
    with open(f"{REPO}/inventory/production/hosts.yml") as handle:
        hosts = yaml.safe_load(handle)["all"]["children"][group]["hosts"]
    return {"inventory_hostname": host, **hosts[host]}


def test_a_placeholder_left_in_hosts_yml_is_named_before_any_host_is_reached() -> None:
    """The production example's addresses and key paths: without this, phase 1 ends in paramiko's traceback."""
    problems = input_problems({**serving(), **production_host("serving", "pro6000")},
                              {**training(), **production_host("training", "ct200")})
    assert ("pro6000's ansible_host still holds the placeholder <LLM_TWO_ADDRESS>: replace it in the inventory's "
            "hosts.yml") in problems
    assert "pro6000's ansible_ssh_private_key_file still holds the placeholder <PATH_TO_PRIVATE_KEY>" in " ".join(
        problems)
    assert "ct200's ansible_host still holds the placeholder <PROXMOX_NODE_ADDRESS>" in " ".join(problems)
    assert "ct200's ansible_private_key_file still holds the placeholder <PATH_TO_PRIVATE_KEY>" in " ".join(problems)
    assert len(problems) == 4, problems
    filled = {"ansible_host": "10.0.0.5", "ansible_ssh_private_key_file": "/root/.ssh/id_ed25519"}
    assert input_problems({**serving(), **production_host("serving", "pro6000"), **filled},
                          {**training(), "inventory_hostname": "ct200"}) == []
    assert resume_input_problems({**training(), **production_host("training", "ct200")})[:2] == [
        "ct200's ansible_host still holds the placeholder <PROXMOX_NODE_ADDRESS>: replace it in the inventory's "
        "hosts.yml",
        "ct200's ansible_private_key_file still holds the placeholder <PATH_TO_PRIVATE_KEY>: replace it in the "
        "inventory's hosts.yml"]


def test_every_problem_is_listed_at_once() -> None:
    problems = input_problems(serving(pivot_serving_port="0", pivot_ddtree_draft_tokens="1"),
                              training(pivot_training_job={}))
    assert len(problems) == 3


def test_a_placeholder_inside_an_absolute_path_is_named_as_one() -> None:
    problems = input_problems(serving(pivot_serving_target_model="/root/models/<TARGET_MODEL>"), training())
    assert problems == ["pivot_serving_target_model still holds the placeholder <TARGET_MODEL>: replace it with an "
                        "absolute path on the serving host"]


def test_the_pivot_does_not_judge_the_resume_command() -> None:
    # The shipped <CONFIRM: ...> element stops a resume, never a pivot: the pivot does not start the job again.
    assert "<CONFIRM" in " ".join(production("training")["pivot_training_resume"]["command"])
    assert input_problems(serving(), training()) == []


# --- a resume's inputs (resume_training.yml, rollback_nextn.yml with resume_training_after_rollback) ----------------


def resume(**changes: Any) -> dict[str, Any]:
    """The production training host once its placeholders are filled: the log file and the trainer's resume option."""
    settings = production("training")["pivot_training_resume"]
    filled = {**settings, "command": ["/root/run.sh", "--resume_from_checkpoint", "{checkpoint}"]}
    return training(**{"pivot_training_resume": filled, **changes})


def test_the_production_example_resumes_once_its_placeholders_are_filled() -> None:
    assert resume_input_problems(resume()) == []
    shipped = {**production("all"), **production("training")}
    assert resume_input_problems(shipped) == [
        "pivot_training_log_file still holds the placeholder <TRAINING_LOG_FILE>: replace it with an absolute path on "
        "the training host",
        "pivot_training_resume.command still holds the placeholder <CONFIRM: the trainer's resume option, e.g. "
        "--resume_from_checkpoint>: replace it with how the trainer takes the checkpoint to resume from (for example "
        "--resume_from_checkpoint followed by \"{checkpoint}\"), or leave the element out if the trainer resumes from "
        "its newest checkpoint by itself"]


def command(*argv: Any) -> dict[str, Any]:
    return {**production("training")["pivot_training_resume"], "command": list(argv)}


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"pivot_training_log_file": None}, "pivot_training_log_file must be an absolute path on the training host; got "
                                        "nothing"),
    ({"pivot_training_log_file": ""}, "pivot_training_log_file must be an absolute path on the training host; got "),
    ({"pivot_training_log_file": "train.log"}, "pivot_training_log_file must be an absolute path on the training "
                                               "host; got train.log"),
    ({"pivot_training_job": {"max_roots": 1}}, "pivot_training_job needs one of cmdline_match, pidfile or unit"),
    ({"pivot_training_checkpoint": {"path": "checkpoints"}}, "pivot_training_checkpoint.path must be an absolute path"),
    ({"pivot_resume_from": "step_000005400"}, "pivot_resume_from must be an absolute path on the training host; got "
                                              "step_000005400"),
    ({"pivot_resume_from": "<CHECKPOINT>"}, "pivot_resume_from still holds the placeholder <CHECKPOINT>"),
    ({"pivot_training_resume": None}, "pivot_training_resume must say how to start the job again: at least its "
                                      "command"),
    ({"pivot_training_resume": command()}, "pivot_training_resume.command must be the job's command line as a list, "
                                           "one argument per element (no shell), with {checkpoint} where the "
                                           "checkpoint's path goes; got []"),
    ({"pivot_training_resume": {"command": "/root/run.sh --resume {checkpoint}"}},
     "pivot_training_resume.command must be the job's command line as a list"),
    ({"pivot_training_resume": command("/root/run.sh", "", "{checkpoint}")},
     "pivot_training_resume.command must be the job's command line as a list"),
    ({"pivot_training_resume": command("/root/run.sh", "--resume=<RESUME_OPTION>{checkpoint}")},
     "pivot_training_resume.command still holds the placeholder <RESUME_OPTION>: replace it"),
    ({"pivot_training_resume": {**command("run.sh", "{checkpoint}"), "chdir": "root"}},
     "pivot_training_resume.chdir must be an absolute path on the training host; got root"),
    ({"pivot_training_resume": {**command("run.sh", "{checkpoint}"), "output_file": "<NOHUP_FILE>"}},
     "pivot_training_resume.output_file still holds the placeholder <NOHUP_FILE>"),
    ({"pivot_training_resume": {**command("run.sh", "{checkpoint}"), "pidfile": "run.pid"}},
     "pivot_training_resume.pidfile must be an absolute path"),
])
def test_each_bad_resume_setting_is_named(changes: dict[str, Any], fragment: str) -> None:
    problems = resume_input_problems(resume(**changes))
    assert len(problems) == 1 and fragment in problems[0], problems


def test_a_resume_command_may_leave_the_checkpoint_out_and_optional_paths_unset() -> None:
    # A trainer that resumes from its newest checkpoint by itself needs no option (the module warns, phase 0 does not).
    settings = {"command": ["/root/run.sh"], "chdir": "", "output_file": None}
    assert resume_input_problems(resume(pivot_training_resume=settings, pivot_resume_from="")) == []


def test_every_resume_problem_is_listed_at_once() -> None:
    problems = resume_input_problems(resume(pivot_training_log_file="<TRAINING_LOG_FILE>", pivot_training_job={},
                                            pivot_training_resume=command("run.sh", "<CONFIRM: option>")))
    assert len(problems) == 3


def test_the_filters_refuse_what_is_not_a_hosts_variables() -> None:
    with pytest.raises(AnsibleFilterError, match="must be a dictionary"):
        resume_input_problems(["pivot_training_resume"])


@pytest.mark.parametrize(("value", "found"), [
    ("<TRAINING_LOG_FILE>", ["<TRAINING_LOG_FILE>"]),
    (["/root/run.sh", "<CONFIRM: the option, e.g. --resume>", "{checkpoint}"],
     ["<CONFIRM: the option, e.g. --resume>"]),
    ({"command": ["a", "<A>"], "chdir": "/x/<B>/y"}, ["<A>", "<B>"]),
    (["--fmt=<lower>", "a < b > c", "{checkpoint}", "<>"], []),  # only <A capital...>: not markup, not a comparison
    (None, []),
    (8, []),
])
def test_placeholders_are_the_production_inventorys_capitalised_angle_brackets(value: Any, found: list[str]) -> None:
    assert placeholders(value) == found
