"""The DDTree plugin against a real SGLang 0.5.23 (CPU): entry point, registration, server args, hooks, layouts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from contract_support import ProbeRunner, probe_env

PRODUCTION_LIKE = ["--model-path", "/models/target", "--tp-size", "2", "--speculative-algorithm", "DDTREE",
                   "--speculative-draft-model-path", "/models/drafter", "--speculative-num-draft-tokens", "16",
                   "--trust-remote-code"]


def test_entry_point_loads_and_ddtree_resolves(run_probe: ProbeRunner) -> None:
    result = run_probe("plugins")
    assert result["entry_points"]["ddtree"] == "ddtree_runtime.sglang:register"
    assert result["resolved"] == "CustomSpecAlgo('DDTREE')"
    assert result["refusal"] is None and result["error"] is None


def test_other_plugin_selection_leaves_ddtree_unknown(run_probe: ProbeRunner) -> None:
    result = run_probe("plugins", env={"SGLANG_PLUGINS": "someone_else"})
    assert result["resolved"] is None
    assert "Unknown speculative algorithm name: DDTREE" in result["error"]


def test_unsupported_release_is_refused_loudly(run_probe: ProbeRunner) -> None:
    result = run_probe("plugins-as", ["0.5.22"])
    assert result["resolved"] is None
    assert "UnsupportedSGLang" in result["refusal"] and "0.5.22" in result["refusal"]
    assert result["error"].startswith("UnsupportedSGLang: DDTREE is unavailable: the ddtree_runtime plugin refused")


def test_self_check_covers_the_plugin_under_the_installed_sglang(sglang_python: Path) -> None:
    completed = subprocess.run([str(sglang_python), "-m", "ddtree_runtime.check", "--json", "--require-sglang-plugin"],
                               capture_output=True, text=True, env=probe_env(), timeout=600, check=False)
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    checks = {check["name"]: check for check in report["checks"]}
    assert completed.returncode == 0, report
    assert "resolves DDTREE" in checks["sglang_plugin"]["detail"]
    assert "DDTreeWorker" in checks["sglang_plugin"]["detail"]
    assert checks["ddtree_decode"]["ok"]


def test_self_check_fails_when_the_plugin_is_not_selected(sglang_python: Path) -> None:
    completed = subprocess.run([str(sglang_python), "-m", "ddtree_runtime.check", "--json", "--require-sglang-plugin"],
                               capture_output=True, text=True, env=probe_env({"SGLANG_PLUGINS": "other"}),
                               timeout=600, check=False)
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    plugin_check = next(check for check in report["checks"] if check["name"] == "sglang_plugin")
    assert completed.returncode == 1
    assert not plugin_check["ok"] and "Unknown speculative algorithm name: DDTREE" in plugin_check["detail"]


def test_server_args_handling_sets_what_ddtree_needs(run_probe: ProbeRunner) -> None:
    spec = run_probe("resolve-spec", PRODUCTION_LIKE, env={"DDTREE_BUDGET": "64", "DDTREE_TOPK": "8"})
    assert spec["resolved"] == {
        "speculative_num_steps": 1,
        "speculative_eagle_topk": 2,
        "disable_overlap_schedule": False,
        "speculative_num_draft_tokens": 16,
        "max_running_requests": 48,
        "page_size": 1,
    }
    assert spec["predicates"] == {"is_dflash": True, "is_dflash_family": True,
                                  "supports_target_verify_for_draft": True, "has_draft_kv": True,
                                  "is_eagle": False}
    assert (spec["max_draft_tokens"], spec["target_verify_width"], spec["draft_verify_width"]) == (65, 65, 16)
    # SGLang sizes buffers with either D or max(D, W) as the argument: the answer is W (target) / D (drafter)
    # either way (65 raised "must be in 2..16" in the scheduler on the first GPU start).
    assert spec["widths_by_argument"] == {"16": [65, 16], "65": [65, 16]}
    # Registered for SGLang's overlap scheduler (0.5.23 calls supports_overlap=False deprecated): a server with
    # overlap on (the default) gets the DDTree worker instead of "does not support overlap scheduling".
    assert spec["supports_overlap"] is True
    assert spec["worker_with_overlap"] == "DDTreeWorker"


@pytest.mark.parametrize(
    ("extra_args", "env", "message"),
    [
        (["--page-size", "16"], {}, "needs --page-size 1"),
        (["--attention-backend", "trtllm_mha"], {}, "--attention-backend trtllm_mha cannot verify DDTree trees"),
        (["--attention-backend", "fa3"], {}, "--attention-backend fa3 cannot verify DDTree trees"),
        (["--linear-attn-verify-backend", "flashinfer"], {}, "--linear-attn-verify-backend flashinfer does not"),
        ([], {"DDTREE_BUDGET": "2048"}, "DDTREE_BUDGET must be at most 1024"),
        (["--speculative-draft-window-size", "2048"], {}, "speculative-draft-window-size"),
        ([], {"DDTREE_BUDGET": "-1"}, "DDTREE_BUDGET must be a positive integer"),
        # SGLang's own default track interval (256) under the production mamba flag: the rule phase 0 applies
        (["--mamba-radix-cache-strategy", "extra_buffer"], {"DDTREE_BUDGET": "256"},
         "mamba_track_interval 256 is below the verify width 257"),
    ],
)
def test_server_args_handling_refuses_what_ddtree_cannot_run(
    run_probe: ProbeRunner, extra_args: list[str], env: dict[str, str], message: str
) -> None:
    failed = run_probe("resolve-spec", [*PRODUCTION_LIKE, *extra_args], env=env, expect_rc=1)
    assert message in failed["stderr"]


def test_a_raised_mamba_track_interval_serves_the_budget_it_was_raised_for(run_probe: ProbeRunner) -> None:
    """Real SGLang's parser takes the setting phase 0's refusal names, and the plugin then serves budget 1024."""
    args = [*PRODUCTION_LIKE, "--mamba-radix-cache-strategy", "extra_buffer", "--mamba-track-interval", "1280"]
    spec = run_probe("resolve-spec", args, env={"DDTREE_BUDGET": "1024"})
    assert spec["target_verify_width"] == 1025


def test_draft_length_above_the_drafter_block_is_refused(run_probe: ProbeRunner) -> None:
    args = ["32" if arg == "16" else arg for arg in PRODUCTION_LIKE]
    failed = run_probe("resolve-spec", args, expect_rc=1)
    assert "must be in 2..16" in failed["stderr"]


def test_hooks_apply_and_the_worker_subclasses_dflash_v2(run_probe: ProbeRunner) -> None:
    result = run_probe("hooks")
    assert result["missing"] == []
    assert all(result["wrapped"].values()), result["wrapped"]
    assert result["worker"] == "ddtree_runtime.sglang.worker.DDTreeWorker"
    assert result["worker_is_dflash_v2"] is True
    assert {"retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "custom_mask", "topk"} <= set(
        result["verify_input_fields"])


@pytest.mark.parametrize(("algorithm", "env", "target_cells"), [
    # D = 16, 2 requests, context 100: DFLASH verifies D tokens, DDTREE W = budget + 1 (65, or 16 by default).
    ("DFLASH", {"DDTREE_BUDGET": "64"}, 2 * 16 * (100 + 16)),
    ("DDTREE", {"DDTREE_BUDGET": "64"}, 2 * 65 * (100 + 65)),
    ("DDTREE", {}, 2 * 16 * (100 + 16)),
])
def test_the_triton_tree_mask_buffer_holds_a_full_width_verify(
    run_probe: ProbeRunner, algorithm: str, env: dict[str, str], target_cells: int
) -> None:
    """SGLang sizes it with D and copies the round's mask in on every graph replay: W > D overflowed it once the
    batch's contexts were long enough (found reading the 0.5.23 source)."""
    sizes = run_probe("verify-mask", [algorithm], env=env)
    assert sizes == {"target": target_cells, "drafter": None}


def test_the_drafter_gets_the_accepted_path_in_the_draft_pools_ids_and_only_d_rows(run_probe: ProbeRunner) -> None:
    """Rows past D would reach past the fused writer's context + D rotary cache; the ids must be the draft pool's
    (``_draft_write_ids``), not the target's verify slots (found reading the 0.5.23 source)."""
    result = run_probe("commit-features")
    # the accepted nodes first (in path order), then the other slots ascending, cut to D = 4 columns
    assert result["hidden_rows"] == [0, 3, 7, 1, 9, 10, 11, 12]
    assert result["cache_loc_2d"] == [[100, 103, 107, 101], [109, 110, 111, 112]]
    assert result["positions"] == [10, 11, 12, 13, 20, 21, 22, 23]
    assert result["commit_lens"] == [3, 1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sglang_greedy_tree_verify_walks_ddtree_layouts_like_the_reference(run_probe: ProbeRunner, seed: int) -> None:
    result = run_probe("greedy-verify", [str(seed)], env={"TRITON_INTERPRET": "1"})
    for request in result["requests"]:
        assert request["sglang_nodes"] == request["ddtree_nodes"]
        assert request["sglang_committed"] == request["ddtree_committed"]
        assert request["sglang_committed"][-1] == request["bonus"]
    assert any(len(request["ddtree_nodes"]) > 1 for request in result["requests"])


DELIBERATE_DIFFERENCES_FROM_DFLASH = {
    # CustomSpecAlgo's conservative False where DFLASH says True; none of these paths has run a tree verify:
    # grammar FSM advanced inside verify under the overlap barrier (DDTREE builds its grammar masks per tree itself;
    # SGLang then syncs the scheduler for grammar batches instead of overlapping them),
    "supports_grammar_overlap",
    # --enable-mixed-chunk kept on (SGLang turns it off for DDTREE instead),
    "supports_mixed_chunk",
    # the target's EXTEND declared to have no later shared-buffer reader (the early release is skipped).
    "supports_prefill_shared_read_done",
}


def test_ddtree_has_every_method_of_sglangs_algorithm_enum_and_answers_like_dflash(run_probe: ProbeRunner) -> None:
    """0.5.23 checks only is_*/supports_* on plugin algorithms; the scheduler also calls create_future_map and
    carries_draft_hidden_states at start, and the first H200 start died on each in turn."""
    result = run_probe("algorithm-interface")
    assert {"create_future_map", "carries_draft_hidden_states", "need_topk"} <= set(result["methods"])
    assert result["missing"] == []
    differing = {name for name, (ddtree, dflash) in result["answers"].items() if ddtree != dflash}
    assert differing == DELIBERATE_DIFFERENCES_FROM_DFLASH, result["answers"]
    assert all(result["answers"][name] == [False, True] for name in differing)


def _write_config(directory: Path, config: dict[str, object]) -> str:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


@pytest.mark.parametrize(("target_config", "readable"), [
    ({"num_hidden_layers": 6}, False),
    ({"text_config": {"num_hidden_layers": 6}, "vision_config": {}}, False),
    ({"num_hidden_layers": 7}, True),
])
def test_a_drafter_reading_the_targets_last_layer_is_refused_at_start(
    run_probe: ProbeRunner, tmp_path: Path, target_config: dict[str, object], readable: bool
) -> None:
    target = _write_config(tmp_path / "target", target_config)
    drafter = _write_config(tmp_path / "drafter", {"dflash_config": {"target_layer_ids": [1, 3, 5]}})
    args = [target if arg == "/models/target" else drafter if arg == "/models/drafter" else arg
            for arg in PRODUCTION_LIKE]
    if readable:
        assert run_probe("resolve-spec", args)["resolved"]["speculative_num_draft_tokens"] == 16
        return
    failed = run_probe("resolve-spec", args, expect_rc=1)
    assert "SGLang can capture only layers 0..4 of this 6-layer target" in failed["stderr"]


def test_sglang_parses_the_release_smoke_request_and_keeps_thinking_off(run_probe: ProbeRunner) -> None:
    result = run_probe("smoke-request")
    assert result == {"chat_template_kwargs": {"enable_thinking": False}, "temperature": 0, "max_tokens": 48}
