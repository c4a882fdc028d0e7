"""The pure-PyTorch Qwen3 target and DFlash drafter: checkpoint formats, parity with transformers, tree forward."""

from __future__ import annotations

import json

import pytest
import torch
from ddtree_runtime.reference import (
    DFlashConfig,
    DFlashDrafter,
    build_target_layer_ids,
    load_dflash,
    load_qwen3,
    random_dflash,
    random_qwen3,
    save_dflash,
    save_qwen3,
)
from ddtree_runtime.reference.tiny import TINY_TARGET_LAYERS, tiny_drafter_config, tiny_target_config
from ddtree_runtime.tree import build_tree


def hf_qwen3(tmp_path):
    transformers = pytest.importorskip("transformers", reason="parity check needs the [reference] extra")
    config = transformers.Qwen3Config(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=TINY_TARGET_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    return model


def test_loads_a_transformers_qwen3_checkpoint_and_matches_its_logits_and_hidden_states(tmp_path):
    reference = hf_qwen3(tmp_path)
    ours = load_qwen3(tmp_path)
    ids = torch.tensor([3, 17, 5, 40, 2, 9, 11])
    with torch.no_grad():
        expected = reference(ids[None], output_hidden_states=True)
    layers = list(range(TINY_TARGET_LAYERS))
    out = ours(ids, torch.arange(len(ids)), ours.new_cache(), capture_layers=layers)
    assert torch.allclose(out.logits, expected.logits[0], atol=1e-5)
    expected_features = torch.cat([expected.hidden_states[i + 1][0] for i in layers], dim=-1)
    assert torch.allclose(out.features, expected_features, atol=1e-5)


def test_incremental_decoding_matches_a_full_forward():
    target = random_qwen3(tiny_target_config(), 3, std=0.3).double()
    ids = torch.tensor([1, 4, 9, 16, 25, 3, 7])
    full = target(ids, torch.arange(7), target.new_cache()).logits
    cache = target.new_cache()
    target(ids[:4], torch.arange(4), cache)
    for i in range(4, 7):
        step = target(ids[i : i + 1], torch.tensor([i]), cache).logits
        assert torch.allclose(step[0], full[i], atol=1e-12)


def test_qwen3_save_load_round_trip_and_tied_embeddings(tmp_path):
    config = tiny_target_config()
    model = random_qwen3(config, 1)
    save_qwen3(model, tmp_path / "a")
    loaded = load_qwen3(tmp_path / "a")
    for (name, a), (_unused, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    raw = json.loads((tmp_path / "a" / "config.json").read_text())
    raw["tie_word_embeddings"] = True
    (tmp_path / "a" / "config.json").write_text(json.dumps(raw))
    tied = load_qwen3(tmp_path / "a")
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()


def test_qwen3_loader_rejects_unsupported_and_mismatched_checkpoints(tmp_path):
    model = random_qwen3(tiny_target_config(), 1)
    save_qwen3(model, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 5}))
    with pytest.raises(ValueError, match="mismatch"):
        load_qwen3(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**raw, "use_sliding_window": True}))
    with pytest.raises(ValueError, match="sliding"):
        load_qwen3(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**raw, "rope_parameters": {"rope_type": "yarn"}}))
    with pytest.raises(ValueError, match="rope_type"):
        load_qwen3(tmp_path)


def zlab_style_config() -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": 16,
        "num_hidden_layers": 5,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "max_position_embeddings": 40960,
        "vocab_size": 32,
        "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
        "sliding_window": 2048,
        "use_sliding_window": True,
        "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 31},
    }


def test_drafter_reads_the_zlab_config_format(tmp_path):
    config = DFlashConfig.from_dict(zlab_style_config())
    assert (config.block_size, config.mask_token_id, config.target_layer_ids) == (16, 31, [1, 2])
    assert config.rope_theta == 1e6 and config.sliding_window == 2048
    model = random_dflash(config, 0)
    assert [layer.self_attn.is_causal for layer in model.layers] == [True] * 4 + [False]
    assert [layer.self_attn.window for layer in model.layers] == [2048] * 4 + [None]
    save_dflash(model, tmp_path)
    names = set(json.loads(json.dumps(list(load_dflash(tmp_path).state_dict()))))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= names
    assert not any("embed" in n or "lm_head" in n for n in names)


def test_a_saved_sliding_window_drafter_keeps_its_window_in_transformers_config():
    """SGLang reads a drafter's config.json through transformers, whose qwen3 config drops ``sliding_window`` unless
    ``use_sliding_window`` is true (a drafter written without it killed SGLang's scheduler on the H200)."""
    transformers = pytest.importorskip("transformers")
    written = DFlashConfig.from_dict(zlab_style_config()).to_dict()
    assert written["use_sliding_window"] is True
    assert transformers.Qwen3Config(**written).sliding_window == 2048
    assert DFlashConfig.from_dict(written).sliding_window == 2048
    full_only = DFlashConfig.from_dict({**zlab_style_config(), "layer_types": [], "sliding_window": None}).to_dict()
    assert "use_sliding_window" not in full_only


def test_drafter_config_errors(tmp_path):
    raw = zlab_style_config()
    with pytest.raises(ValueError, match="target_layer_ids"):
        DFlashConfig.from_dict({**raw, "dflash_config": {"mask_token_id": 3}})
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashConfig.from_dict({**raw, "dflash_config": {"target_layer_ids": [1]}})
    with pytest.raises(ValueError, match="sliding_window"):
        DFlashConfig.from_dict({**raw, "sliding_window": None})
    without_switch = {key: value for key, value in raw.items() if key != "use_sliding_window"}
    with pytest.raises(ValueError, match="use_sliding_window: true"):
        DFlashConfig.from_dict(without_switch)
    save_qwen3(random_qwen3(tiny_target_config(), 0), tmp_path)
    with pytest.raises(ValueError, match="not a DFlash drafter"):
        load_dflash(tmp_path)


def test_drafter_binding_checks_the_target():
    target = random_qwen3(tiny_target_config(), 0)
    raw = zlab_style_config()
    bad_layers = DFlashConfig.from_dict({**raw, "dflash_config": {"target_layer_ids": [9], "mask_token_id": 1}})
    with pytest.raises(ValueError, match="outside the target's layers"):
        DFlashDrafter(random_dflash(bad_layers, 0), target)
    bad_mask = DFlashConfig.from_dict({**raw, "dflash_config": {"target_layer_ids": [1], "mask_token_id": 99}})
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashDrafter(random_dflash(bad_mask, 0), target)


def test_default_target_layer_ids_spread_from_layer_one():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(10, 1) == [5]


@pytest.mark.parametrize("sliding", [False, True])
def test_draft_is_independent_of_how_the_context_was_chunked(sliding):
    """Appending context features in one call or across calls gives the same block logits (KV injection)."""
    target = random_qwen3(tiny_target_config(), 0, std=0.3).double()
    drafter = DFlashDrafter(random_dflash(tiny_drafter_config(sliding=sliding), 1, std=0.3).double(), target)
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    features = target(ids, torch.arange(10), target.new_cache(), capture_layers=drafter.feature_layers).features
    one_shot = drafter.draft(drafter.new_state(), ids[:10].tolist(), 7, features)
    state = drafter.new_state()
    drafter.draft(state, ids[:4].tolist(), int(ids[4]), features[:4])
    chunked = drafter.draft(state, ids[:10].tolist(), 7, features[4:])
    assert one_shot.shape == (15, 32)
    assert torch.allclose(one_shot, chunked, atol=1e-12)


def test_tree_node_logits_equal_the_chain_logits_of_their_path():
    target = random_qwen3(tiny_target_config(), 5, std=0.3).double()
    prompt = torch.tensor([4, 8, 15, 16, 23])
    cache = target.new_cache()
    target(prompt, torch.arange(5), cache)
    tree = build_tree(torch.randn(4, 32, generator=torch.Generator().manual_seed(0)), 20)
    ids = tree.verify_input_ids(42 % 32)
    out = target(ids, tree.positions(5), cache, attention_mask=tree.attention_mask(5))
    for node in range(tree.num_nodes + 1):
        path = tree.path_to(node)
        chain = torch.cat([prompt, ids[path]])
        expected = target(chain, torch.arange(len(chain)), target.new_cache()).logits[-1]
        assert torch.allclose(out.logits[node], expected, atol=1e-10)


def test_target_rejects_a_mask_of_the_wrong_shape():
    target = random_qwen3(tiny_target_config(), 0)
    with pytest.raises(ValueError, match="attention_mask"):
        bad_mask = torch.ones(2, 3, dtype=torch.bool)
        target(torch.tensor([1, 2]), torch.arange(2), target.new_cache(), attention_mask=bad_mask)
