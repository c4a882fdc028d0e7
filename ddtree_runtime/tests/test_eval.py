"""The acceptance-length evaluation tool: prompts, run specs, aggregation, reports, the command line (on the dense
and the hybrid shipped pair, beside ``bench.tau``), and the HTTP backend against a real lab server on 127.0.0.1
(ephemeral port)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from ddtree_runtime.bench.tau import main as bench_tau_main
from ddtree_runtime.eval.__main__ import main as eval_main
from ddtree_runtime.eval.backends import (
    SHIPPED_DRAFTER,
    SHIPPED_HYBRID_DRAFTER,
    SHIPPED_HYBRID_TARGET,
    SHIPPED_TARGET,
    EvalError,
    HttpBackend,
    ReferenceBackend,
    RunSpec,
    Sample,
    sample_from_response,
)
from ddtree_runtime.eval.report import headline_table, markdown, per_prompt_table
from ddtree_runtime.eval.runner import build_specs, evaluate
from ddtree_runtime.eval.tasks import CODING_TASKS, HELD_OUT_PROMPTS, EvalPrompt, load_prompts
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tokenizer import chat_prompt

SMOKE_REQUEST = "Write a Python function fizzbuzz(n) that returns the FizzBuzz sequence up to n."


# -- prompts -----------------------------------------------------------------------------------------------


def test_suite_has_at_least_ten_distinct_chat_coding_tasks():
    names = [t.name for t in CODING_TASKS]
    assert len(names) >= 10 and len(set(names)) == len(names)
    assert all(
        t.text.startswith("<|im_start|>user\n") and t.text.endswith("<|im_start|>assistant\n") for t in CODING_TASKS
    )
    fizzbuzz = next(t for t in CODING_TASKS if t.name == "fizzbuzz")
    assert fizzbuzz.text == chat_prompt([{"role": "user", "content": SMOKE_REQUEST}])


def test_prompt_files_txt_jsonl_and_directories(tmp_path):
    (tmp_path / "a.txt").write_text("def f(x):\n")
    (tmp_path / "b.jsonl").write_text(
        "\n".join(
            [
                json.dumps({"name": "raw", "prompt": "import os\n"}),
                "",
                json.dumps({"name": "ask", "instruction": "Write gcd(a, b)."}),
                json.dumps(
                    {"name": "chat", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
                ),
            ]
        )
    )
    (tmp_path / "ignored.md").write_text("not a prompt")
    prompts = load_prompts([tmp_path])
    assert [p.name for p in prompts] == ["a", "raw", "ask", "chat"]
    assert prompts[0].text == "def f(x):\n"
    assert prompts[2].text == chat_prompt([{"role": "user", "content": "Write gcd(a, b)."}])
    assert prompts[3].text.startswith("<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu")
    held_out = load_prompts([HELD_OUT_PROMPTS])
    assert len(held_out) >= 10 and all(p.name.startswith("heldout:") for p in held_out)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", "", "empty"),
        ("bad.jsonl", '{"name": "x", "prompt": "p"}\n{oops\n', r"bad.jsonl:2: invalid JSON"),
        ("noname.jsonl", '{"prompt": "p"}\n', "non-empty 'name'"),
        ("nobody.jsonl", '{"name": "x", "prompt": ""}\n', "needs a non-empty"),
        ("blank.jsonl", "\n\n", "no prompts"),
        ("dup.jsonl", '{"name": "x", "prompt": "a"}\n{"name": "x", "prompt": "b"}\n', "duplicate prompt name"),
        ("prompt.md", "text", "must be .txt or .jsonl"),
    ],
)
def test_bad_prompt_files_are_rejected_with_the_reason(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_prompts([path])


def test_missing_prompt_paths_and_empty_directories_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_prompts([tmp_path / "absent.jsonl"])
    with pytest.raises(ValueError, match=r"no \.txt or \.jsonl"):
        load_prompts([tmp_path])


# -- run specs and aggregation ---------------------------------------------------------------------------------


def test_specs_are_ar_then_chain_then_budgets_per_drafter():
    specs = build_specs(["ar", "dflash", "ddtree"], ["d1", "d2"], [4, 16], 16, 8)
    assert [(s.method, s.drafter, s.budget) for s in specs] == [
        ("ar", None, 0),
        ("dflash", "d1", 0),
        ("ddtree", "d1", 4),
        ("ddtree", "d1", 16),
        ("dflash", "d2", 0),
        ("ddtree", "d2", 4),
        ("ddtree", "d2", 16),
    ]
    assert [s.label for s in specs[:3]] == ["AR", "DFlash chain", "DDTree-4 (top-8)"]


@pytest.mark.parametrize(
    ("methods", "drafters", "budgets", "message"),
    [
        (["beam"], ["d"], [4], "unknown methods"),
        (["ddtree"], ["d"], [0], "budgets must be >= 1"),
        (["dflash"], [], [4], "need a drafter"),
        (["ddtree"], ["d"], [], "at least one budget"),
    ],
)
def test_bad_specs_are_rejected(methods, drafters, budgets, message):
    with pytest.raises(ValueError, match=message):
        build_specs(methods, drafters, budgets, 16, None)


class ScriptedBackend:
    """Returns fixed samples per (method, prompt) so the aggregation arithmetic can be checked exactly."""

    def __init__(self) -> None:
        self.description = {"backend": "scripted"}
        self.calls: list[tuple[str, str, int]] = []

    def generate(self, prompt: str, spec: RunSpec, params: SamplingParams) -> Sample:
        self.calls.append((spec.method, prompt, params.max_new_tokens))
        if spec.method == "ar":
            return Sample([1, 2, 3, 4], "abcd", 2.0, [1, 1, 1], 3, 1.0)
        if prompt == "p1":
            return Sample([1, 2, 3, 4], "abcd", 1.0, [2, 1], 2, 1.5)
        return Sample([1, 2, 9, 9], "ab??", 0.5, [3], 1, 3.0)


def test_aggregates_are_means_over_prompts_and_totals_over_tokens_and_time():
    backend = ScriptedBackend()
    prompts = [EvalPrompt("one", "p1"), EvalPrompt("two", "p2")]
    specs = [RunSpec("ar"), RunSpec("dflash", "d")]
    ar, chain = evaluate(backend, prompts, specs, SamplingParams(max_new_tokens=4), warmup_tokens=2)
    assert backend.calls[0] == ("ar", "p1", 2) and backend.calls[3] == ("dflash", "p1", 2)
    assert (ar.mean_tau, ar.rounds, ar.tokens, ar.tokens_per_s, ar.matches_ar) == (1.0, 6, 8, 2.0, None)
    assert chain.mean_tau == pytest.approx(2.25) and chain.rounds == 3 and chain.tokens_per_s == pytest.approx(8 / 1.5)
    assert [p.matches_ar for p in chain.prompts] == [True, False] and chain.matches_ar is False
    sampled = evaluate(backend, prompts, specs, SamplingParams(temperature=1.0, max_new_tokens=4))
    assert sampled[1].matches_ar is None
    with pytest.raises(ValueError, match="no prompts"):
        evaluate(backend, [], specs, SamplingParams())


def test_markdown_tables_put_drafters_in_rows_and_configurations_in_columns():
    backend = ScriptedBackend()
    prompts = [EvalPrompt("one", "p1"), EvalPrompt("two", "p2")]
    specs = [RunSpec("ar"), RunSpec("dflash", "mine"), RunSpec("ddtree", "mine", 8), RunSpec("dflash", "other")]
    results = evaluate(backend, prompts, specs, SamplingParams(max_new_tokens=4))
    assert headline_table(results).splitlines() == [
        "| drafter | vanilla (DFlash chain) | DDTree-8 |",
        "|---|---:|---:|",
        "| mine | 2.25 | 2.25 |",
        "| other | 2.25 | - |",
    ]
    assert per_prompt_table(results).splitlines()[2] == "| one | 1.00 | 1.50 | 1.50 | 1.50 |"
    text = markdown(results, {"max_new_tokens": 4, "max_topk": None}, backend.description)
    assert "Settings: max_new_tokens=4." in text and "| DFlash chain | other | 2.25 | 3 | 8 |" in text


# -- SGLang /generate responses ----------------------------------------------------------------------------------


def test_tau_from_sglang_responses():
    exact = sample_from_response(
        {
            "text": "x",
            "output_ids": [5, 6],
            "meta_info": {"completion_tokens": 9, "spec_verify_ct": 3, "spec_acceptance_lengths": [4, 3, 2]},
        },
        0.1,
    )
    assert (exact.rounds, exact.tau, exact.tokens) == (3, 3.0, [5, 6])
    counted = sample_from_response({"text": "x", "meta_info": {"completion_tokens": 9, "spec_verify_ct": 4}}, 0.1)
    assert (counted.rounds, counted.tau) == (4, 2.0)
    plain = sample_from_response({"text": "abc", "meta_info": {"completion_tokens": 3}}, 0.1)
    assert (plain.rounds, plain.tau) == (2, 1.0)
    with pytest.raises(EvalError, match="no meta_info"):
        sample_from_response({"text": "x"}, 0.1)
    with pytest.raises(EvalError, match="no completion_tokens"):
        sample_from_response({"meta_info": {"spec_verify_ct": 2}}, 0.1)


# -- reference backend and the command line ---------------------------------------------------------------------


def test_reference_backend_rejects_directories_without_a_model(tmp_path):
    with pytest.raises(EvalError, match="not a model directory"):
        ReferenceBackend(tmp_path, {}, "cpu", "float32")
    with pytest.raises(ValueError, match="dtype"):
        ReferenceBackend(SHIPPED_TARGET, {}, "cpu", "int8")


def test_cli_on_the_shipped_pair_writes_json_and_markdown(tmp_path, capsys):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["--tasks", "gcd,flatten", "--budgets", "8", "--max-new-tokens", "24", "--json", str(out_json)]
    assert eval_main([*argv, "--markdown", str(out_md), "--quiet"]) == 0
    report = json.loads(out_json.read_text())
    assert [r["label"] for r in report["runs"]] == ["AR", "DFlash chain", "DDTree-8"]
    assert all(r["matches_ar"] is True for r in report["runs"][1:])
    assert report["runs"][0]["mean_tau"] == 1.0 and report["runs"][2]["mean_tau"] > 1.0
    assert [p["name"] for p in report["runs"][0]["prompts"]] == ["gcd", "flatten"]
    assert "| pivot-coder-tiny-dflash |" in out_md.read_text()
    assert capsys.readouterr().out.strip() == out_md.read_text().strip()


def test_cli_on_the_shipped_hybrid_pair_writes_json_and_markdown(tmp_path, capsys):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    pair = ["--target", str(SHIPPED_HYBRID_TARGET), "--drafter", str(SHIPPED_HYBRID_DRAFTER)]
    argv = [*pair, "--tasks", "gcd,flatten", "--budgets", "8", "--max-new-tokens", "24", "--warmup-tokens", "0"]
    assert eval_main([*argv, "--json", str(out_json), "--markdown", str(out_md), "--quiet"]) == 0
    report = json.loads(out_json.read_text())
    assert report["backend"]["architecture"] == "Qwen35ForCausalLM"
    ar, chain, tree = report["runs"]
    assert [r["label"] for r in report["runs"]] == ["AR", "DFlash chain", "DDTree-8"]
    assert chain["matches_ar"] is True and tree["matches_ar"] is True
    for run in (chain, tree):
        assert [p["text"] for p in run["prompts"]] == [p["text"] for p in ar["prompts"]]
        for prompt in run["prompts"]:
            lengths = prompt["acceptance_lengths"]
            assert len(lengths) == prompt["rounds"] and prompt["tau"] == pytest.approx(sum(lengths) / len(lengths))
        assert run["mean_tau"] > 1.0
    assert ar["mean_tau"] == 1.0 and ar["tokens"] == chain["tokens"] == tree["tokens"] > 0
    assert "| pivot-coder-tiny-hybrid-dflash |" in out_md.read_text()
    assert capsys.readouterr().out.strip() == out_md.read_text().strip()


def test_bench_tau_runs_the_shipped_hybrid_pair(capsys):
    pair = ["--target", str(SHIPPED_HYBRID_TARGET), "--drafter", str(SHIPPED_HYBRID_DRAFTER)]
    bench_tau_main([*pair, "--prompts", "2", "--max-new-tokens", "16", "--budgets", "8"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    expected = ["ar", "dflash {'draft_tokens': 16}", "ddtree {'draft_tokens': 16, 'budget': 8}"]
    assert [cells[0].strip() for cells in rows[1:]] == expected
    taus = [float(cells[1]) for cells in rows[1:]]
    assert taus[0] == 1.0 and min(taus[1:]) > 1.0
    assert [int(cells[2]) for cells in rows[1:]] == [32] * 3
    assert [cells[4].strip() for cells in rows[1:]] == ["yes"] * 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tasks", "nope"], "unknown tasks"),
        (["--no-suite"], "no prompts"),
        (["--target", "/nonexistent/model"], "not a model directory"),
        (["--target", str(SHIPPED_TARGET), "--methods", "dflash"], "need a drafter"),
        (["--drafter", str(SHIPPED_DRAFTER), "--drafter", str(SHIPPED_DRAFTER)], "distinct names"),
        (["--server", "http://127.0.0.1:9"], "unreachable"),
    ],
)
def test_cli_usage_errors_exit_2(argv, message, capsys):
    assert eval_main([*argv, "--quiet"]) == 2
    assert message in capsys.readouterr().err


# -- HTTP backend against a real lab server ---------------------------------------------------------------------

API_KEY = "eval-key"


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory) -> Iterator[str]:
    env = {**os.environ, "DDTREE_BUDGET": "8", "DDTREE_LAB_TORCH_THREADS": "1"}
    argv = [
        sys.executable, "-m", "pivot_labserver", "--host", "127.0.0.1", "--port", "0",
        "--model-path", str(SHIPPED_TARGET), "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", str(SHIPPED_DRAFTER), "--speculative-num-draft-tokens", "16",
        "--api-key", API_KEY,
    ]  # fmt: skip
    process = subprocess.Popen(argv, env=env, cwd=tmp_path_factory.mktemp("lab"), stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    log: list[str] = []
    try:
        for line in process.stderr:
            log.append(line)
            if "ready to roll" in line:
                port = re.search(r"listening on 127\.0\.0\.1:(\d+)", "".join(log))
                assert port, "".join(log)
                threading.Thread(target=lambda: log.extend(process.stderr), daemon=True).start()
                yield f"http://127.0.0.1:{port.group(1)}"
                break
        else:
            raise AssertionError("lab server exited:\n" + "".join(log))
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_http_backend_reads_the_same_acceptance_as_the_reference_engine(lab_server):
    backend = HttpBackend(lab_server, API_KEY)
    spec = backend.served_spec()
    assert (spec.method, spec.budget, spec.draft_tokens, spec.drafter) == ("ddtree", 8, 16, SHIPPED_DRAFTER.name)
    prompts = [t for t in CODING_TASKS if t.name in ("fizzbuzz", "gcd")]
    local = ReferenceBackend(SHIPPED_TARGET, {SHIPPED_DRAFTER.name: SHIPPED_DRAFTER}, "cpu", "float32")
    params = SamplingParams(max_new_tokens=32, stop_token_ids=local.eos)
    served = evaluate(backend, prompts, [spec], params)[0]
    expected = evaluate(local, prompts, [spec], params)[0]
    for got, want in zip(served.prompts, expected.prompts, strict=True):
        assert got.token_ids == want.token_ids and got.text == want.text
        assert got.acceptance_lengths == want.acceptance_lengths and got.rounds == want.rounds
    assert served.mean_tau == pytest.approx(expected.mean_tau) and served.mean_tau > 1.0


def test_http_backend_reports_auth_and_request_errors(lab_server):
    with pytest.raises(EvalError, match="HTTP 401"):
        HttpBackend(lab_server, "wrong-key")
    backend = HttpBackend(lab_server, API_KEY)
    with pytest.raises(EvalError, match="HTTP 400"):
        backend.generate("", RunSpec("ar"), SamplingParams(max_new_tokens=4))


def test_cli_against_the_server_labels_the_served_configuration(lab_server, tmp_path):
    out = tmp_path / "served.json"
    argv = ["--server", lab_server, "--api-key", API_KEY, "--tasks", "gcd", "--max-new-tokens", "16"]
    assert eval_main([*argv, "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert report["backend"]["backend"] == "http" and report["backend"]["speculative_algorithm"] == "DDTREE"
    assert [r["label"] for r in report["runs"]] == ["DDTree-8"] and report["runs"][0]["tokens"] > 0
