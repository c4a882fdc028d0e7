"""The Qwen3.5/3.6 hybrid target (Gated DeltaNet + gated attention): parity with transformers, checkpoint layouts,
tree verification over recurrent state, and decoder exactness (greedy, commit state, sampled distribution)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from ddtree_runtime.model_layout import hybrid_layer_types, is_hybrid_target
from ddtree_runtime.reference import (
    HybridCache,
    Qwen35ForCausalLM,
    SpeculativeDecoder,
    load_qwen35,
    load_target,
    random_qwen35,
    save_qwen35,
    target_architecture,
)
from ddtree_runtime.reference.gated_deltanet import (
    DeltaInputs,
    PathLayout,
    gated_delta_chunked,
    gated_delta_tree,
    tree_causal_conv,
)
from ddtree_runtime.reference.tiny import tiny_decoder, tiny_hybrid_config, tiny_hybrid_pair
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tree import build_tree, parents_from_visibility, visibility_from_parents
from test_decoding import (
    BUDGETS,
    DRAFT_TOKENS,
    SAMPLE_PROMPT,
    SAMPLE_TOKENS,
    SAMPLE_VOCAB,
    SAMPLES,
    NoisyOracleDrafter,
    exact_sequence_distribution,
    sequences_within_bounds,
)

HF_TEXT = {
    "vocab_size": 48, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}
HF_VISION = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
             "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 16}
HF_VISION_TOKENS = {"image_token_id": 44, "video_token_id": 45, "vision_start_token_id": 46, "vision_end_token_id": 47}


def make_hybrid_decoder(vocab: int = 32, seed: int = 0, std: float = 0.3) -> SpeculativeDecoder:
    target, drafter = tiny_hybrid_pair(vocab, seed, std=std)
    return tiny_decoder(target.double(), drafter.double())


@pytest.fixture(scope="module")
def hybrid_decoder() -> SpeculativeDecoder:
    return make_hybrid_decoder()


WEIGHT_STD = 0.06
"""Random weights large enough that logits span more than a unit (transformers' own init makes them near-constant) and
small enough that float32 rounding stays below the 1e-5 tolerance. The rounding depends on the CPU's kernels: at std
0.1 the 4-layer model's captured features were 1.3e-5 to 2.9e-5 apart on an AVX-512 Xeon (three seeds) while
passing elsewhere, and the deeper 3:1 stacks below drift up to 7e-5 apart (2.4e-5 on the 1:1 one), while both in float64
(transformers' internal float32 casts patched out) agree to 1e-7. At 0.06 the largest float32 gap is 5.3e-6 on that
Xeon (three seeds, features) and below 6e-6 over six seeds per layout variant."""


def spread_weights_(model: torch.nn.Module, seed: int, std: float = WEIGHT_STD) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                continue
            scale = 0.3 if "norm" in name else std
            offset = 1.0 if "linear_attn.norm" in name else 0.0
            param.copy_(torch.randn(param.shape, generator=generator) * scale + offset)


@pytest.fixture(scope="module")
def hf_multimodal(tmp_path_factory):
    transformers = pytest.importorskip("transformers", reason="parity check needs the [reference] extra")
    config = transformers.Qwen3_5Config(text_config=dict(HF_TEXT), vision_config=dict(HF_VISION), **HF_VISION_TOKENS)
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    spread_weights_(model.model.language_model, 1)
    spread_weights_(model.lm_head, 2)
    directory = tmp_path_factory.mktemp("qwen3_5")
    model.save_pretrained(directory)
    return model, directory


# -- parity with transformers and checkpoint layouts --------------------------------------------------------


def test_multimodal_checkpoint_logits_and_features_equal_transformers(hf_multimodal):
    reference, directory = hf_multimodal
    assert target_architecture(directory) == "qwen3_5"
    ours = load_target(directory)
    assert isinstance(ours, Qwen35ForCausalLM)
    assert ours.config.layer_types == ["linear_attention", "full_attention"] * 2
    # 100 tokens: transformers' chunked DeltaNet crosses its 64-token chunk boundary.
    ids = torch.randint(0, 44, (100,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(input_ids=ids[None], output_hidden_states=True)
    layers = [0, 1, 2, 3]
    out = ours(ids, torch.arange(100), ours.new_cache(), capture_layers=layers)
    assert float(expected.logits.abs().max()) > 1.0
    torch.testing.assert_close(out.logits, expected.logits[0], rtol=0, atol=1e-5)
    features = torch.cat([expected.hidden_states[i + 1][0] for i in layers], dim=-1)
    torch.testing.assert_close(out.features, features, rtol=0, atol=1e-5)


THREE_TO_ONE = ["linear_attention"] * 3 + ["full_attention"]
ONE_TO_ONE = ["linear_attention", "full_attention"] * 2


@dataclass(frozen=True)
class CheckpointVariant:
    """Text settings and outer (multimodal) settings of a transformers checkpoint, and what loading it must give."""

    text: dict
    layer_types: list[str]
    outer: dict = field(default_factory=dict)
    interval_only: bool = False
    """Rewrite the saved ``text_config`` to carry the pattern only as ``full_attention_interval``, as a hand-written
    config may (transformers itself always writes the expanded ``layer_types``)."""
    rotary_dim: int = 4


CHECKPOINT_VARIANTS = {
    "3to1-as-layer_types": CheckpointVariant(
        {**{k: v for k, v in HF_TEXT.items() if k != "full_attention_interval"}, "layer_types": THREE_TO_ONE},
        THREE_TO_ONE),
    "3to1-from-full_attention_interval": CheckpointVariant(
        {**HF_TEXT, "num_hidden_layers": 8, "full_attention_interval": 4}, THREE_TO_ONE * 2, interval_only=True),
    "2to1-from-a-non-default-interval": CheckpointVariant(
        {**HF_TEXT, "num_hidden_layers": 6, "full_attention_interval": 3},
        ["linear_attention", "linear_attention", "full_attention"] * 2, interval_only=True),
    "tied-word-embeddings": CheckpointVariant(dict(HF_TEXT), ONE_TO_ONE, outer={"tie_word_embeddings": True}),
    "partial-rotary-0.5": CheckpointVariant(
        {**HF_TEXT, "rope_parameters": {**HF_TEXT["rope_parameters"], "partial_rotary_factor": 0.5}}, ONE_TO_ONE,
        rotary_dim=8),
}


def save_hf_multimodal(directory: Path, variant: CheckpointVariant) -> None:
    transformers = pytest.importorskip("transformers", reason="parity check needs the [reference] extra")
    config = transformers.Qwen3_5Config(text_config=dict(variant.text), vision_config=dict(HF_VISION),
                                        **HF_VISION_TOKENS, **variant.outer)
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    spread_weights_(model.model.language_model, 1, WEIGHT_STD)
    if not model.config.tie_word_embeddings:
        spread_weights_(model.lm_head, 2, WEIGHT_STD)
    model.save_pretrained(directory)
    if variant.interval_only:
        raw = json.loads((directory / "config.json").read_text())
        del raw["text_config"]["layer_types"]
        raw["text_config"]["full_attention_interval"] = variant.text["full_attention_interval"]
        (directory / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("name", list(CHECKPOINT_VARIANTS))
def test_checkpoint_variants_load_with_transformers_logits(tmp_path, name):
    """The layouts a Qwen3.5/3.6 checkpoint comes in: both libraries read the same directory, agree on its layer
    pattern, and give the same float32 logits over 100 tokens (across the 64-token DeltaNet chunk boundary)."""
    transformers = pytest.importorskip("transformers", reason="parity check needs the [reference] extra")
    variant = CHECKPOINT_VARIANTS[name]
    save_hf_multimodal(tmp_path, variant)
    reference = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    ours = load_target(tmp_path)
    assert ours.config.layer_types == reference.config.text_config.layer_types == variant.layer_types
    assert ours.config.rotary_dim == variant.rotary_dim
    tied = ours.lm_head.weight is ours.model.embed_tokens.weight
    assert tied == ours.config.tie_word_embeddings == variant.outer.get("tie_word_embeddings", False)
    ids = torch.randint(0, 44, (100,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(input_ids=ids[None]).logits[0]
    assert float(expected.abs().max()) > 1.0
    torch.testing.assert_close(ours(ids, torch.arange(100), ours.new_cache()).logits, expected, rtol=0, atol=1e-5)


def test_cached_decoding_equals_transformers_with_its_own_cache(hf_multimodal):
    reference, directory = hf_multimodal
    ours = load_qwen35(directory)
    ids = torch.randint(0, 44, (30,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        first = reference(input_ids=ids[None, :20], use_cache=True)
        cache, steps = first.cache, []
        for i in range(20, 30):
            step = reference(input_ids=ids[None, i : i + 1], cache=cache, use_cache=True)
            cache = step.cache
            steps.append(step.logits[0, -1])
    ours_cache = ours.new_cache()
    ours(ids[:20], torch.arange(20), ours_cache)
    mine = [ours(ids[i : i + 1], torch.tensor([i]), ours_cache).logits[0] for i in range(20, 30)]
    torch.testing.assert_close(torch.stack(mine), torch.stack(steps), rtol=0, atol=1e-5)


def test_text_only_checkpoint_loads_too(tmp_path):
    transformers = pytest.importorskip("transformers", reason="parity check needs the [reference] extra")
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**HF_TEXT)).eval()
    spread_weights_(model, 5)
    model.save_pretrained(tmp_path)
    ours = load_target(tmp_path)
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    with torch.no_grad():
        expected = model(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(ours(ids, torch.arange(8), ours.new_cache()).logits, expected, rtol=0, atol=1e-5)


def test_saved_checkpoint_keeps_the_multimodal_layout_and_transformers_reads_it(hf_multimodal, tmp_path):
    transformers = pytest.importorskip("transformers", reason="parity check needs the [reference] extra")
    _unused, directory = hf_multimodal
    ours = load_qwen35(directory)
    save_qwen35(ours, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert raw["text_config"]["layer_types"] == ours.config.layer_types
    assert raw["vision_config"]["depth"] == 1 and raw["image_token_id"] == 44
    assert is_hybrid_target(raw)
    reloaded = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[7, 3, 9, 27, 11]])
    with torch.no_grad():
        expected = reloaded(input_ids=ids).logits[0]
    torch.testing.assert_close(ours(ids[0], torch.arange(5), ours.new_cache()).logits, expected, rtol=0, atol=1e-5)


def test_loader_rejects_a_checkpoint_with_missing_or_foreign_tensors(tmp_path):
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    model = random_qwen35(tiny_hybrid_config(), 0)
    save_qwen35(model, tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    save_file({**weights, "model.visual.blocks.0.attn.qkv.weight": torch.zeros(3), "mtp.fc.weight": torch.zeros(2)},
              str(tmp_path / "model.safetensors"))
    load_qwen35(tmp_path)  # the vision tower and multi-token-prediction weights are not the text model's
    save_file({**weights, "model.extra.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="unexpected"):
        load_qwen35(tmp_path)
    weights.pop("model.norm.weight")
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="missing"):
        load_qwen35(tmp_path)


def test_layer_types_come_from_the_list_or_the_interval():
    assert hybrid_layer_types({"num_hidden_layers": 8}) == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert hybrid_layer_types({"num_hidden_layers": 3, "full_attention_interval": 3})[-1] == "full_attention"
    assert hybrid_layer_types({"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2}) == ["full_attention"] * 2
    with pytest.raises(ValueError, match="layer_types"):
        hybrid_layer_types({"num_hidden_layers": 2, "layer_types": ["mamba", "full_attention"]})
    assert is_hybrid_target({"architectures": ["Qwen3_5ForConditionalGeneration"]})
    assert is_hybrid_target({"text_config": {"layer_types": ["linear_attention"]}})
    assert not is_hybrid_target({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"})


# -- the recurrence over trees ---------------------------------------------------------------------------


def random_recurrence_inputs(count: int, seed: int) -> tuple[DeltaInputs, torch.Tensor]:
    """Token-major inputs for 2 heads (d_k 4, d_v 3) and a random initial state."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    def uniform(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=generator, dtype=torch.float64)

    unit = torch.nn.functional.normalize
    inputs = DeltaInputs(unit(randn(count, 2, 4), dim=-1), unit(randn(count, 2, 4), dim=-1), randn(count, 2, 3),
                         -uniform(count, 2), uniform(count, 2))
    return inputs, randn(2, 4, 3)


def select(inputs: DeltaInputs, nodes: list[int]) -> DeltaInputs:
    return DeltaInputs(*(getattr(inputs, name)[nodes] for name in ("q", "k", "v", "log_decay", "beta")))


def path_of(parents: torch.Tensor, node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


def test_each_tree_node_gets_its_paths_chain_state_and_conv_window():
    inputs, initial = random_recurrence_inputs(7, 0)
    parents = torch.tensor([-1, 0, 0, 1, 2, 2, 5])
    layout = PathLayout.of(parents, 4)
    out, states = gated_delta_tree(inputs, initial, layout)
    generator = torch.Generator().manual_seed(1)
    x, weight, history = (torch.randn(*shape, generator=generator, dtype=torch.float64)
                          for shape in ((7, 5), (5, 4), (3, 5)))
    conv, windows = tree_causal_conv(x, weight, history, layout)
    for node in range(7):
        path = path_of(parents, node)
        chain = PathLayout.of(torch.arange(len(path)) - 1, 4)
        chain_out, chain_states = gated_delta_tree(select(inputs, path), initial, chain)
        torch.testing.assert_close(out[node], chain_out[-1], rtol=0, atol=1e-12)
        torch.testing.assert_close(states[node], chain_states[-1], rtol=0, atol=1e-12)
        chain_conv, chain_windows = tree_causal_conv(x[path], weight, history, chain)
        torch.testing.assert_close(conv[node], chain_conv[-1], rtol=0, atol=1e-12)
        torch.testing.assert_close(windows[node], chain_windows[-1], rtol=0, atol=1e-12)
    along_path = torch.cat([history, x[[0, 2, 5, 6]]]).t()[None]
    expected = torch.nn.functional.conv1d(along_path, weight[:, None], groups=5)
    torch.testing.assert_close(conv[6], expected[0, :, -1], rtol=0, atol=1e-12)


def test_chunked_recurrence_equals_the_token_by_token_one():
    inputs, initial = random_recurrence_inputs(150, 1)
    stepwise, states = gated_delta_tree(inputs, initial, PathLayout.of(torch.arange(150) - 1, 4))
    heads_first = DeltaInputs(*(getattr(inputs, name).transpose(0, 1) for name in ("q", "k", "v", "log_decay", "beta")))
    chunked, final = gated_delta_chunked(heads_first, initial, chunk_size=64)
    torch.testing.assert_close(chunked.transpose(0, 1), stepwise, rtol=0, atol=1e-12)
    torch.testing.assert_close(final, states[-1], rtol=0, atol=1e-12)


def test_tree_node_logits_equal_the_chain_logits_of_their_path(hybrid_decoder):
    target = hybrid_decoder.target
    prompt = torch.tensor([4, 8, 15, 16, 23])
    cache = target.new_cache()
    target(prompt, torch.arange(5), cache)
    tree = build_tree(torch.randn(4, 32, generator=torch.Generator().manual_seed(0)), 20)
    assert tree.max_depth >= 2 and len(tree.child_maps[0]) >= 2
    ids = tree.verify_input_ids(10)
    out = target(ids, tree.positions(5), cache, attention_mask=tree.attention_mask(5))
    for node in range(tree.num_nodes + 1):
        chain = torch.cat([prompt, ids[tree.path_to(node)]])
        expected = target(chain, torch.arange(len(chain)), target.new_cache()).logits[-1]
        torch.testing.assert_close(out.logits[node], expected, rtol=0, atol=1e-10)


def test_only_tree_masks_reach_the_recurrent_layers(hybrid_decoder):
    target = hybrid_decoder.target
    cache = target.new_cache()
    target(torch.tensor([1, 2]), torch.arange(2), cache)
    parents = torch.tensor([-1, 0, 0, 1])
    sibling_peek = visibility_from_parents(parents)
    sibling_peek[3, 2] = True  # node 3, under node 1, would also see node 1's sibling 2
    with pytest.raises(ValueError, match="tree"):
        parents_from_visibility(sibling_peek)
    assert parents_from_visibility(visibility_from_parents(parents)).tolist() == parents.tolist()
    parents = torch.tensor([-1, 0, 0])
    hidden_past = torch.cat([torch.tensor([[False, True]] * 3), visibility_from_parents(parents)], dim=1)
    with pytest.raises(ValueError, match="committed"):
        target(torch.tensor([3, 4, 5]), torch.tensor([2, 3, 3]), cache, attention_mask=hidden_past)


def test_hybrid_cache_commits_only_what_was_verified(hybrid_decoder):
    target = hybrid_decoder.target
    cache = target.new_cache()
    target(torch.tensor([1, 2, 3]), torch.arange(3), cache)
    tree_mask = torch.cat([torch.ones(3, 3, dtype=torch.bool), visibility_from_parents(torch.tensor([-1, 0, 0]))], 1)
    target(torch.tensor([4, 5, 6]), torch.tensor([3, 4, 4]), cache, attention_mask=tree_mask)
    with pytest.raises(RuntimeError, match="compact"):
        target(torch.tensor([7]), torch.tensor([6]), cache)
    with pytest.raises(ValueError, match="chain prefix"):
        cache.crop(6)
    with pytest.raises(ValueError, match="path"):
        cache.compact(3, [0, 1, 2])
    cache.compact(3, [0, 2])
    assert cache.length == 5
    with pytest.raises(ValueError, match="last forward"):
        cache.crop(2)


# -- decoders -------------------------------------------------------------------------------------------


HYBRID_PROMPTS = [[1, 2, 3], [30, 7], [5, 5, 5, 5, 5, 9], [31, 31, 31], [12, 19, 2, 27, 3, 8, 8, 1]]


@pytest.mark.parametrize("prompt", HYBRID_PROMPTS)
def test_greedy_ddtree_equals_dflash_equals_autoregressive(hybrid_decoder, prompt):
    """Budgets {0, 1, 4, 16, 64} x draft tokens {1, 4, 16}. Draft tokens count the bonus as SGLang's
    ``--speculative-num-draft-tokens`` does, so 1 is a real setting: no drafts, autoregressive decoding through
    the speculative loop (every round accepts exactly 1)."""
    params = SamplingParams(max_new_tokens=20)
    expected = hybrid_decoder.generate(prompt, params, "ar").tokens
    assert len(expected) == 20
    for draft_tokens in DRAFT_TOKENS:
        dflash = hybrid_decoder.generate(prompt, params, "dflash", draft_tokens=draft_tokens)
        assert dflash.tokens == expected, ("dflash", draft_tokens)
        for budget in BUDGETS:
            ddtree = hybrid_decoder.generate(prompt, params, "ddtree", draft_tokens=draft_tokens, budget=budget)
            assert ddtree.tokens == expected, ("ddtree", draft_tokens, budget)
            assert all(1 <= a <= draft_tokens for a in ddtree.stats.acceptance_lengths)
            if budget == 0 or draft_tokens == 1:
                assert set(ddtree.stats.acceptance_lengths) == {1}


@pytest.fixture(scope="module")
def hybrid_oracle(hybrid_decoder):
    return SpeculativeDecoder(hybrid_decoder.target, NoisyOracleDrafter(hybrid_decoder))


def accepted_paths(decoder: SpeculativeDecoder, prompt: list[int], params: SamplingParams, **kwargs) -> list[list[int]]:
    """The accepted node lists of every DDTree round (recorded around the cache's compact)."""
    paths: list[list[int]] = []
    original = HybridCache.compact

    def recording(self: HybridCache, start: int, accepted: list[int]) -> None:
        paths.append(list(accepted))
        original(self, start, accepted)

    HybridCache.compact = recording  # type: ignore[method-assign]
    try:
        decoder.generate(prompt, params, "ddtree", **kwargs)
    finally:
        HybridCache.compact = original  # type: ignore[method-assign]
    return paths


def test_long_accepted_paths_through_siblings_are_exact(hybrid_oracle):
    params = SamplingParams(max_new_tokens=30)
    expected = hybrid_oracle.generate([1, 2, 3], params, "ar").tokens
    assert hybrid_oracle.generate([1, 2, 3], params, "dflash", draft_tokens=16).tokens == expected
    tree = hybrid_oracle.generate([1, 2, 3], params, "ddtree", draft_tokens=16, budget=64)
    assert tree.tokens == expected and max(tree.stats.acceptance_lengths) > 4
    paths = accepted_paths(hybrid_oracle, [1, 2, 3], params, draft_tokens=16, budget=64)
    # Some round accepts a path that leaves the first-child spine: its nodes are not 0, 1, 2, ...
    assert any(path != list(range(len(path))) for path in paths)


def assert_hybrid_state_equals_chain_prefill(target: Qwen35ForCausalLM, cache: HybridCache, committed: list[int]):
    fresh = target.new_cache()
    target(torch.tensor(committed), torch.arange(len(committed)), fresh)
    assert cache.length == fresh.length == len(committed)
    for layer in target.config.attention_layers:
        for ours, expected in zip(cache.live(layer), fresh.live(layer), strict=True):
            torch.testing.assert_close(ours, expected, rtol=0, atol=1e-10)
    for layer in target.config.linear_layers:
        for ours, expected in zip(cache.linear_state(layer), fresh.linear_state(layer), strict=True):
            torch.testing.assert_close(ours, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("method", ["ddtree", "dflash"])
def test_state_after_commit_equals_a_chain_prefill_of_the_committed_tokens(hybrid_oracle, method):
    prompt = [9, 8, 7]
    result = hybrid_oracle.generate(prompt, SamplingParams(max_new_tokens=33), method, budget=48, keep_cache=True)
    assert isinstance(result.target_cache, HybridCache) and max(result.stats.acceptance_lengths) > 2
    # The final bonus token is in the output but not yet in the cache.
    assert_hybrid_state_equals_chain_prefill(hybrid_oracle.target, result.target_cache, prompt + result.tokens[:-1])


class ForwardRecorder:
    """Records, through module hooks, each forward of a target (its token count and whether it got a tree mask)
    and the token count of every call of each of its decoder layers."""

    def __init__(self, target: Qwen35ForCausalLM) -> None:
        self.forwards: list[tuple[int, bool]] = []
        self.layer_calls: dict[int, list[int]] = {index: [] for index in range(len(target.model.layers))}
        self.handles = [target.register_forward_pre_hook(self._on_forward, with_kwargs=True)]
        for index, layer in enumerate(target.model.layers):
            self.handles.append(layer.register_forward_pre_hook(self._on_layer(index)))

    def _on_forward(self, _module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.forwards.append((args[0].shape[0], kwargs.get("attention_mask") is not None))

    def _on_layer(self, index: int) -> Callable[[torch.nn.Module, tuple], None]:
        def record(_module: torch.nn.Module, args: tuple) -> None:
            self.layer_calls[index].append(args[0].shape[0])

        return record

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_ddtree_round_is_one_target_forward_over_the_whole_tree(hybrid_decoder, temperature):
    """The prefill and then, per verify round, exactly one target forward holding the bonus and every tree node,
    in which each decoder layer (Gated DeltaNet and attention) runs once over all of them: siblings' recurrent
    states come from that single pass, not from re-running the layers per path."""
    prompt = [12, 19, 2, 27, 3]
    params = SamplingParams(temperature=temperature, max_new_tokens=24, seed=7)
    recorder = ForwardRecorder(hybrid_decoder.target)
    try:
        result = hybrid_decoder.generate(prompt, params, "ddtree", draft_tokens=16, budget=16)
    finally:
        recorder.remove()
    stats = result.stats
    assert len(recorder.forwards) == 1 + stats.rounds
    assert recorder.forwards[0] == (len(prompt), False)
    assert recorder.forwards[1:] == [(size + 1, True) for size in stats.tree_sizes]
    # 16 nodes under a depth limit of 15: every full tree has siblings somewhere.
    assert max(stats.tree_sizes) == 16
    assert all(calls == [count for count, _mask in recorder.forwards] for calls in recorder.layer_calls.values())
    if temperature == 0.0:
        assert result.tokens == hybrid_decoder.generate(prompt, params, "ar").tokens


@pytest.fixture(scope="module")
def hybrid_sampling_setup() -> tuple[SpeculativeDecoder, dict[tuple[int, ...], float]]:
    decoder = make_hybrid_decoder(vocab=SAMPLE_VOCAB, seed=11, std=0.5)
    return decoder, exact_sequence_distribution(decoder, 1.0)


@pytest.mark.parametrize(
    ("method", "kwargs"),
    [("ddtree", {"budget": 8, "draft_tokens": 4}), ("dflash", {"draft_tokens": 4})],
)
def test_sampled_decoding_matches_the_exact_autoregressive_distribution(hybrid_sampling_setup, method, kwargs):
    """Distributional losslessness at temperature 1 on the hybrid target, as
    ``test_decoding.test_sampled_decoding_matches_the_exact_autoregressive_distribution`` checks the dense one
    (same Bernstein bounds, 3000 fixed seeds, false-failure probability < 1e-6), for DDTree and the DFlash chain.
    Trees of budget 8 and chains of 4 draft tokens accept several tokens in some rounds here, so multi-token commits
    of recurrent state (``compact`` for the tree path, ``crop`` for the chain) are sampled."""
    decoder, exact = hybrid_sampling_setup
    counts: Counter = Counter()
    longest = 1
    for seed in range(SAMPLES):
        params = SamplingParams(temperature=1.0, max_new_tokens=SAMPLE_TOKENS, seed=seed)
        result = decoder.generate(SAMPLE_PROMPT, params, method, **kwargs)
        counts[tuple(result.tokens)] += 1
        longest = max(longest, *result.stats.acceptance_lengths)
    assert longest >= 2
    assert sequences_within_bounds(counts, exact, SAMPLES) == []
