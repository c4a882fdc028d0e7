"""Training the hybrid pair: the batched forwards against the hybrid reference engine, and the recipe end to end at
smoke size, written in the shapes of the real checkpoints (``text_config``, ``model.language_model.*``, z-lab
drafter config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ddtree_runtime.model_layout import capture_problem, is_hybrid_target
from ddtree_runtime.reference import DFlashDrafter, Qwen35ForCausalLM, SpeculativeDecoder, load_dflash, load_target
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.train.forward import (
    PairRopes,
    RopeTable,
    drafter_block_logits,
    greedy_continue,
    target_forward,
)
from ddtree_runtime.train.loop import DraftSettings, Schedule
from ddtree_runtime.train.pair import HYBRID_PAIR_NAME, SHAPES, HybridShape, verify_checksums
from ddtree_runtime.train.pipeline import PairRecipe, make_pair, reuse_target
from test_hybrid import make_hybrid_decoder
from test_shipped_pair_training import SOURCE


@pytest.fixture(scope="module")
def pair():
    decoder = make_hybrid_decoder(seed=3)
    return decoder.target, decoder.drafter.model


def test_target_forward_matches_the_reference_logits_and_features(pair):
    """Over 80 tokens: the chunked delta rule (chunks of 32) against the reference's token-by-token one."""
    target, drafter = pair
    ids = torch.randint(0, 31, (2, 80), generator=torch.Generator().manual_seed(0))
    layers = drafter.config.target_layer_ids
    rope = RopeTable(target.rotary.inv_freq, 96, "cpu")
    with torch.no_grad():
        logits, features = target_forward(target, ids, rope, capture_layers=layers)
    for row in range(2):
        reference = target(ids[row], torch.arange(80), target.new_cache(), capture_layers=layers)
        torch.testing.assert_close(logits[row], reference.logits, rtol=0, atol=1e-10)
        torch.testing.assert_close(features[row], reference.features, rtol=0, atol=1e-10)


def test_gradients_reach_every_target_parameter(pair):
    target, _unused = pair
    model = Qwen35ForCausalLM(target.config)
    model.load_state_dict(target.state_dict())
    model.float().train()
    ids = torch.randint(0, 31, (2, 40), generator=torch.Generator().manual_seed(5))
    logits, _unused = target_forward(model, ids, RopeTable(model.rotary.inv_freq, 48, "cpu"))
    assert logits is not None
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters())


def test_drafter_block_forward_matches_the_reference_draft_call(pair):
    target, drafter = pair
    ids = torch.randint(0, 31, (2, 40), generator=torch.Generator().manual_seed(1))
    layers = drafter.config.target_layer_ids
    ropes = PairRopes.of(target, drafter, 64, "cpu")
    assert ropes.target.cos.shape[-1] < ropes.drafter.cos.shape[-1]  # partial rotary in the target only
    anchors = torch.tensor([[1, 17, 24], [9, 3, 22]])
    with torch.no_grad():
        _unused, features = target_forward(target, ids, ropes.target, capture_layers=layers)
        logits = drafter_block_logits(drafter, target, features, ids, anchors, rope=ropes.drafter)
    reference = DFlashDrafter(drafter, target)
    for row in range(2):
        for column, anchor in enumerate(anchors[row].tolist()):
            expected = reference.draft(
                reference.new_state(), ids[row, :anchor].tolist(), int(ids[row, anchor]), features[row, :anchor]
            )
            torch.testing.assert_close(logits[row, column], expected, rtol=0, atol=1e-10)


def test_cached_greedy_generation_equals_reference_ar(pair):
    target, _unused = pair
    prompts = torch.randint(0, 31, (3, 7), generator=torch.Generator().manual_seed(2))
    out = greedy_continue(target, prompts, 10, RopeTable(target.rotary.inv_freq, 32, "cpu"), torch.float64)
    decoder = SpeculativeDecoder(target)
    for row in range(3):
        expected = decoder.generate(prompts[row].tolist(), SamplingParams(max_new_tokens=10), "ar").tokens
        assert out[row, 7:].tolist() == expected


def test_hybrid_shapes_follow_qwen36s_pattern_and_sglangs_capture_rule():
    for name in ("tiny-hybrid", "smoke-hybrid"):
        shape = SHAPES[name]
        assert isinstance(shape, HybridShape) and shape.pair_name == HYBRID_PAIR_NAME
        assert shape.target_layers % shape.full_attention_interval == 0
        assert capture_problem(shape.target_layer_ids, shape.target_layers) is None
        assert shape.head_dim == 64 or name.startswith("smoke")


def smoke_corpus(root: Path) -> Path:
    """Six small source files under ``root`` (made if missing): enough for a two-step smoke training run."""
    root.mkdir(parents=True, exist_ok=True)
    for index in range(6):
        (root / f"mod{index}.py").write_text(SOURCE * 3)
    return root


def smoke_hybrid_recipe() -> PairRecipe:
    quick = Schedule(seconds=60, max_steps=2, batch=2, lr=1e-3, warmup_steps=1, log_every=1)
    draft = DraftSettings(prompt_tokens=16, new_tokens=16, distill_batch=4, distill_seconds=60, distill_max_batches=1,
                          anchors_per_sequence=2)
    return PairRecipe(shape="smoke-hybrid", seq_len=32, target=quick, drafter=quick, draft=draft,
                      held_out_per_mille=500)


@pytest.fixture(scope="module")
def smoke_hybrid_pair(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("pair")
    make_pair(smoke_hybrid_recipe(), output, "cpu", smoke_corpus(tmp_path_factory.mktemp("corpus")))
    return output


def test_recipe_writes_a_hybrid_pair_in_the_real_checkpoints_shapes(smoke_hybrid_pair):
    from safetensors import safe_open  # noqa: PLC0415

    target_dir = smoke_hybrid_pair / HYBRID_PAIR_NAME
    drafter_dir = smoke_hybrid_pair / f"{HYBRID_PAIR_NAME}-dflash"
    config = json.loads((target_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"] and is_hybrid_target(config)
    assert config["text_config"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert config["vision_config"]["out_hidden_size"] == config["text_config"]["hidden_size"]
    assert config["torch_dtype"] == "bfloat16"
    with safe_open(str(target_dir / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert "model.language_model.layers.0.linear_attn.A_log" in names and "lm_head.weight" in names
    assert any(name.startswith("model.visual.") for name in names)
    assert not any(name.startswith("model.layers.") for name in names)
    drafter_config = json.loads((drafter_dir / "config.json").read_text())
    assert drafter_config["num_target_layers"] == 4
    assert drafter_config["dflash_config"] == {"target_layer_ids": [0, 1], "mask_token_id": 261}
    target, drafter = load_target(target_dir), load_dflash(drafter_dir)
    assert isinstance(target, Qwen35ForCausalLM)
    DFlashDrafter(drafter, target)
    for directory in (target_dir, drafter_dir):
        assert verify_checksums(directory) == []
        provenance = json.loads((directory / "pivot_model.json").read_text())
        assert provenance["architecture"] == "qwen3_5" and provenance["target_steps"] == 2
        assert provenance["vision_tower"].startswith("transformers' random init")
    # Like Qwen3.6-27B's checkpoint, the target carries its processor and tokenizer (SGLang loads both at start).
    assert {"preprocessor_config.json", "video_preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja"} <= {p.name for p in target_dir.iterdir()}
    assert not (drafter_dir / "tokenizer.json").exists()


def test_a_drafter_retrained_on_a_kept_target_leaves_the_target_bytes_as_they_were(smoke_hybrid_pair, tmp_path):
    """``train pair --target-from``: a drafter layout change (the shipped pair's sliding-window layers) retrains only
    the drafter; the target is read back and written again byte for byte, and both records say where it came from."""
    target_dir = smoke_hybrid_pair / HYBRID_PAIR_NAME
    output = tmp_path / "again"
    provenance = make_pair(smoke_hybrid_recipe(), output, "cpu", smoke_corpus(tmp_path / "corpus"),
                           target_from=target_dir)
    assert provenance["target_reused_from"]["path"] == HYBRID_PAIR_NAME
    assert provenance["target_steps"] == 2
    written = (output / HYBRID_PAIR_NAME / "model.safetensors").read_bytes()
    assert written == (target_dir / "model.safetensors").read_bytes()
    for directory in (output / HYBRID_PAIR_NAME, output / f"{HYBRID_PAIR_NAME}-dflash"):
        assert verify_checksums(directory) == []
        assert json.loads((directory / "pivot_model.json").read_text())["target_reused_from"]["target_steps"] == 2


def test_only_a_trained_target_is_kept(smoke_hybrid_pair, tmp_path):
    drafter_dir = smoke_hybrid_pair / f"{HYBRID_PAIR_NAME}-dflash"
    with pytest.raises(ValueError, match="is not a trained target written by `train pair`"):
        reuse_target(drafter_dir, "cpu", "smoke-hybrid")


def test_a_target_of_another_shape_is_refused_by_name(smoke_hybrid_pair):
    with pytest.raises(ValueError, match="trained for --shape smoke-hybrid, not tiny-hybrid"):
        reuse_target(smoke_hybrid_pair / HYBRID_PAIR_NAME, "cpu", "tiny-hybrid")
