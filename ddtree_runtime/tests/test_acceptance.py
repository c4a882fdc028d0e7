"""The GPU acceptance suite's own harness, on CPU: comparisons, verdicts, state, reports and process handling.

Servers here are ``fake_sglang.py``, a stand-in that answers the suite's HTTP calls deterministically; it tests
the suite, not SGLang (the suite's results on a GPU machine are in docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from ddtree_runtime.acceptance import __main__ as acceptance_cli
from ddtree_runtime.acceptance import round_trace
from ddtree_runtime.acceptance.__main__ import main as acceptance_main
from ddtree_runtime.acceptance.environment import skip_reason
from ddtree_runtime.acceptance.launch import (
    COMMON_FLAGS,
    ServerError,
    ServerSpec,
    server_command,
    server_environment,
    start_server,
)
from ddtree_runtime.acceptance.measure import TimedCall, ratio
from ddtree_runtime.acceptance.plan import (
    Step,
    baseline_spec,
    ddtree_spec,
    dflash_spec,
    full_plan,
    refusal_specs,
    round_cost_specs,
    run_steps,
    select_steps,
)
from ddtree_runtime.acceptance.prompts import STOP_TOKEN_IDS, load_mix, suite_prompts
from ddtree_runtime.acceptance.round_cost import (
    LONG_NEW_TOKENS,
    NO_TOKENIZER_FLAGS,
    QWEN36_27B_DRAFTER,
    ROUND_COST_DRAFTER,
    ROUND_COST_TARGET,
    SHAPE_8B,
    SHAPE_27B,
    SHORT_NEW_TOKENS,
    RoundCost,
    round_cost_dirs,
    round_cost_prompt,
    round_cost_rows,
    write_round_cost_pair,
    write_shape_pair,
)
from ddtree_runtime.acceptance.round_trace import PROFILE_ROUNDS
from ddtree_runtime.acceptance.stats import (
    Agreement,
    agreement,
    chi_square_two_sample,
    first_difference,
    fisher_one_sided,
    margins_at_divergence,
    top2_margins,
)
from ddtree_runtime.acceptance.suite import (
    DETERMINISTIC_CASE,
    MARGIN_CASE,
    SAMPLING_PROMPT,
    STRESS_REQUESTS,
    TIE_MARGIN,
    CaseResult,
    Suite,
    SuiteSettings,
)
from ddtree_runtime.acceptance.throughput import BATCH_1_REQUESTS, throughput_rows
from ddtree_runtime.model_layout import pair_problem
from ddtree_runtime.reference.dflash import DFlashConfig
from ddtree_runtime.reference.qwen3 import Qwen3Config, rope_theta_from
from ddtree_runtime.tokenizer import HF_TOKENIZER_FILES

FAKE = Path(__file__).with_name("fake_sglang.py")


@pytest.fixture
def fake_python(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    """This interpreter, with ``sglang.launch_server`` resolving to the stand-in for the servers it starts."""
    site = tmp_path_factory.mktemp("fake-site")
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text("")
    shutil.copyfile(FAKE, site / "sglang" / "launch_server.py")
    monkeypatch.setenv("PYTHONPATH", str(site))
    return sys.executable


def make_suite(tmp_path: Path, python: str, **settings: object) -> Suite:
    prompts = suite_prompts()[:6] + [p for p in suite_prompts() if p.name == SAMPLING_PROMPT]
    return Suite(tmp_path, prompts, SuiteSettings(python, max_new_tokens=24, health_timeout=30,
                                                  **settings))  # type: ignore[arg-type]


def by_case(suite: Suite) -> dict[tuple[str, str], bool]:
    return {(r.case, r.server): r.ok for r in suite.all_results()}


# ---- comparisons ----------------------------------------------------------------------------------------------


def test_first_difference_and_agreement() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    result = agreement(["a", "b", "c"], [[1], [2, 3], [4]], [[1], [2, 4], [4]])
    assert (result.equal, result.divergent, result.first_divergence) == (2, 1, {"b": 1})
    assert result.rate == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="one entry per prompt"):
        agreement(["a"], [[1]], [])


def test_chi_square_accepts_one_distribution_and_rejects_another() -> None:
    rng = random.Random(1)
    weights = [5, 3, 1, 1]
    a = rng.choices(range(4), weights=weights, k=2000)
    b = rng.choices(range(4), weights=weights, k=2000)
    c = rng.choices(range(4), weights=[1, 3, 5, 1], k=2000)
    same, different = chi_square_two_sample(a, b), chi_square_two_sample(a, c)
    assert same.p_value > 1e-3 and same.degrees_of_freedom == 3
    assert different.p_value < 1e-12
    # Rare tokens are pooled so every expected count is at least 5.
    pooled = chi_square_two_sample([0] * 100 + [1, 2], [0] * 100 + [3])
    assert pooled.categories == 2


def test_load_mix_has_mixed_lengths_up_to_256() -> None:
    mix = load_mix(suite_prompts())
    assert len(mix) == 16
    assert max(r.max_new_tokens for r in mix) == 256 and min(r.max_new_tokens for r in mix) == 16
    assert len({len(r.input_ids) for r in mix}) > 4


# ---- command lines --------------------------------------------------------------------------------------------


def test_server_command_and_environment_select_the_plugin_like_the_unit() -> None:
    spec = ddtree_spec(64)
    argv = server_command(spec, "python3", 31000, "float16")
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "16"
    assert argv[argv.index("--dtype") + 1] == "float16"
    assert "--disable-cuda-graph" not in argv and set(COMMON_FLAGS) <= set(argv)
    assert "--skip-tokenizer-init" not in argv, "the servers load the model's tokenizer (stop strings, grammars)"
    env = server_environment(spec, {"DDTREE_TOPK": "3", "PATH": "/bin"})
    assert env["SGLANG_PLUGINS"] == "ddtree" and env["DDTREE_BUDGET"] == "64" and env["PATH"] == "/bin"
    assert "DDTREE_TOPK" not in env, "a caller's DDTREE_* must not leak into a server"
    assert env["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "1"
    assert "--disable-cuda-graph" in server_command(ddtree_spec(16, cuda_graphs=False), "python3", 1)
    assert "--tp-size" not in argv and "DDTREE_DEBUG_TREE_DIGEST" not in env
    assert env["NCCL_NVLS_ENABLE"] == "0", "NVLink multicast is off for every server"


def test_at_tensor_parallel_2_every_server_runs_on_two_gpus_and_its_ranks_compare_their_trees() -> None:
    spec = ddtree_spec(16)
    argv = server_command(spec, "python3", 31000, "bfloat16", tp_size=2)
    assert argv[argv.index("--tp-size") + 1] == "2"
    env = server_environment(spec, {"NCCL_NVLS_ENABLE": "1", "DDTREE_DEBUG_TREE_DIGEST": "0"}, tp_size=2)
    assert env["DDTREE_DEBUG_TREE_DIGEST"] == "1"
    assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"], env["NVSHMEM_DISABLE_NVLS"]) == (
        "0", "1", "1"), "a caller's environment cannot turn NVLink multicast on"


def test_the_suite_skips_when_it_has_fewer_gpus_than_the_tp_size() -> None:
    environment = {"python": "python3", "cuda_available": True, "sglang": "0.5.23", "gpu_count": 1}
    assert skip_reason(environment) is None
    assert skip_reason(environment, tp_size=2) == "--tp-size 2 needs 2 GPUs; torch sees 1"


def test_plan_steps_and_refusals() -> None:
    names = [step.name for step in full_plan()]
    assert names[0] == "baseline" and "refusals" in names
    assert {"ddtree-b16", "ddtree-b64", "dflash", "ddtree-b64-nographs", "dflash-nographs"} <= set(names)
    assert [s.name for s in select_steps("full", ["dflash", "baseline"])] == ["baseline", "dflash"]
    eight = ["8b-baseline", "dflash-8b", "dflash-8b-sync", "ddtree-8b-b15", "ddtree-8b-b16", "ddtree-8b-b64",
             "ddtree-8b-b256", "ddtree-8b-b64-sync"]
    big = ["27b-baseline", "dflash-27b", "dflash-27b-sync", "ddtree-27b-b15", "ddtree-27b-b64", "ddtree-27b-b64-sync"]
    profiles = ["profile-dflash-8b", "profile-ddtree-8b-b15", "profile-ddtree-8b-b64"]
    assert names[-len(eight + big + profiles):] == eight + big + profiles, "round cost, then profiles, come last"
    assert [s.name for s in select_steps("full", ["round-cost"])] == eight + big
    assert [s.name for s in select_steps("full", ["round-cost-27b"])] == big
    assert [s.name for s in select_steps("full", ["ddtree-8b-b64", "dflash-8b"])] == ["dflash-8b", "ddtree-8b-b64"]
    with pytest.raises(ValueError, match="not a step"):
        select_steps("quick", ["ddtree-b16-nographs"])
    with pytest.raises(ValueError, match="not a step"):
        select_steps("quick", ["round-cost"])
    messages = [message for _unused, message in refusal_specs()]
    assert any("2..16" in m for m in messages) and any("fa3" in m for m in messages)


# ---- a whole plan against the stand-in ------------------------------------------------------------------------


def test_suite_passes_a_server_pair_that_agrees(tmp_path: Path, fake_python: str) -> None:
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(baseline_spec())
    suite.run_speculative(ddtree_spec(64), load=True, sampling=True, requests=True)
    suite.run_speculative(dflash_spec(), load=True, sampling=False, requests=False)
    results = by_case(suite)
    failed = [(r.case, r.server, r.detail) for r in suite.all_results() if not r.ok]
    assert not failed, failed
    expected = {("1. baseline greedy", "baseline"), ("2. start + /server_info", "ddtree-b64"),
                ("2. greedy == baseline", "ddtree-b64"), ("2. greedy == baseline", "dflash"),
                ("3. accept length above DFLASH's", "ddtree-b64"),
                ("4. verify graphs captured at tree width", "ddtree-b64"),
                ("kernels: worker uses the compiled tree kernels", "ddtree-b64"),
                ("5. load: no errors, pools back to idle", "ddtree-b64"),
                ("5. load: 16 concurrent == baseline", "ddtree-b64"),
                ("6. sampling (T=0.7, top-p 0.95) matches the baseline's distribution", "ddtree-b64"),
                ("8. request: logprobs (top 3)", "ddtree-b64"), ("8. request: stop token id", "ddtree-b64"),
                ("8. request: stop string", "ddtree-b64"), ("8. request: grammar (regex)", "ddtree-b64")}
    assert expected <= set(results)
    tau = {r.server: r.figures["accept_length"] for r in suite.all_results() if r.case.startswith("3.")}
    assert tau["ddtree-b64"] > 2.5
    assert all(entry["exit_code"] is not None for entry in suite.servers)
    # With the model's tokenizer loaded, the stop string and the grammar are answered, not refused per request.
    assert suite.baseline_logprobs is not None and all(a["ok"] for a in suite.baseline_logprobs)
    grammar = suite.baseline_logprobs[3]["output_ids"]
    assert grammar and all(chr(t) in "abcdefghijklmnopqrstuvwxyz " for t in grammar)
    requests = [r for r in suite.results if r.case.startswith("8. request")]
    assert len(requests) == 4 and all(r.ok and not r.detail for r in requests)


def test_without_a_tokenizer_stop_strings_and_grammars_are_refused_per_request(tmp_path: Path,
                                                                               fake_python: str) -> None:
    """How the first GPU run served (``--skip-tokenizer-init``): SGLang refused both requests, the server went on."""
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(baseline_spec())
    suite.run_speculative(ddtree_spec(64, extra_flags=NO_TOKENIZER_FLAGS), load=False, sampling=False,
                          requests=True)
    lines = {r.case: r for r in suite.results if r.case.startswith("8. request") and r.server == "ddtree-b64"}
    assert "skip_tokenizer_init=True" in lines["8. request: stop string"].detail
    assert "--grammar-backend none" in lines["8. request: grammar (regex)"].detail
    assert not lines["8. request: logprobs (top 3)"].detail and not lines["8. request: stop token id"].detail


def test_a_server_needs_its_models_tokenizer_unless_told_to_skip_it(tmp_path: Path, fake_python: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    server = start_server(ServerSpec("no-tokenizer", tmp_path), fake_python, tmp_path)
    assert server.wait_exit(30) == 1 and "tokenizer.json" in server.log_text()
    server.stop()
    skipping = start_server(ServerSpec("skip", tmp_path, extra_flags=NO_TOKENIZER_FLAGS), fake_python, tmp_path)
    try:
        skipping.wait_healthy(30)
    finally:
        skipping.stop()


def test_divergence_fails_unless_dflash_diverges_as_often(tmp_path: Path, fake_python: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SGLANG_DIVERGE", "DDTREE")
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(baseline_spec())
    suite.run_speculative(ddtree_spec(16), load=False, sampling=False, requests=False)
    suite.run_speculative(dflash_spec(), load=False, sampling=False, requests=False)

    def verdict() -> CaseResult:
        return next(r for r in suite.all_results() if r.case == "2. greedy == baseline" and r.server == "ddtree-b16")

    assert not verdict().ok and verdict().figures["divergent"] == 1
    assert "DFLASH is exact here" in verdict().detail
    # SGLang's own DFLASH diverging too is the bar bf16 may force; the stand-in's baseline is at a near-tie
    # (top-2 gap 0.2) wherever DDTREE left it.
    suite.agreements[("2. greedy == baseline", "dflash")] = Agreement(7, 6, {"x": 3})
    assert verdict().ok, verdict().detail
    assert verdict().figures["baseline_margin_at_divergence"] == {suite.names[0]: 0.2}
    assert verdict().figures["fisher_p_vs_dflash"] > 0.05
    # A divergence where the baseline's gap is unknown is not explained by a near-tie.
    suite.agreements[("2. greedy == baseline", "ddtree-b16")] = Agreement(7, 5, {"x": 3, "y": 1})
    assert not verdict().ok and "not at a near-tie" in verdict().detail and "x, y" in verdict().detail


def test_divergence_where_the_baseline_is_sure_fails_even_when_dflash_diverges(
        tmp_path: Path, fake_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SGLANG_DIVERGE", "DDTREE")
    monkeypatch.setenv("FAKE_SGLANG_TOP2_GAP", "3.0")
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(baseline_spec())
    suite.run_speculative(ddtree_spec(16), load=False, sampling=False, requests=False)
    suite.agreements[("2. greedy == baseline", "dflash")] = Agreement(7, 6, {"x": 3})
    verdict = next(r for r in suite.all_results() if r.case == "2. greedy == baseline" and r.server == "ddtree-b16")
    assert not verdict.ok
    assert f"not at a near-tie (gap >= {TIE_MARGIN} or unknown): {suite.names[0]}" in verdict.detail


@pytest.mark.parametrize(("gap", "ok"), [("0.2", True), ("3.0", False)])
def test_the_baselines_own_logprob_pass_may_fork_only_at_a_near_tie(tmp_path: Path, fake_python: str,
                                                                    monkeypatch: pytest.MonkeyPatch, gap: str,
                                                                    ok: bool) -> None:
    """The H200 run of 2026-12-03: the non-speculative server's logprob pass left its plain greedy run on 3 of 24
    prompts, each at a top-2 gap of 0.0-0.125 (bf16 noise of the server itself)."""
    monkeypatch.setenv("FAKE_SGLANG_DIVERGE", "logprobs")
    monkeypatch.setenv("FAKE_SGLANG_TOP2_GAP", gap)
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(baseline_spec())
    line = next(r for r in suite.results if r.case == MARGIN_CASE)
    first = suite.names[0]
    assert line.ok is ok and line.figures["divergent"] == 1
    assert line.figures["margin_at_fork"] == {first: float(gap)}
    assert ("each at a near-tie" if ok else f"not at a near-tie (gap >= {TIE_MARGIN} or unknown): {first}") in \
        line.detail
    # The fork's own margin is known: both runs agree before it (a margin is the gap given the tokens before it).
    fork = line.figures["first_divergence"][first]
    assert margins_at_divergence({first: fork}, {first: suite.baseline.outputs[0]}, suite.margin_paths["baseline"],
                                 suite.margins["baseline"]) == {first: float(gap)}


def test_a_divergence_rate_far_above_dflashs_fails_even_at_near_ties() -> None:
    figures: dict[str, object] = {}
    names = [f"p{i}" for i in range(20)]
    ok, detail = Suite.divergence_verdict(Agreement(24, 4, dict.fromkeys(names, 5)), Agreement(24, 22, {"p0": 5}),
                                          dict.fromkeys(names, 0.01), figures)
    assert not ok and "more often than DFLASH beyond chance" in detail
    ok, _detail = Suite.divergence_verdict(Agreement(24, 13, dict.fromkeys(names[:11], 5)),
                                           Agreement(24, 18, dict.fromkeys(names[:6], 5)),
                                           dict.fromkeys(names, 0.01), figures)
    assert ok and figures["fisher_p_vs_dflash"] == pytest.approx(0.1135, abs=1e-4)


def test_fisher_one_sided_and_top2_margins() -> None:
    # Fisher's tea tasting: 3 of 4 cups right, one-sided p = 17/70.
    assert fisher_one_sided(3, 4, 1, 4) == pytest.approx(17 / 70)
    assert fisher_one_sided(0, 24, 0, 24) == 1.0
    assert fisher_one_sided(4, 4, 0, 4) == pytest.approx(1 / 70)
    meta = {"output_top_logprobs": [[[-0.1, 5, None], [-0.4, 6, None]], [[-0.0, 7, None]], None]}
    assert top2_margins(meta) == [pytest.approx(0.3), None, None]
    margins = margins_at_divergence({"a": 1, "a#9": 2, "b": 0}, {"a": [1, 2, 3], "a#9": [1, 9, 3], "b": [4]},
                                    {"a": [1, 2, 3]}, {"a": [0.5, 0.25, 1.0]})
    assert margins == {"a": 0.25, "a#9": None, "b": None}


def test_a_server_that_dies_at_start_is_a_failure_with_its_log(tmp_path: Path, fake_python: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SGLANG_MODE", "crash")
    suite = make_suite(tmp_path, fake_python)
    suite.run_speculative(ddtree_spec(64), load=True, sampling=False, requests=False)
    failure = next(r for r in suite.results if r.server == "ddtree-b64")
    assert not failure.ok and "exited with 3" in failure.detail and "boom" in failure.detail
    assert suite.servers[0]["exit_code"] == 3


@pytest.mark.parametrize(("behaviour", "ok"), [
    (("refuse", "ValueError: DDTREE_BUDGET must be at most 1024"), True),
    (("refuse", "something else"), False),
    (("serve", ""), False),
])
def test_refusals_need_a_failed_start_with_the_plugins_message(tmp_path: Path, fake_python: str,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               behaviour: tuple[str, str], ok: bool) -> None:
    monkeypatch.setenv("FAKE_SGLANG_MODE", behaviour[0])
    monkeypatch.setenv("FAKE_SGLANG_MESSAGE", behaviour[1])
    suite = make_suite(tmp_path, fake_python)
    suite.run_refusal(ddtree_spec(2048, name="refuse-budget-2048"), "DDTREE_BUDGET must be at most 1024", timeout=3)
    assert suite.results[-1].ok is ok


def test_stop_ends_the_server_and_what_it_started(tmp_path: Path, fake_python: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_SGLANG_CHILD_PID_FILE", str(pid_file))
    server = start_server(baseline_spec(), fake_python, tmp_path)
    server.wait_healthy(30)
    child = int(pid_file.read_text())
    os.kill(child, 0)
    server.stop(grace=5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the server's child outlived stop()")
    with pytest.raises(ServerError, match="died"):
        server.call("/health_generate")


def test_state_resumes_and_refuses_other_settings(tmp_path: Path, fake_python: str) -> None:
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(baseline_spec())
    suite.save()
    later = make_suite(tmp_path, fake_python)
    later.resume()
    assert later.baseline == suite.baseline and later.baseline_samples == suite.baseline_samples
    later.run_speculative(dflash_spec(), load=False, sampling=False, requests=False)
    assert by_case(later)[("2. greedy == baseline", "dflash")]
    with pytest.raises(ValueError, match="resume with the same settings"):
        make_suite(tmp_path, fake_python, dtype="float16").resume()


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the command runs the real suite")
def test_command_skips_without_a_gpu_and_says_why(tmp_path: Path) -> None:
    assert acceptance_main(["--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["skipped"] and payload["results"] == []
    assert "Skipped" in (tmp_path / "results.md").read_text()


# ---- case 7's models ------------------------------------------------------------------------------------------


def test_hybrid_pair_is_laid_out_like_qwen36_and_its_drafter(tmp_path: Path) -> None:
    pytest.importorskip("transformers", minversion="5")
    from ddtree_runtime.acceptance.hybrid import (  # noqa: PLC0415
        HYBRID_TEXT_CONFIG,
        HYBRID_VISION_TOKEN_NAMES,
        PROCESSOR_FILES,
        write_hybrid_pair,
    )
    from safetensors import safe_open  # noqa: PLC0415
    from transformers import AutoConfig, AutoModelForImageTextToText  # noqa: PLC0415

    target, drafter = write_hybrid_pair(tmp_path)
    raw = json.loads((target / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3_5ForConditionalGeneration"] and "vision_config" in raw
    text = raw["text_config"]
    assert "num_hidden_layers" not in raw and text["num_hidden_layers"] == 8
    assert text["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert text["rope_parameters"]["partial_rotary_factor"] == 0.25
    with safe_open(str(next(target.glob("*.safetensors"))), "pt") as weights:
        names = set(weights.keys())
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv.weight" in names
    assert "model.language_model.layers.3.self_attn.q_proj.weight" in names and "lm_head.weight" in names
    assert any(name.startswith("model.visual.") for name in names)
    assert AutoConfig.from_pretrained(str(target)).text_config.hidden_size == HYBRID_TEXT_CONFIG["hidden_size"]
    model = AutoModelForImageTextToText.from_pretrained(str(target), dtype=torch.float32)
    logits = model(input_ids=torch.tensor([suite_prompts()[0].input_ids[:12]])).logits
    assert logits.shape == (1, 12, HYBRID_TEXT_CONFIG["vocab_size"]) and torch.isfinite(logits).all()
    flat = json.loads((drafter / "config.json").read_text())
    assert flat["architectures"] == ["DFlashDraftModel"] and flat["hidden_size"] == HYBRID_TEXT_CONFIG["hidden_size"]
    assert pair_problem(target, drafter) is None
    assert flat["block_size"] == 16 and "sliding_attention" in flat["layer_types"]
    # SGLang reads the drafter's config through transformers: the window must survive that (finding of the second
    # GPU run: without use_sliding_window transformers dropped it and SGLang refused the drafter)
    assert AutoConfig.from_pretrained(str(drafter)).sliding_window == flat["sliding_window"] == 2048
    # Like Qwen3.6-27B, the target carries its processor and tokenizer (SGLang loads them at start).
    written = {p.name for p in target.iterdir()}
    assert {*PROCESSOR_FILES, *HF_TOKENIZER_FILES} <= written
    assert not {*PROCESSOR_FILES, *HF_TOKENIZER_FILES} & {p.name for p in drafter.iterdir()}
    keys = {"<|image_pad|>": "image_token_id", "<|video_pad|>": "video_token_id",
            "<|vision_start|>": "vision_start_token_id", "<|vision_end|>": "vision_end_token_id"}
    vision = {name: raw[key] for name, key in keys.items()}
    assert vision == HYBRID_VISION_TOKEN_NAMES
    added = {t["content"]: t["id"] for t in json.loads((target / "tokenizer.json").read_text())["added_tokens"]}
    assert {name: added[name] for name in vision} == vision
    image = json.loads((target / "preprocessor_config.json").read_text())
    assert (image["patch_size"], image["merge_size"], image["temporal_patch_size"]) == (
        raw["vision_config"]["patch_size"], raw["vision_config"]["spatial_merge_size"],
        raw["vision_config"]["temporal_patch_size"])
    # written once: a second call reuses the checkpoint, and gives a target written before the processor was (the
    # first GPU run's) its processor and tokenizer
    stamp = (target / "config.json").stat().st_mtime_ns
    for name in (*PROCESSOR_FILES, *HF_TOKENIZER_FILES):
        (target / name).unlink()
    del flat["use_sliding_window"]
    (drafter / "config.json").write_text(json.dumps(flat))
    write_hybrid_pair(tmp_path)
    assert (target / "config.json").stat().st_mtime_ns == stamp
    assert {*PROCESSOR_FILES, *HF_TOKENIZER_FILES} <= {p.name for p in target.iterdir()}
    assert json.loads((drafter / "config.json").read_text())["use_sliding_window"] is True


def test_the_hybrid_step_starts_its_servers_with_the_processor(tmp_path: Path, fake_python: str,
                                                               on_a_gpu_machine: None) -> None:
    """Finding 1 of the first GPU run, against the stand-in (which exits as SGLang did without the processor)."""
    pytest.importorskip("transformers", minversion="5")
    assert acceptance_main(["--out", str(tmp_path), "--python", fake_python, "--only", "hybrid",
                            "--max-new-tokens", "24", "--health-timeout", "30"]) == 0
    state, results, _markdown = read_outputs(tmp_path)
    assert [entry["name"] for entry in state["servers"]] == ["hybrid-baseline", "ddtree-hybrid-b16", "dflash-hybrid"]
    assert all("--skip-tokenizer-init" not in entry["command"] for entry in state["servers"])
    assert results["results"] and all(r["ok"] for r in results["results"])
    # the requests that stress the verify path ran on the hybrid's servers too, against the hybrid baseline's answers
    from ddtree_runtime.acceptance.suite import STRESS_REQUESTS  # noqa: PLC0415

    requests = {(r["case"], r["server"]) for r in results["results"] if r["case"].startswith("7. hybrid request")}
    assert requests == {(f"7. hybrid request: {request.label}", server) for request in STRESS_REQUESTS
                        for server in ("ddtree-hybrid-b16", "dflash-hybrid")}
    assert len(state["hybrid_baseline_requests"]) == len(STRESS_REQUESTS)


def test_the_trained_hybrid_step_serves_its_own_pair_against_its_own_baseline(
        tmp_path: Path, fake_python: str, on_a_gpu_machine: None) -> None:
    """The random hybrid target is a near-tie everywhere; the trained pair's case lines stand apart from it: its own
    baseline, its own DFLASH bar, the shipped model directories."""
    pytest.importorskip("transformers", minversion="5")
    from ddtree_runtime.acceptance.prompts import HYBRID_DRAFTER_DIR, HYBRID_TARGET_DIR  # noqa: PLC0415

    assert acceptance_main(["--out", str(tmp_path), "--python", fake_python, "--only", "hybrid,hybrid-trained",
                            "--max-new-tokens", "24", "--health-timeout", "30"]) == 0
    state, results, _markdown = read_outputs(tmp_path)
    trained = [entry for entry in state["servers"] if "trained" in entry["name"]]
    assert [entry["name"] for entry in trained] == ["hybrid-trained-baseline", "ddtree-hybrid-trained-b16",
                                                    "dflash-hybrid-trained"]

    def flag(entry: dict[str, object], name: str) -> str:
        argv = [str(part) for part in entry["command"]]  # type: ignore[attr-defined]
        return argv[argv.index(name) + 1]

    assert {flag(entry, "--model-path") for entry in trained} == {str(HYBRID_TARGET_DIR)}
    assert {flag(entry, "--speculative-draft-model-path") for entry in trained[1:]} == {str(HYBRID_DRAFTER_DIR)}
    lines = {(r["case"], r["server"]) for r in results["results"]}
    assert {("7. trained hybrid greedy == baseline", "ddtree-hybrid-trained-b16"),
            ("7. trained hybrid greedy == baseline", "dflash-hybrid-trained"),
            ("7. hybrid greedy == baseline", "ddtree-hybrid-b16"),
            ("7. trained hybrid baseline with logprobs: same tokens, or a fork at a near-tie",
             "hybrid-trained-baseline")} <= lines
    assert not {server for case, server in lines if case.startswith("7. hybrid ") and "trained" in server}
    assert results["results"] and all(r["ok"] for r in results["results"])


def test_run_steps_saves_after_each_skips_finished_ones_and_stops_on_time(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, sys.executable)
    ran: list[str] = []
    saved: list[list[str]] = []

    def step(name: str, seconds: float = 0.0) -> Step:
        return Step(name, lambda _suite: (ran.append(name), time.sleep(seconds)))

    steps = [step("a", 0.3), step("b"), step("c")]
    suite.steps_done = ["b"]
    left = run_steps(suite, steps, lambda s: saved.append(list(s.steps_done)), stop_after=0.1)
    assert ran == ["a"] and left == ["c"] and saved == [["b", "a"]]
    assert run_steps(suite, steps, lambda s: None) == [] and ran == ["a", "c"]


# ---- the self-check's real start ------------------------------------------------------------------------------


def test_self_check_start_passes_a_serving_ddtree_and_reports_a_crash(fake_python: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_runtime.acceptance.smoke import ddtree_start  # noqa: PLC0415

    result = ddtree_start(fake_python, timeout=30)
    assert result.ok and "served DDTREE (budget 16)" in result.detail
    monkeypatch.setenv("FAKE_SGLANG_MODE", "crash")
    crashed = ddtree_start(fake_python, timeout=30)
    assert not crashed.ok and "boom" in crashed.detail


def test_self_check_random_pair_loads_in_the_reference_engine(tmp_path: Path) -> None:
    from ddtree_runtime.acceptance.smoke import write_random_dense_pair  # noqa: PLC0415
    from ddtree_runtime.reference.dflash import load_dflash  # noqa: PLC0415
    from ddtree_runtime.reference.qwen3 import load_qwen3  # noqa: PLC0415

    target, drafter = write_random_dense_pair(tmp_path)
    assert load_qwen3(target).config.head_dim == 64
    assert {p.name for p in target.iterdir()} >= set(HF_TOKENIZER_FILES), "SGLang loads the target's tokenizer"
    assert load_dflash(drafter).config.target_layer_ids == [0, 1]
    assert pair_problem(target, drafter) is None


# ---- figures: throughput on the trained pair, round cost at real size -----------------------------------------


@pytest.fixture
def on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's environment probe as a GPU machine with SGLang would answer it (the servers are the stand-in)."""
    monkeypatch.setattr(acceptance_cli, "describe_environment",
                        lambda python, left_out: {"python": python, "left_out": left_out, "cuda_available": True,
                                                  "sglang": "stand-in", "gpu": "stand-in"})


def read_outputs(out: Path) -> tuple[dict, dict, str]:
    return (json.loads((out / "state.json").read_text()), json.loads((out / "results.json").read_text()),
            (out / "results.md").read_text())


def test_throughput_and_round_cost_ratios() -> None:
    def speeds(batch_1: float, batch_16: float) -> dict[str, dict[str, float]]:
        return {"batch_1": {"tokens_per_s": batch_1}, "batch_16": {"tokens_per_s": batch_16}}

    table = {"baseline": {"algorithm": "none", **speeds(100.0, 1000.0)},
             "ddtree-b16": {"algorithm": "DDTREE", "budget": 16, **speeds(300.0, 1500.0)},
             "dflash": {"algorithm": "DFLASH", **speeds(200.0, 2000.0)},
             "ddtree-b64": {"algorithm": "DDTREE", "budget": 64, "batch_1": {"tokens_per_s": 250.0}}}
    rows = {(r["server"], r["batch"]): r for r in throughput_rows(table)}
    assert len(rows) == 7 and ("ddtree-b64", 16) not in rows
    assert rows[("baseline", 1)]["vs_baseline"] is None and rows[("baseline", 1)]["ddtree_vs_dflash"] is None
    assert rows[("dflash", 16)]["vs_baseline"] == 2.0 and rows[("dflash", 16)]["ddtree_vs_dflash"] is None
    assert rows[("ddtree-b16", 1)]["vs_baseline"] == 3.0 and rows[("ddtree-b16", 1)]["ddtree_vs_dflash"] == 1.5
    assert rows[("ddtree-b16", 16)]["ddtree_vs_dflash"] == 0.75, "a slower DDTREE is a figure below 1, not a failure"
    assert rows[("ddtree-b64", 1)]["ddtree_vs_dflash"] == 1.25
    without_dflash = throughput_rows({k: v for k, v in table.items() if k != "dflash"})
    assert all(r["ddtree_vs_dflash"] is None for r in without_dflash)

    def cost(algorithm: str, shape: str, overlap: bool = True, **by_batch: float) -> dict[str, Any]:
        return {"algorithm": algorithm, "shape": shape, "overlap": overlap,
                **{batch: {"ms_per_round": ms} for batch, ms in by_batch.items()}}

    costs = {"8b-baseline": cost("none", "8b", batch_1=8.0),
             "dflash-8b-sync": cost("DFLASH", "8b", overlap=False, batch_1=12.0, batch_16=24.0),
             "dflash-8b": cost("DFLASH", "8b", batch_1=10.0, batch_16=20.0),
             "ddtree-8b-b64": cost("DDTREE", "8b", batch_1=13.0, batch_16=22.0),
             "dflash-27b": cost("DFLASH", "27b", batch_1=25.0),
             "ddtree-27b-b64": cost("DDTREE", "27b", batch_1=26.0)}
    by_row = {(r["server"], r["batch"]): r["vs_dflash_ms_per_round"] for r in round_cost_rows(costs)}
    assert by_row == {("8b-baseline", 1): pytest.approx(0.8), ("dflash-8b-sync", 1): pytest.approx(1.2),
                      ("dflash-8b-sync", 16): pytest.approx(1.2), ("dflash-8b", 1): None, ("dflash-8b", 16): None,
                      ("ddtree-8b-b64", 1): pytest.approx(1.3), ("ddtree-8b-b64", 16): pytest.approx(1.1),
                      ("dflash-27b", 1): None, ("ddtree-27b-b64", 1): pytest.approx(1.04)}, \
        "held against the default DFLASH of the same shape and batch, never the one without overlap"
    assert ratio(1.0, 0.0) is None and ratio(None, 2.0) is None and ratio(3.0, 2.0) == 1.5


def test_round_cost_is_the_difference_of_two_lengths_in_decode_rounds() -> None:
    short = TimedCall(requests=1, tokens=SHORT_NEW_TOKENS, verify_rounds=40, seconds=0.9)
    long = TimedCall(requests=1, tokens=LONG_NEW_TOKENS, verify_rounds=168, seconds=2.18)
    speculative = RoundCost(speculative=True, short=short, long=long)
    assert speculative.problem() is None
    figures = speculative.as_dict()
    assert figures["decode_rounds"] == 128 and figures["decode_tokens"] == 256
    assert figures["ms_per_round"] == pytest.approx(10.0) and figures["tokens_per_round"] == 2.0
    assert figures["tokens_per_s"] == pytest.approx(200.0)
    baseline = RoundCost(speculative=False, short=short, long=long)  # one decode step per token
    assert baseline.as_dict()["ms_per_round"] == pytest.approx(1000 * 1.28 / 256)
    stopped = RoundCost(True, TimedCall(1, 30, 15, 0.3), TimedCall(1, 30, 15, 0.3))
    assert stopped.problem() == (f"asked for {SHORT_NEW_TOKENS} new tokens with ignore_eos for each of 1 "
                                 "request(s), got 30 in all")
    no_rounds = RoundCost(True, short, TimedCall(1, LONG_NEW_TOKENS, 0, 2.0))
    assert "decode rounds did not grow" in (no_rounds.problem() or "")


def test_a_batch_round_is_counted_once_for_all_its_requests() -> None:
    """Sixteen requests in one call decode in the same rounds: ms per round divides by the rounds of one request,
    tokens/s counts every request's tokens."""
    short = TimedCall(requests=16, tokens=16 * SHORT_NEW_TOKENS, verify_rounds=16 * 64, seconds=1.0)
    long = TimedCall(requests=16, tokens=16 * LONG_NEW_TOKENS, verify_rounds=16 * 320, seconds=4.84)
    figures = RoundCost(speculative=True, short=short, long=long).as_dict()
    assert figures["requests"] == 16 and figures["decode_rounds"] == 256
    assert figures["ms_per_round"] == pytest.approx(15.0) and figures["tokens_per_round"] == 1.0
    assert figures["tokens_per_s"] == pytest.approx(16 * 256 / 3.84, rel=1e-3)
    short_one = TimedCall(requests=16, tokens=16 * SHORT_NEW_TOKENS - 1, verify_rounds=16 * 64, seconds=1.0)
    assert "for each of 16 request(s)" in (RoundCost(True, short_one, long).problem() or "")


def test_throughput_figures_reach_state_and_reports_and_survive_resume(tmp_path: Path, fake_python: str,
                                                                       on_a_gpu_machine: None) -> None:
    common = ["--out", str(tmp_path), "--python", fake_python, "--max-new-tokens", "24", "--health-timeout", "30"]
    assert acceptance_main([*common, "--only", "baseline,dflash"]) == 0
    state, results, markdown = read_outputs(tmp_path)
    assert set(state["throughput"]) == {"baseline", "dflash"}
    for figures in state["throughput"].values():
        assert figures["batch_1"]["requests"] == BATCH_1_REQUESTS and figures["batch_16"]["requests"] == 16
        assert figures["batch_1"]["tokens"] == BATCH_1_REQUESTS * 24 and figures["batch_16"]["tokens"] == 16 * 24
        assert figures["batch_1"]["tokens_per_s"] > 0 and figures["batch_16"]["tokens_per_s"] > 0
    assert state["throughput"]["dflash"]["algorithm"] == "DFLASH"
    assert results["throughput"]["servers"] == state["throughput"]
    assert "## Throughput on the trained pair" in markdown

    assert acceptance_main([*common, "--resume", "--only", "ddtree-b16"]) == 0
    state, results, markdown = read_outputs(tmp_path)
    assert set(state["throughput"]) == {"baseline", "dflash", "ddtree-b16"}, "resume keeps the earlier figures"
    rows = {(r["server"], r["batch"]): r for r in results["throughput"]["table"]}
    assert set(rows) == {(name, batch) for name in ("baseline", "dflash", "ddtree-b16") for batch in (1, 16)}
    speed = {key: row["tokens_per_s"] for key, row in rows.items()}
    for batch in (1, 16):
        ddtree = rows[("ddtree-b16", batch)]
        assert ddtree["ddtree_vs_dflash"] == pytest.approx(speed[("ddtree-b16", batch)] / speed[("dflash", batch)])
        assert ddtree["vs_baseline"] == pytest.approx(speed[("ddtree-b16", batch)] / speed[("baseline", batch)])
    table = markdown.split("## Throughput on the trained pair")[1].split("## ")[0]
    assert "| ddtree-b16 | DDTREE | 16 |" in table and "| baseline | none | 1 |" in table
    assert all(result["ok"] for result in results["results"]), "throughput figures add no case lines"


def test_round_cost_step_serves_config_only_models_with_random_weights(tmp_path: Path, fake_python: str,
                                                                       on_a_gpu_machine: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SGLANG_EOS_AFTER", "30")  # the measurement must ask for ignore_eos to get its lengths
    chosen = ["8b-baseline", "dflash-8b", "dflash-8b-sync", "ddtree-8b-b64", "ddtree-8b-b64-sync", "dflash-27b",
              "ddtree-27b-b64"]
    assert acceptance_main(["--out", str(tmp_path), "--python", fake_python, "--only", ",".join(chosen),
                            "--health-timeout", "30"]) == 0
    state, results, markdown = read_outputs(tmp_path)
    servers = {entry["name"]: entry["command"] for entry in state["servers"]}
    assert list(servers) == chosen
    dirs = {"8b": round_cost_dirs(tmp_path / "models"), "27b": SHAPE_27B.dirs(tmp_path / "models")}
    for name, argv in servers.items():
        target, drafter = dirs["27b" if "27b" in name else "8b"]
        assert argv[argv.index("--load-format") + 1] == "dummy" and set(COMMON_FLAGS) <= set(argv)
        assert "--skip-tokenizer-init" in argv, "config-only models have no tokenizer for SGLang to load"
        assert argv[argv.index("--model-path") + 1] == str(target)
        assert ("--disable-overlap-schedule" in argv) == name.endswith("-sync")
        if "27b" in name:  # the last of a repeated flag wins in SGLang's parser
            assert len(argv) - 1 - argv[::-1].index("--mem-fraction-static") > argv.index("--mem-fraction-static")
            assert argv[len(argv) - argv[::-1].index("--max-running-requests")] == "1"
        if name == "8b-baseline":
            assert "--speculative-draft-load-format" not in argv and "--speculative-algorithm" not in argv
        else:
            assert argv[argv.index("--speculative-draft-load-format") + 1] == "dummy"
            assert argv[argv.index("--speculative-draft-model-path") + 1] == str(drafter)
            assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "16"
    assert [entry.get("budget") for entry in state["servers"]] == [None, None, None, 64, 64, None, 64]

    costs = state["round_costs"]
    assert list(costs) == chosen and results["round_cost"]["servers"] == costs
    for name, figures in costs.items():
        batches = ["batch_1"] if "27b" in name else ["batch_1", "batch_16"]
        assert [key for key in figures if key.startswith("batch_")] == batches
        for batch in batches:
            measured = figures[batch]
            requests = int(batch.removeprefix("batch_"))
            assert measured["requests"] == requests
            assert measured["short"]["tokens"] == requests * SHORT_NEW_TOKENS
            assert measured["long"]["tokens"] == requests * LONG_NEW_TOKENS
            assert measured["ms_per_round"] > 0 and measured["tokens_per_s"] > 0
    assert costs["8b-baseline"]["batch_1"]["tokens_per_round"] == 1.0
    assert costs["dflash-8b"]["batch_16"]["tokens_per_round"] == 2.0  # the stand-in accepts 2 tokens a DFLASH round
    assert (costs["dflash-8b"]["overlap"], costs["dflash-8b-sync"]["overlap"]) == (True, False)
    rows = {(row["server"], row["batch"]): row for row in results["round_cost"]["table"]}
    for name, batch, reference in (("ddtree-8b-b64", 16, "dflash-8b"), ("ddtree-8b-b64-sync", 1, "dflash-8b"),
                                   ("ddtree-27b-b64", 1, "dflash-27b")):
        assert rows[(name, batch)]["vs_dflash_ms_per_round"] == pytest.approx(
            costs[name][f"batch_{batch}"]["ms_per_round"] / costs[reference][f"batch_{batch}"]["ms_per_round"])
    assert "## Round cost at real size" in markdown and "| ddtree-27b-b64 | 27b | DDTREE | 64 | on | 1 |" in markdown
    identity = [r for r in results["results"] if r["case"] == "round cost: start + /server_info"]
    assert len(identity) == len(chosen) and all(r["ok"] for r in results["results"])


def test_round_cost_27b_models_are_configs_only_of_qwen36_27b_and_its_z_lab_drafters_shape(tmp_path: Path) -> None:
    target, drafter = write_shape_pair(SHAPE_27B, tmp_path)
    assert sorted(p.name for p in target.iterdir()) == ["config.json"] == sorted(p.name for p in drafter.iterdir())
    raw_target = json.loads((target / "config.json").read_text())
    assert raw_target["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    text = raw_target["text_config"]
    assert {key: text[key] for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                                       "num_key_value_heads", "head_dim", "linear_num_key_heads",
                                       "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                                       "linear_conv_kernel_dim", "vocab_size")} == {
        "num_hidden_layers": 64, "hidden_size": 5120, "intermediate_size": 17408, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "vocab_size": 248320}
    assert text["layer_types"].count("linear_attention") == 48 and text["layer_types"][3::4] == ["full_attention"] * 16
    assert text["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert raw_target["vision_config"]["out_hidden_size"] == 5120
    raw_drafter = json.loads((drafter / "config.json").read_text())
    assert raw_drafter["dflash_config"]["target_layer_ids"] == [1, 16, 31, 46, 61]
    assert raw_drafter["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert raw_drafter["sliding_window"] == 2048 and raw_drafter["block_size"] == 16
    assert DFlashConfig.from_dict(raw_drafter) == QWEN36_27B_DRAFTER, "SGLang sees the window (use_sliding_window)"
    assert pair_problem(target, drafter) is None, "the preflight reads the nested text_config and the flat drafter"
    assert SHAPE_8B.batches == (1, 16) and SHAPE_27B.batches == (1,)


def test_round_cost_models_are_configs_only_with_qwen3_8b_and_its_drafters_shape(tmp_path: Path) -> None:
    target, drafter = write_round_cost_pair(tmp_path)
    assert sorted(p.name for p in target.iterdir()) == ["config.json"] == sorted(p.name for p in drafter.iterdir())
    raw_target = json.loads((target / "config.json").read_text())
    assert raw_target["architectures"] == ["Qwen3ForCausalLM"] and raw_target["model_type"] == "qwen3"
    assert {key: raw_target[key] for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                                             "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                             "torch_dtype", "eos_token_id")} == {
        "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "eos_token_id": [151645, 151643]}
    assert rope_theta_from(raw_target) == 1_000_000.0
    raw_drafter = json.loads((drafter / "config.json").read_text())
    assert raw_drafter["architectures"] == ["DFlashDraftModel"] and raw_drafter["torch_dtype"] == "bfloat16"
    assert raw_drafter["dflash_config"] == {"target_layer_ids": [1, 9, 17, 25, 33], "mask_token_id": 151669}
    assert {key: raw_drafter[key] for key in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                              "num_key_value_heads", "head_dim", "intermediate_size", "block_size",
                                              "vocab_size", "num_target_layers", "rope_theta")} == {
        "num_hidden_layers": 5, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 12288, "block_size": 16, "vocab_size": 151936, "num_target_layers": 36,
        "rope_theta": 1_000_000.0}
    assert raw_drafter["layer_types"] == ["full_attention"] * 5
    # What SGLang's DFlash model and the plugin's preflight read of the pair.
    assert pair_problem(target, drafter) is None
    assert DFlashConfig.from_dict(raw_drafter) == ROUND_COST_DRAFTER
    assert Qwen3Config.from_dict(raw_target) == ROUND_COST_TARGET
    assert 0 <= raw_drafter["dflash_config"]["mask_token_id"] < raw_target["vocab_size"]
    prompt = round_cost_prompt()
    assert len(prompt) == 128 and max(prompt) < raw_target["vocab_size"] and prompt == round_cost_prompt()


def test_round_cost_configs_read_as_transformers_reads_them(tmp_path: Path) -> None:
    pytest.importorskip("transformers", minversion="5")
    from transformers import AutoConfig  # noqa: PLC0415

    target, drafter = write_round_cost_pair(tmp_path)
    for directory, layers in ((target, 36), (drafter, 5)):
        config = AutoConfig.from_pretrained(str(directory))
        assert config.model_type == "qwen3" and config.num_hidden_layers == layers
        assert config.rope_parameters["rope_theta"] == 1_000_000.0 and config.head_dim == 128


def test_an_http_error_while_measuring_is_a_failed_case_line(tmp_path: Path, fake_python: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SGLANG_FAIL_BATCH", "16")
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(baseline_spec())
    suite.run_speculative(dflash_spec(), load=False, sampling=False, requests=False)
    failed = {(r.case, r.server): r.detail for r in suite.all_results() if not r.ok}
    assert set(failed) == {("throughput at batch 16", "baseline"), ("throughput at batch 16", "dflash")}
    assert "answered 500" in failed[("throughput at batch 16", "dflash")]
    assert "batch_1" in suite.throughput["dflash"] and "batch_16" not in suite.throughput["dflash"]
    assert by_case(suite)[("2. greedy == baseline", "dflash")], "the server's other cases go on"

    monkeypatch.delenv("FAKE_SGLANG_FAIL_BATCH")
    monkeypatch.setenv("FAKE_SGLANG_FAIL_MAX_NEW_TOKENS", str(LONG_NEW_TOKENS))
    spec = round_cost_specs(tmp_path / "models")[1]
    write_round_cost_pair(tmp_path / "models")
    suite.run_round_cost(spec)
    line = next(r for r in suite.results if r.server == spec.name and not r.ok)
    assert line.case == "round cost: ms per decode round" and "answered 500" in line.detail
    assert spec.name not in suite.round_costs


def test_a_request_may_leave_the_baselines_answer_only_at_a_near_tie(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, sys.executable)
    greedy = [10, 11, 12, 13, 14]
    # The gaps are the baseline's own, along its answer to this very request.
    theirs = {"ok": True, "output_ids": greedy, "logprobs": [-0.1] * 5, "margins": [2.0, 2.0, 0.1, 2.0, 2.0]}
    same = {"ok": True, "output_ids": greedy, "logprobs": [-0.12] * 5}
    assert suite.request_verdict(same, theirs)[0]
    at_tie = {"ok": True, "output_ids": [10, 11, 99, 98, 97], "logprobs": [-0.1, -0.1, -0.7, -3.0, -3.0]}
    ok, detail, figures = suite.request_verdict(at_tie, theirs)
    assert ok, detail
    assert figures["first_divergence"] == 2 and figures["baseline_margin_there"] == 0.1
    where_sure = {"ok": True, "output_ids": [10, 99, 12, 13, 14], "logprobs": [-0.1] * 5}
    ok, detail, _figures = suite.request_verdict(where_sure, theirs)
    assert not ok and "at token 1, where the baseline's top-2 gap is 2.0" in detail
    without_gaps = {key: value for key, value in theirs.items() if key != "margins"}
    assert "top-2 gap is unknown" in suite.request_verdict(at_tie, without_gaps)[1]
    far_logprobs = {"ok": True, "output_ids": greedy, "logprobs": [-0.1, -0.1, -1.5, -0.1, -0.1]}
    ok, detail, _figures = suite.request_verdict(far_logprobs, theirs)
    assert not ok and "logprobs differ from the baseline's by up to 1.400" in detail
    missing = {"ok": True, "output_ids": greedy, "logprobs": [-0.1] * 3}
    assert "3 logprobs for 5 tokens" in suite.request_verdict(missing, theirs)[1]


def test_stress_requests_hold_their_own_rules() -> None:
    rules = {r.label: r.honoured for r in STRESS_REQUESTS}
    newline, space = ord("\n"), ord(" ")
    for label in ("stop token id", "stop string"):
        assert rules[label]([97, 98, newline]) and rules[label]([97, 98])
        assert not rules[label]([97, newline, 98])
    grammar = rules["grammar (regex)"]
    assert grammar([97, space, 122]) and grammar([97, 98, STOP_TOKEN_IDS[0]])
    assert not grammar([97, ord("A")]) and not grammar([]) and not grammar([STOP_TOKEN_IDS[0]])


def test_a_grammar_answer_that_breaks_the_regex_fails(tmp_path: Path, fake_python: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(baseline_spec())
    broken = {"ok": True, "output_ids": [97, ord("Q")], "logprobs": []}
    monkeypatch.setattr(suite, "logprob_answers", lambda _server, with_margins=False: [
        *suite.baseline_logprobs[:3], broken])
    suite.run_speculative(ddtree_spec(64), load=False, sampling=False, requests=True)
    grammar = next(r for r in suite.results if r.case == "8. request: grammar (regex)")
    assert not grammar.ok and "breaks its rule" in grammar.detail
    assert all(r.ok for r in suite.results if r.case.startswith("8. request:") and r is not grammar)


def test_round_profile_steps_trace_decode_rounds_and_say_where_the_gpu_time_goes(
        tmp_path: Path, fake_python: str, on_a_gpu_machine: None) -> None:
    assert [s.name for s in select_steps("full", ["round-profile"])] == [
        "profile-dflash-8b", "profile-ddtree-8b-b15", "profile-ddtree-8b-b64"]
    assert acceptance_main(["--out", str(tmp_path), "--python", fake_python, "--only", "round-profile",
                            "--health-timeout", "30"]) == 0
    state, results, markdown = read_outputs(tmp_path)
    profiles = state["round_profiles"]
    assert list(profiles) == ["profile-dflash-8b", "profile-ddtree-8b-b15", "profile-ddtree-8b-b64"]
    assert results["round_profile"] == profiles
    for name, profile in profiles.items():
        assert profile["rounds"] == PROFILE_ROUNDS and (tmp_path / profile["trace"]).is_file()
        assert profile["gpu_busy_ms_per_round"] == pytest.approx(0.85)
        assert profile["gpu_idle_share"] == pytest.approx(1 - 0.85 * PROFILE_ROUNDS / (PROFILE_ROUNDS - 0.05),
                                                          abs=1e-3)
        assert profile["gpu_ms_per_round_in_cuda_graphs"] == pytest.approx(0.7)
        stages = profile["gpu_ms_per_round_by_stage"]
        if "dflash" in name:
            assert stages == {"other": pytest.approx(0.85)}, "a stock worker opens no stage ranges"
        else:
            assert stages == {"draft": 0.3, "topk": 0.1, "verify": 0.4, "commit": 0.05}
    argv = {entry["name"]: entry["command"] for entry in state["servers"]}["profile-ddtree-8b-b64"]
    assert argv[argv.index("--load-format") + 1] == "dummy" and "--disable-overlap-schedule" not in argv
    assert "## Where a round's time goes" in markdown and "| profile-ddtree-8b-b64 |" in markdown


def test_a_profile_without_a_trace_is_a_failed_case_line(tmp_path: Path, fake_python: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SGLANG_NO_TRACE", "1")
    monkeypatch.setattr(round_trace, "TRACE_TIMEOUT_SECONDS", 2.0)
    suite = make_suite(tmp_path, fake_python)
    spec = round_cost_specs(tmp_path / "models")[1]
    write_round_cost_pair(tmp_path / "models")
    suite.run_round_profile(spec)
    failed = [r for r in suite.results if not r.ok]
    assert [r.case for r in failed] == ["round profile: trace of decode rounds"]
    assert "no trace under" in failed[0].detail and spec.name not in suite.round_profiles


def test_deterministic_inference_holds_ddtree_to_the_baseline_token_for_token(
        tmp_path: Path, fake_python: str, on_a_gpu_machine: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert [s.name for s in select_steps("full", ["deterministic"])] == [
        "deterministic-baseline", "deterministic-dflash", "deterministic-ddtree-b64"]
    common = ["--python", fake_python, "--only", "deterministic", "--health-timeout", "30"]
    assert acceptance_main(["--out", str(tmp_path / "equal"), *common]) == 0
    state, results, _markdown = read_outputs(tmp_path / "equal")
    for entry in state["servers"]:
        assert "--enable-deterministic-inference" in entry["command"], entry["name"]
    verdicts = {r["server"]: r for r in results["results"] if r["case"] == DETERMINISTIC_CASE}
    assert set(verdicts) == {"deterministic-dflash", "deterministic-ddtree-b64"}
    assert all(v["ok"] and "token for token" in v["detail"] for v in verdicts.values())

    monkeypatch.setenv("FAKE_SGLANG_DIVERGE", "DDTREE")
    assert acceptance_main(["--out", str(tmp_path / "diverging"), *common]) == 1
    _state, results, _markdown = read_outputs(tmp_path / "diverging")
    verdicts = {r["server"]: r for r in results["results"] if r["case"] == DETERMINISTIC_CASE}
    assert verdicts["deterministic-dflash"]["ok"]
    assert not verdicts["deterministic-ddtree-b64"]["ok"]
    assert "DFLASH on 0/" in verdicts["deterministic-ddtree-b64"]["detail"]
