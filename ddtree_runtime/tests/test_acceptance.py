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

import pytest
import torch
from ddtree_runtime.acceptance.__main__ import main as acceptance_main
from ddtree_runtime.acceptance.launch import (
    COMMON_FLAGS,
    ServerError,
    ServerSpec,
    server_command,
    server_environment,
    start_server,
)
from ddtree_runtime.acceptance.plan import (
    Step,
    ddtree_spec,
    dflash_spec,
    full_plan,
    refusal_specs,
    run_steps,
    select_steps,
)
from ddtree_runtime.acceptance.prompts import load_mix, suite_prompts
from ddtree_runtime.acceptance.stats import Agreement, agreement, chi_square_two_sample, first_difference
from ddtree_runtime.acceptance.suite import Suite, SuiteSettings
from ddtree_runtime.model_layout import pair_problem

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
    return Suite(tmp_path, suite_prompts()[:6], SuiteSettings(python, max_new_tokens=24, health_timeout=30,
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
    env = server_environment(spec, {"DDTREE_TOPK": "3", "PATH": "/bin"})
    assert env["SGLANG_PLUGINS"] == "ddtree" and env["DDTREE_BUDGET"] == "64" and env["PATH"] == "/bin"
    assert "DDTREE_TOPK" not in env, "a caller's DDTREE_* must not leak into a server"
    assert env["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "1"
    assert "--disable-cuda-graph" in server_command(ddtree_spec(16, cuda_graphs=False), "python3", 1)


def test_plan_steps_and_refusals() -> None:
    names = [step.name for step in full_plan()]
    assert names[0] == "baseline" and names[-1] == "refusals"
    assert {"ddtree-b16", "ddtree-b64", "dflash", "ddtree-b64-nographs", "dflash-nographs"} <= set(names)
    assert [s.name for s in select_steps("full", ["dflash", "baseline"])] == ["baseline", "dflash"]
    with pytest.raises(ValueError, match="not a step"):
        select_steps("quick", ["ddtree-b16-nographs"])
    messages = [message for _unused, message in refusal_specs()]
    assert any("2..16" in m for m in messages) and any("fa3" in m for m in messages)


# ---- a whole plan against the stand-in ------------------------------------------------------------------------


def test_suite_passes_a_server_pair_that_agrees(tmp_path: Path, fake_python: str) -> None:
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(ServerSpec("baseline", tmp_path))
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


def test_divergence_fails_unless_dflash_diverges_as_often(tmp_path: Path, fake_python: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SGLANG_DIVERGE", "DDTREE")
    suite = make_suite(tmp_path, fake_python)
    suite.run_baseline(ServerSpec("baseline", tmp_path))
    suite.run_speculative(ddtree_spec(16), load=False, sampling=False, requests=False)
    suite.run_speculative(dflash_spec(), load=False, sampling=False, requests=False)
    verdict = next(r for r in suite.all_results() if r.case == "2. greedy == baseline" and r.server == "ddtree-b16")
    assert not verdict.ok and verdict.figures["divergent"] == 1
    assert "DFLASH 0/" in verdict.detail
    # SGLang's own DFLASH diverging as often is the bar bf16 may force.
    suite.agreements[("2. greedy == baseline", "dflash")] = Agreement(6, 5, {"x": 3})
    assert by_case(suite)[("2. greedy == baseline", "ddtree-b16")]
    suite.agreements[("2. greedy == baseline", "ddtree-b16")] = Agreement(6, 4, {"x": 3, "y": 1})
    assert not by_case(suite)[("2. greedy == baseline", "ddtree-b16")]


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
    server = start_server(ServerSpec("baseline", tmp_path), fake_python, tmp_path)
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
    suite.run_baseline(ServerSpec("baseline", tmp_path))
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
    from ddtree_runtime.acceptance.hybrid import HYBRID_TEXT_CONFIG, write_hybrid_pair  # noqa: PLC0415
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
    # written once: a second call reuses the checkpoint
    stamp = (target / "config.json").stat().st_mtime_ns
    write_hybrid_pair(tmp_path)
    assert (target / "config.json").stat().st_mtime_ns == stamp


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
    assert load_dflash(drafter).config.target_layer_ids == [0, 1]
    assert pair_problem(target, drafter) is None
