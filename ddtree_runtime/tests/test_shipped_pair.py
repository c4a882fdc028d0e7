"""The shipped model pair (ddtree_runtime/models/): intact, in the z-lab drafter schema, exact under
speculative decoding, and a drafter that really predicts its target (the pivot gate's threshold passes
with it and fails with a random drafter of the same shape)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from ddtree_runtime.eval.backends import SHIPPED_DRAFTER, SHIPPED_MODELS, SHIPPED_TARGET, ReferenceBackend, RunSpec
from ddtree_runtime.eval.runner import evaluate
from ddtree_runtime.eval.tasks import CODING_TASKS, HELD_OUT_PROMPTS, load_prompts
from ddtree_runtime.model_layout import pair_problem
from ddtree_runtime.reference import load_dflash, load_qwen3
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tokenizer import SPECIAL_TOKENS
from ddtree_runtime.train.__main__ import main as train_main
from ddtree_runtime.train.pair import verify_checksums

RECOMMENDED_GATE = 2.0
"""The minimum acceptance length recommended for the pivot gate with this pair (docs/model-pair.md)."""
SMOKE_REQUEST = "Write a Python function fizzbuzz(n) that returns the FizzBuzz sequence up to n."


def test_checkpoints_match_their_checksums_and_stay_small():
    for directory in (SHIPPED_TARGET, SHIPPED_DRAFTER):
        assert verify_checksums(directory) == []
    total = sum(p.stat().st_size for p in SHIPPED_MODELS.rglob("*") if p.is_file())
    assert total < 16 * 2**20


def test_configs_follow_the_qwen3_and_z_lab_dflash_schemas():
    target_raw = json.loads((SHIPPED_TARGET / "config.json").read_text())
    drafter_raw = json.loads((SHIPPED_DRAFTER / "config.json").read_text())
    assert target_raw["architectures"] == ["Qwen3ForCausalLM"] and drafter_raw["architectures"] == ["DFlashDraftModel"]
    assert drafter_raw["block_size"] == 16
    assert drafter_raw["dflash_config"]["mask_token_id"] == SPECIAL_TOKENS["<|mask|>"]
    target, drafter = load_qwen3(SHIPPED_TARGET), load_dflash(SHIPPED_DRAFTER)
    assert target.config.vocab_size == drafter.config.vocab_size == 320
    # What SGLang needs to serve the pair (the first H200 runs failed on both): no drafter read of the target's last
    # layer, and a power-of-two half head_dim for its bf16 fused QK-norm/RoPE kernel.
    assert pair_problem(SHIPPED_TARGET, SHIPPED_DRAFTER) is None
    for head_dim in (target.config.head_dim, drafter.config.head_dim):
        assert (head_dim // 2) & (head_dim // 2 - 1) == 0
    assert set(target.config.eos_token_id) == {SPECIAL_TOKENS["<|endoftext|>"], SPECIAL_TOKENS["<|im_end|>"]}
    for directory in (SHIPPED_TARGET, SHIPPED_DRAFTER):
        provenance = json.loads((directory / "pivot_model.json").read_text())
        assert provenance["random_weights"] is False and provenance["pair"] == "pivot-coder-tiny"
        assert (directory / "TOKENIZER.md").is_file()
    # The target carries the byte vocabulary as a Hugging Face tokenizer (SGLang loads it); the drafter uses its
    # target's (test_tokenizer.py holds the files to what write_hf_tokenizer writes).
    assert (SHIPPED_TARGET / "tokenizer.json").is_file() and not (SHIPPED_DRAFTER / "tokenizer.json").exists()


@pytest.fixture(scope="module")
def backend() -> ReferenceBackend:
    return ReferenceBackend(SHIPPED_TARGET, {"trained": SHIPPED_DRAFTER}, "cpu", "float32")


def test_speculative_greedy_output_equals_autoregressive(backend):
    prompts = [t for t in CODING_TASKS if t.name in ("fizzbuzz", "lru_cache")] + load_prompts([HELD_OUT_PROMPTS])[:1]
    specs = [
        RunSpec("ar"),
        RunSpec("dflash", "trained"),
        RunSpec("ddtree", "trained", 16),
        RunSpec("ddtree", "trained", 64, max_topk=8),
        RunSpec("ddtree", "trained", 256),
        RunSpec("ddtree", "trained", 32, draft_tokens=6),
    ]
    results = evaluate(backend, prompts, specs, SamplingParams(max_new_tokens=40, stop_token_ids=backend.eos))
    assert all(len(p.token_ids) > 0 for p in results[0].prompts)
    for run in results[1:]:
        assert run.matches_ar is True, run.spec.label


def test_the_drafter_predicts_its_target_and_trees_accept_more(backend):
    prompts = [t for t in CODING_TASKS if t.name in ("fizzbuzz", "merge_sort", "gcd", "word_count")]
    specs = [RunSpec("dflash", "trained"), RunSpec("ddtree", "trained", 16), RunSpec("ddtree", "trained", 128)]
    chain, tree16, tree128 = evaluate(
        backend, prompts, specs, SamplingParams(max_new_tokens=48, stop_token_ids=backend.eos)
    )
    assert chain.mean_tau > 2.0
    assert tree16.mean_tau > chain.mean_tau
    assert tree128.mean_tau > tree16.mean_tau


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def served_accept_length(tmp_path: Path, drafter: Path, target: Path = SHIPPED_TARGET) -> float:
    """Serve the pair as the pivot does (DDTree, 16 draft tokens, budget 64, top-8, the qwen3 reasoning parser), send
    the role's greedy smoke request twice (128 tokens, thinking turned off) and read /server_info's
    avg_spec_accept_length, like the acceptance gate."""
    env = {**os.environ, "DDTREE_BUDGET": "64", "DDTREE_TOPK": "8", "DDTREE_LAB_TORCH_THREADS": "1"}
    argv = [
        sys.executable, "-m", "pivot_labserver", "--host", "127.0.0.1", "--port", "0",
        "--model-path", str(target), "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", str(drafter), "--speculative-num-draft-tokens", "16",
        "--reasoning-parser", "qwen3",
    ]  # fmt: skip
    process = subprocess.Popen(argv, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    log: list[str] = []
    try:
        for line in process.stderr:
            log.append(line)
            if "ready to roll" in line:
                break
        else:
            raise AssertionError("lab server exited:\n" + "".join(log))
        threading.Thread(target=lambda: log.extend(process.stderr), daemon=True).start()
        port = re.search(r"listening on 127\.0\.0\.1:(\d+)", "".join(log))
        assert port, "".join(log)
        base = f"http://127.0.0.1:{port.group(1)}"
        body = {"messages": [{"role": "user", "content": SMOKE_REQUEST}], "temperature": 0, "max_tokens": 128,
                "chat_template_kwargs": {"enable_thinking": False}}
        answers = [post(base + "/v1/chat/completions", body)["choices"][0]["message"]["content"] for _i in range(2)]
        assert answers[0] and answers[0] == answers[1]
        with urllib.request.urlopen(base + "/server_info", timeout=30) as response:
            info = json.loads(response.read())
        return float(info["internal_states"][0]["avg_spec_accept_length"])
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_pivot_gate_passes_with_the_pair_and_fails_with_a_random_drafter(tmp_path):
    assert served_accept_length(tmp_path, SHIPPED_DRAFTER) >= RECOMMENDED_GATE
    random_drafter = tmp_path / "random-dflash"
    assert train_main(["random-drafter", "--like", str(SHIPPED_DRAFTER), "--out", str(random_drafter)]) == 0
    assert served_accept_length(tmp_path, random_drafter) < RECOMMENDED_GATE
