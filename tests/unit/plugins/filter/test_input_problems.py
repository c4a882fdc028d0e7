"""Phase 0's rules, as the pivot_inputs role asks them: the two hosts' variables in, one sentence per problem out."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from ansible_collections.pivot.ops.plugins.filter.input_problems import input_problems
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
        "pivot_training_log_file must be an absolute path on the training host; got <TRAINING_LOG_FILE>"]


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


def test_every_problem_is_listed_at_once() -> None:
    problems = input_problems(serving(pivot_serving_port="0", pivot_ddtree_draft_tokens="1"),
                              training(pivot_training_job={}))
    assert len(problems) == 3
