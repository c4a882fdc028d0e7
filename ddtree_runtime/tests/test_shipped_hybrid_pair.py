"""The shipped hybrid pair (ddtree_runtime/models/pivot-coder-tiny-hybrid*): intact, in the shapes of Qwen3.6-27B's
checkpoint and the z-lab drafter's config, exact under speculative decoding, a drafter that predicts its target,
and served by the lab server, which reads the architecture from config.json."""

from __future__ import annotations

import json

import pytest
from ddtree_runtime.eval.backends import SHIPPED_HYBRID_DRAFTER, SHIPPED_HYBRID_TARGET, ReferenceBackend, RunSpec
from ddtree_runtime.eval.runner import evaluate
from ddtree_runtime.eval.tasks import CODING_TASKS, HELD_OUT_PROMPTS, load_prompts
from ddtree_runtime.model_layout import drafter_window_problem, is_hybrid_target, pair_problem
from ddtree_runtime.reference import Qwen35ForCausalLM, load_dflash, load_target
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tokenizer import SPECIAL_TOKENS
from ddtree_runtime.train.__main__ import main as train_main
from ddtree_runtime.train.pair import verify_checksums
from test_shipped_pair import RECOMMENDED_GATE, served_accept_length


def test_checkpoints_match_their_checksums_and_stay_small():
    total = 0
    for directory in (SHIPPED_HYBRID_TARGET, SHIPPED_HYBRID_DRAFTER):
        assert verify_checksums(directory) == []
        total += sum(p.stat().st_size for p in directory.iterdir())
    assert total < 6 * 2**20


def test_configs_have_the_shapes_of_qwen36_and_the_z_lab_drafter():
    from safetensors import safe_open  # noqa: PLC0415

    target_raw = json.loads((SHIPPED_HYBRID_TARGET / "config.json").read_text())
    drafter_raw = json.loads((SHIPPED_HYBRID_DRAFTER / "config.json").read_text())
    assert target_raw["architectures"] == ["Qwen3_5ForConditionalGeneration"] and is_hybrid_target(target_raw)
    text = target_raw["text_config"]
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert text["full_attention_interval"] == 4 and text["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert "vision_config" in target_raw and "num_hidden_layers" not in target_raw
    with safe_open(str(SHIPPED_HYBRID_TARGET / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert all(n.startswith(("model.language_model.", "model.visual.")) or n == "lm_head.weight" for n in names)
    assert drafter_raw["architectures"] == ["DFlashDraftModel"] and drafter_raw["block_size"] == 16
    assert drafter_raw["num_target_layers"] == text["num_hidden_layers"]
    assert drafter_raw["dflash_config"]["mask_token_id"] == SPECIAL_TOKENS["<|mask|>"]
    assert drafter_raw["head_dim"] == 64
    # z-lab's Qwen3.6 drafter has sliding-window layers before a full-attention one ([S, S, S, S, F], window 2048);
    # scaled down here to [S, F] with a window that binds on the training sequences, in the keys SGLang reads
    assert drafter_raw["layer_types"] == ["sliding_attention", "full_attention"]
    assert drafter_raw["use_sliding_window"] is True and drafter_raw["sliding_window"] == 128
    assert drafter_window_problem(drafter_raw) is None
    assert pair_problem(SHIPPED_HYBRID_TARGET, SHIPPED_HYBRID_DRAFTER) is None
    target, drafter = load_target(SHIPPED_HYBRID_TARGET), load_dflash(SHIPPED_HYBRID_DRAFTER)
    assert isinstance(target, Qwen35ForCausalLM) and target.config.vocab_size == drafter.config.vocab_size == 320
    for directory in (SHIPPED_HYBRID_TARGET, SHIPPED_HYBRID_DRAFTER):
        provenance = json.loads((directory / "pivot_model.json").read_text())
        assert provenance["random_weights"] is False and provenance["pair"] == "pivot-coder-tiny-hybrid"
        assert provenance["architecture"] == "qwen3_5" and provenance["device"].startswith("CPU")


@pytest.fixture(scope="module")
def backend() -> ReferenceBackend:
    return ReferenceBackend(SHIPPED_HYBRID_TARGET, {"trained": SHIPPED_HYBRID_DRAFTER}, "cpu", "float32")


def test_speculative_greedy_output_equals_autoregressive(backend):
    prompts = [t for t in CODING_TASKS if t.name in ("fizzbuzz", "lru_cache")] + load_prompts([HELD_OUT_PROMPTS])[:1]
    specs = [
        RunSpec("ar"),
        RunSpec("dflash", "trained"),
        RunSpec("ddtree", "trained", 16),
        RunSpec("ddtree", "trained", 64, max_topk=8),
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


def test_the_lab_server_serves_the_hybrid_pair_and_the_gate_tells_a_random_drafter(tmp_path):
    assert served_accept_length(tmp_path, SHIPPED_HYBRID_DRAFTER, SHIPPED_HYBRID_TARGET) >= RECOMMENDED_GATE
    random_drafter = tmp_path / "random-dflash"
    assert train_main(["random-drafter", "--like", str(SHIPPED_HYBRID_DRAFTER), "--out", str(random_drafter)]) == 0
    assert served_accept_length(tmp_path, random_drafter, SHIPPED_HYBRID_TARGET) < RECOMMENDED_GATE
