"""The plugin's own settings rule as the playbooks ask it, and the quality gate's agreement measure."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.pivot.ops.plugins.filter.answer_agreement import answer_agreement
from ansible_collections.pivot.ops.plugins.filter.ddtree_required_flags import ddtree_required_flags
from ansible_collections.pivot.ops.plugins.filter.ddtree_settings_problem import ddtree_settings_problem
from ansible_collections.pivot.ops.plugins.filter.partial_run_tags import partial_run_tags, pivot_roles


@pytest.mark.parametrize(("draft", "budget", "topk", "expected"), [
    (16, 64, 8, ""),
    ("16", "64", "8", ""),  # -e key=value gives strings
    (2, 1, 1, ""),
    (1, 64, 8, "must be in 2..16 for DDTREE, got 1"),
    (17, 64, 8, "must be in 2..16 for DDTREE, got 17"),
    (16, 2048, 8, "DDTREE_BUDGET must be at most 1024"),
    (16, 0, 8, "DDTREE_BUDGET must be a positive integer"),
    (16, 64, 0, "DDTREE_TOPK must be a positive integer"),
    ("sixteen", 64, 8, "must be an integer"),
])
def test_the_plugins_own_rule_decides(draft: object, budget: object, topk: object, expected: str) -> None:
    problem = ddtree_settings_problem(draft, budget, topk)
    assert (problem == "") if expected == "" else (expected in problem)


def test_the_flags_the_plugin_would_set_are_named_for_the_unit() -> None:
    # the production release: common flags give max-running-requests; Jinja hands numbers over as text
    flags = {"max-running-requests": "16", "speculative-algorithm": "DDTREE", "speculative-num-draft-tokens": "16"}
    assert ddtree_required_flags(flags, "16", "64", "8") == {
        "speculative-num-steps": 1, "speculative-eagle-topk": 2, "page-size": 1, "attention-backend": "triton",
        "speculative-draft-attention-backend": "triton", "linear-attn-verify-backend": "triton"}
    stated = flags | ddtree_required_flags(flags, 16, 64, 8)
    assert ddtree_required_flags(stated, 16, 64, 8) == {}, "once stated, nothing is left for the plugin to decide"
    # a user's flashinfer: the drafter follows it; an EAGLE-style topk is overridden
    chosen = ddtree_required_flags(stated | {"attention-backend": "flashinfer", "speculative-eagle-topk": 1,
                                             "speculative-draft-attention-backend": None}, 16, 64, 8)
    assert chosen == {"speculative-eagle-topk": 2, "speculative-draft-attention-backend": "flashinfer"}


def test_flags_for_settings_the_plugin_refuses_are_refused_in_its_words() -> None:
    with pytest.raises(AnsibleFilterError, match=r"The DDTree plugin would refuse this release: .*got 17"):
        ddtree_required_flags({}, 17, 64, 8)
    with pytest.raises(AnsibleFilterError, match=r"expects the release's flags as a dict, got list"):
        ddtree_required_flags([], 16, 64, 8)


def test_identical_answers_agree_fully() -> None:
    result = answer_agreement(["def f(): return 1", ""], ["def f(): return 1", ""])
    assert result == {"per_prompt": [1.0, 1.0], "mean": 1.0, "identical": 2, "judged": 2}


def test_an_answer_leaving_the_baseline_late_costs_little_and_early_costs_much() -> None:
    reference = ["abcdefghij", "abcdefghij"]
    result = answer_agreement(["abcdefghiX", "aXXXXXXXXX"], reference)
    assert result["per_prompt"] == [0.9, 0.1]
    assert result["mean"] == 0.5 and result["identical"] == 0


def test_an_empty_answer_where_the_baseline_answered_scores_zero() -> None:
    assert answer_agreement([""], ["def f(): pass"])["mean"] == 0.0


def test_answer_lists_must_line_up() -> None:
    with pytest.raises(AnsibleFilterError, match="got 1 answers for 2"):
        answer_agreement(["a"], ["a", "b"])


def test_the_collections_roles_are_found_where_the_filter_lives() -> None:
    assert {"preflight", "run_phase", "sglang_release", "stop_training", "gpu_release"} <= set(pivot_roles())


@pytest.mark.parametrize(("run_tags", "skip_tags", "expected"), [
    (["all"], [], []),
    (("all",), ("molecule-notest", "notest"), []),  # ansible-core 2.21 passes tuples; molecule skips these
    (["preflight"], [], ["--tags preflight"]),
    (["all", "always"], [], ["--tags always"]),
    (["all"], ["gpu_release_wait", "notest", "always"], ["--skip-tags gpu_release_wait", "--skip-tags always"]),
    (["all"], ["stop_trainingX"], []),  # a role's name must be the whole tag or its prefix before "_"
    (["all"], ["stand_in_step"], []),
])
def test_a_filter_cuts_a_phase_short_only_with_pivots_own_tags(
    run_tags: list[str], skip_tags: list[str], expected: list[str]
) -> None:
    assert partial_run_tags(run_tags, skip_tags) == expected


def test_a_plays_own_phase_role_counts_when_named() -> None:
    assert partial_run_tags(["all"], ["stand_in_step"], ["stand_in"]) == ["--skip-tags stand_in_step"]


def test_answers_are_judged_only_where_the_baseline_answered() -> None:
    """The quality gate compares the contents after the think block: a baseline whose thinking did not end within the
    token limit has no answer for that prompt, so it is left out, not scored against."""
    result = answer_agreement(["abc", "xyz", "def"], ["abc", "", "dXX"], skip_unanswered=True)
    assert result["per_prompt"] == [1.0, None, 0.333] and result["judged"] == 2 and result["identical"] == 1
    assert result["mean"] == round((1.0 + 1 / 3) / 2, 3)
    unanswered = {"per_prompt": [None], "mean": None, "identical": 0, "judged": 0}
    assert answer_agreement(["a"], [""], skip_unanswered=True) == unanswered
