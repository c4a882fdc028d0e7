"""End-to-end exactness of the AR, DFlash and DDTree decoders on a tiny float64 random pair."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import pytest
import torch
from conftest import make_decoder
from ddtree_runtime.reference import SpeculativeDecoder
from ddtree_runtime.reference.cache import KVCache
from ddtree_runtime.sampling import SamplingParams

PROMPTS = [
    [1, 2, 3],
    [30, 7],
    [5, 5, 5, 5, 5, 9],
    [0],
    [12, 19, 2, 27, 3, 8, 8, 1],
    [22, 14, 6, 11],
    [31, 31, 31],  # the drafter's mask token id is an ordinary prompt token
    *torch.randint(0, 32, (5, 7), generator=torch.Generator().manual_seed(99)).tolist(),
]
BUDGETS = [0, 1, 4, 16, 64]
DRAFT_TOKENS = [1, 4, 16]


class NoisyOracleDrafter:
    """Test drafter that knows the target's greedy continuation: at each depth it ranks the true token first
    (60%), second behind a decoy (30%) or nowhere near the top (10%), so rounds accept long paths that run
    through rank-2 siblings (non-contiguous accepted node indices)."""

    def __init__(self, decoder: SpeculativeDecoder, block_size: int = 16) -> None:
        self.target = decoder.target
        self.block_size = block_size
        self.feature_layers: Sequence[int] = (1,)

    def new_state(self) -> None:
        return None

    def draft(self, state: None, context_ids: Sequence[int], bonus: int, features: torch.Tensor) -> torch.Tensor:
        del state, features
        vocab = self.target.config.vocab_size
        ids = torch.tensor([*context_ids, bonus])
        cache = self.target.new_cache()
        logits = self.target(ids, torch.arange(len(ids)), cache, last_logits_only=True).logits
        truth = []
        for _unused in range(self.block_size - 1):
            token = int(torch.argmax(logits[-1]))
            truth.append(token)
            logits = self.target(torch.tensor([token]), torch.tensor([cache.length]), cache).logits
        # Drafts depend only on the context, so different budgets see the same drafts in the same round.
        generator = torch.Generator().manual_seed(sum((i + 1) * 131 * t for i, t in enumerate(ids.tolist())) % 2**31)
        out = torch.randn(self.block_size - 1, vocab, generator=generator, dtype=torch.float64)
        for depth, token in enumerate(truth):
            kind = int(torch.randint(0, 10, (1,), generator=generator))
            decoy = (token + 1 + depth) % vocab
            if kind < 6:
                out[depth, token] += 8.0
            elif kind < 9:
                out[depth, decoy] += 9.0
                out[depth, token] += 8.0
        return out


@pytest.fixture(scope="module")
def oracle_decoder(decoder):
    return SpeculativeDecoder(decoder.target, NoisyOracleDrafter(decoder))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_ddtree_equals_dflash_equals_autoregressive(decoder, prompt):
    params = SamplingParams(max_new_tokens=20)
    expected = decoder.generate(prompt, params, "ar").tokens
    assert len(expected) == 20
    for draft_tokens in DRAFT_TOKENS:
        dflash = decoder.generate(prompt, params, "dflash", draft_tokens=draft_tokens)
        assert dflash.tokens == expected, ("dflash", draft_tokens)
        for budget in BUDGETS:
            ddtree = decoder.generate(prompt, params, "ddtree", draft_tokens=draft_tokens, budget=budget)
            assert ddtree.tokens == expected, ("ddtree", draft_tokens, budget)
            assert all(1 <= a <= draft_tokens for a in ddtree.stats.acceptance_lengths)
            assert sum(ddtree.stats.acceptance_lengths) + 1 >= len(expected)
            if budget == 0 or draft_tokens == 1:
                assert set(ddtree.stats.acceptance_lengths) == {1}


def test_greedy_equality_with_a_sliding_window_drafter():
    decoder = make_decoder(seed=4, sliding=True)
    params = SamplingParams(max_new_tokens=24)
    expected = decoder.generate([3, 1, 4], params, "ar").tokens
    for budget in (4, 32):
        assert decoder.generate([3, 1, 4], params, "ddtree", draft_tokens=16, budget=budget).tokens == expected


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_long_accepted_paths_are_exact_and_tau_is_monotone_for_oracle_drafts(oracle_decoder, prompt):
    params = SamplingParams(max_new_tokens=30)
    expected = oracle_decoder.generate(prompt, params, "ar").tokens
    chain = oracle_decoder.generate(prompt, params, "dflash", draft_tokens=16)
    assert chain.tokens == expected
    for budget in (15, 64):
        tree = oracle_decoder.generate(prompt, params, "ddtree", draft_tokens=16, budget=budget)
        assert tree.tokens == expected
    assert max(tree.stats.acceptance_lengths) > 4
    # Same drafts, strictly more candidates: a bigger tree cannot accept less in the first round.
    short = SamplingParams(max_new_tokens=17)
    first_rounds = [
        oracle_decoder.generate(prompt, short, "ddtree", budget=b).stats.acceptance_lengths[0] for b in (1, 4, 15, 64)
    ]
    assert first_rounds == sorted(first_rounds)


def test_top1_ddtree_is_the_dflash_chain_round_for_round(oracle_decoder):
    params = SamplingParams(max_new_tokens=40)
    chain = oracle_decoder.generate([7, 7], params, "dflash", draft_tokens=16)
    tree = oracle_decoder.generate([7, 7], params, "ddtree", draft_tokens=16, budget=15, max_topk=1)
    assert tree.tokens == chain.tokens
    assert tree.stats.acceptance_lengths == chain.stats.acceptance_lengths


def assert_cache_equals_chain_prefill(decoder: SpeculativeDecoder, cache: KVCache, committed: list[int]) -> None:
    fresh = decoder.target.new_cache()
    decoder.target(torch.tensor(committed), torch.arange(len(committed)), fresh)
    assert cache.length == len(committed)
    for layer in range(cache.num_layers):
        for ours, expected in zip(cache.live(layer), fresh.live(layer), strict=True):
            assert torch.allclose(ours, expected, atol=1e-10)


@pytest.mark.parametrize("method", ["ddtree", "dflash"])
def test_kv_after_compaction_equals_a_chain_prefill_of_the_committed_tokens(oracle_decoder, method):
    prompt = [9, 8, 7]
    result = oracle_decoder.generate(prompt, SamplingParams(max_new_tokens=33), method, budget=48, keep_cache=True)
    assert result.target_cache is not None
    # The final bonus token is committed to the output but not yet to the cache.
    assert_cache_equals_chain_prefill(oracle_decoder, result.target_cache, prompt + result.tokens[:-1])


def test_stop_tokens_and_max_new_tokens(decoder):
    prompt = [1, 2, 3]
    free = decoder.generate(prompt, SamplingParams(max_new_tokens=20), "ar").tokens
    stop = free[5]
    first = free.index(stop)
    for method in ("ar", "dflash", "ddtree"):
        params = SamplingParams(max_new_tokens=20, stop_token_ids=frozenset({stop}))
        result = decoder.generate(prompt, params, method, budget=16)
        assert result.tokens == free[: first + 1]
        assert (result.finish_reason, result.matched_stop) == ("stop", stop)
        for limit in (0, 1, 2, 7):
            limited = decoder.generate(prompt, SamplingParams(max_new_tokens=limit), method, budget=16)
            assert limited.tokens == free[:limit]
            assert limited.finish_reason == "length"


def test_invalid_requests_are_rejected(decoder):
    params = SamplingParams(max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        decoder.generate([], params)
    with pytest.raises(ValueError, match="prompt token ids"):
        decoder.generate([32], params)
    with pytest.raises(ValueError, match="draft_tokens"):
        decoder.generate([1], params, "dflash", draft_tokens=17)
    with pytest.raises(ValueError, match="draft_tokens"):
        decoder.generate([1], params, "ddtree", draft_tokens=0)
    with pytest.raises(ValueError, match="method"):
        decoder.generate([1], params, "medusa")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget"):
        decoder.generate([1], params, "ddtree", budget=-1)
    with pytest.raises(ValueError, match="drafter"):
        SpeculativeDecoder(decoder.target).generate([1], params, "ddtree")


def test_stats_report_rounds_tau_and_stage_times(decoder):
    result = decoder.generate([4, 5], SamplingParams(max_new_tokens=12), "ddtree", budget=16)
    stats = result.stats
    assert stats.rounds == len(stats.acceptance_lengths) == len(stats.tree_sizes)
    assert stats.tau == pytest.approx(sum(stats.acceptance_lengths) / stats.rounds)
    assert {"prefill", "draft", "tree_build", "verify", "sample_walk", "commit"} <= set(stats.stage_seconds)
    assert stats.as_dict()["rounds"] == stats.rounds


# -- sampled decoding ---------------------------------------------------------------------------------

SAMPLE_VOCAB = 4
SAMPLE_TOKENS = 3
SAMPLE_PROMPT = [1, 2]
SAMPLES = 3000
FALSE_FAILURE = 1e-6


def exact_sequence_distribution(decoder: SpeculativeDecoder, temperature: float) -> dict[tuple[int, ...], float]:
    """P(first SAMPLE_TOKENS tokens) under autoregressive sampling, by enumerating every sequence."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _unused in range(SAMPLE_TOKENS):
        grown = {}
        for prefix, p in probs.items():
            ids = torch.tensor(SAMPLE_PROMPT + list(prefix))
            cache = decoder.target.new_cache()
            logits = decoder.target(ids, torch.arange(len(ids)), cache, last_logits_only=True).logits
            step = torch.softmax(logits[-1].double() / temperature, dim=-1)
            for token in range(SAMPLE_VOCAB):
                grown[(*prefix, token)] = p * float(step[token])
        probs = grown
    return probs


def bernstein_radius(p: float, n: int, delta: float) -> float:
    """t with P(|mean - p| >= t) <= delta for the mean of n Bernoulli(p) (two-sided Bernstein)."""
    c = math.log(2 / delta)
    a = 2 * c / 3
    return (a + math.sqrt(a * a + 8 * n * c * p * (1 - p))) / (2 * n)


def sequences_within_bounds(counts: Counter, exact: dict[tuple[int, ...], float], n: int) -> list[str]:
    delta = FALSE_FAILURE / len(exact)
    failures = []
    for sequence, p in exact.items():
        observed = counts[sequence] / n
        if abs(observed - p) > bernstein_radius(p, n, delta):
            failures.append(f"{sequence}: observed {observed:.4f}, exact {p:.4f}")
    return failures


@pytest.fixture(scope="module")
def sampling_setup():
    decoder = make_decoder(vocab=SAMPLE_VOCAB, seed=11, std=0.5)
    return decoder, exact_sequence_distribution(decoder, 1.0)


def sample_counts(decoder: SpeculativeDecoder, method: str, temperature: float, n: int = SAMPLES, **kwargs):
    counts: Counter = Counter()
    for seed in range(n):
        params = SamplingParams(temperature=temperature, max_new_tokens=SAMPLE_TOKENS, seed=seed)
        counts[tuple(decoder.generate(SAMPLE_PROMPT, params, method, **kwargs).tokens)] += 1
    return counts


@pytest.mark.parametrize(
    ("method", "kwargs"),
    [("ddtree", {"budget": 8, "draft_tokens": 4}), ("dflash", {"draft_tokens": 4})],
)
def test_sampled_decoding_matches_the_exact_autoregressive_distribution(sampling_setup, method, kwargs):
    """Distributional losslessness at temperature 1.

    Test: a 4-token vocabulary makes the exact AR distribution of the first 3 generated tokens computable by
    enumeration (64 sequences). We draw 3000 sequences with per-request seeds 0..2999 and require every
    sequence's empirical frequency to lie within its two-sided Bernstein radius at level 1e-6/64. By the
    union bound, a correct sampler fails with probability < 1e-6 over random seeds; the seeds are fixed, so
    the outcome is deterministic. The trees here accept multiple tokens per round (checked below), so
    multi-token commits are covered. The control test shows the same check rejects a temperature mismatch.
    """
    decoder, exact = sampling_setup
    counts = sample_counts(decoder, method, 1.0, **kwargs)
    assert sum(counts.values()) == SAMPLES
    assert sequences_within_bounds(counts, exact, SAMPLES) == []


def test_distribution_check_rejects_a_wrong_distribution(sampling_setup):
    decoder, exact = sampling_setup
    counts = sample_counts(decoder, "ar", 0.5, n=1500)
    assert sequences_within_bounds(counts, exact, 1500) != []


def test_sampled_trees_accept_more_than_one_token_per_round(sampling_setup):
    decoder, _unused = sampling_setup
    lengths = []
    for seed in range(30):
        params = SamplingParams(temperature=1.0, max_new_tokens=SAMPLE_TOKENS, seed=seed)
        lengths += decoder.generate(SAMPLE_PROMPT, params, "ddtree", budget=8, draft_tokens=4).stats.acceptance_lengths
    assert max(lengths) >= 2


def test_sampled_decoding_is_reproducible_per_seed(decoder):
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=16, seed=1234)
    first = decoder.generate([1, 2], params, "ddtree", budget=16).tokens
    assert decoder.generate([1, 2], params, "ddtree", budget=16).tokens == first
    other = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=16, seed=1235)
    assert decoder.generate([1, 2], other, "ddtree", budget=16).tokens != first
