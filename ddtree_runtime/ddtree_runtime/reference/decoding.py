"""Reference decoders: autoregressive, DFlash (linear block) and DDTree (draft tree), batch 1.

Draft-length convention. A DFlash drafter with ``block_size`` S drafts ``S - 1`` positions per call (slot 0
holds the bonus token). ``draft_tokens`` is SGLang's ``--speculative-num-draft-tokens``: the DFlash verify
block *including* the bonus, ``1 <= draft_tokens <= S`` (16 for the z-lab b16 drafters). The drafter
always runs its trained block of S slots; only the first ``L = draft_tokens - 1`` marginals are used, so
DFlash verifies ``1 + L`` tokens and DDTree builds trees of depth at most L (``budget`` nodes plus the
root). ``draft_tokens = 1`` (or DDTree ``budget = 0``) is plain autoregressive decoding through the
speculative loop.

Rounds. The prefill samples the first token (the first bonus). Each round verifies ``[bonus, drafts...]``
in one target pass and commits the accepted drafts plus a new bonus; its acceptance length is
``accepted drafts + 1`` (tau counts the bonus, as in the DDTree paper). Sampling at temperature > 0 uses
sample-and-match (see :mod:`ddtree_runtime.verify`), so every decoder samples exactly the target
distribution. Drafts are always the drafter's argmax / best-first tree from its raw softmax.

Targets. The dense Qwen3 and the Qwen3.5/3.6 hybrid run through the same loop: one target forward per round over
the chain or the whole tree, then a commit (``crop`` for the chain, ``compact`` for the accepted tree path). In the
hybrid the Gated DeltaNet layers advance each node's recurrent and conv state from its parent's, and the commit
keeps the state of the last accepted node (:class:`~ddtree_runtime.reference.cache.HybridCache`).

Stops. Generation ends at the first stop token (kept in ``tokens``) or after ``max_new_tokens`` tokens;
tokens computed past either point in the last round are discarded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from ddtree_runtime.reference.cache import HybridCache, KVCache
from ddtree_runtime.reference.dflash import DFlashDraftModel
from ddtree_runtime.reference.target import TargetModel
from ddtree_runtime.sampling import SamplingParams, sample_tokens
from ddtree_runtime.tree import build_tree
from ddtree_runtime.verify import verify_tree

Method = Literal["ar", "dflash", "ddtree"]
METHODS: tuple[Method, ...] = ("ar", "dflash", "ddtree")


class Drafter(Protocol):
    """What the speculative decoders need from a drafter."""

    block_size: int
    feature_layers: Sequence[int]

    def new_state(self) -> Any: ...

    def draft(self, state: Any, context_ids: Sequence[int], bonus: int, features: torch.Tensor) -> torch.Tensor:
        """Per-position logits ``[block_size - 1, V]`` for the tokens after ``bonus``.

        ``context_ids`` are the committed tokens before ``bonus`` (``len(context_ids)`` is bonus's position);
        ``features`` are the target features of the committed tokens not yet passed to this drafter.
        """


class DFlashDrafter:
    """A :class:`DFlashDraftModel` bound to its target's embeddings and LM head."""

    def __init__(self, model: DFlashDraftModel, target: TargetModel) -> None:
        if model.config.hidden_size != target.config.hidden_size:
            raise ValueError("drafter and target hidden sizes differ")
        too_deep = [i for i in model.config.target_layer_ids if not 0 <= i < target.config.num_hidden_layers]
        if too_deep:
            raise ValueError(f"target_layer_ids {too_deep} are outside the target's layers")
        trained_on = model.config.num_target_layers
        if trained_on is not None and trained_on != target.config.num_hidden_layers:
            raise ValueError(f"the drafter was trained for a {trained_on}-layer target, not this "
                             f"{target.config.num_hidden_layers}-layer one")
        if not 0 <= model.mask_token_id < target.config.vocab_size:
            raise ValueError(f"mask_token_id {model.mask_token_id} is outside the target vocabulary")
        self.model = model
        self.target = target
        self.block_size = model.block_size
        self.feature_layers = list(model.config.target_layer_ids)

    def new_state(self) -> KVCache:
        return self.model.new_cache()

    def draft(self, state: KVCache, context_ids: Sequence[int], bonus: int, features: torch.Tensor) -> torch.Tensor:
        start = len(context_ids)
        device = self.target.device
        block_ids = torch.full((self.block_size,), self.model.mask_token_id, dtype=torch.long, device=device)
        block_ids[0] = bonus
        noise = self.target.embed(block_ids) * self.model.config.input_embedding_scale
        positions = torch.arange(state.length, start + self.block_size, device=device)
        hidden = self.model(features, noise, positions, state)
        state.crop(start)
        with torch.inference_mode():
            return self.model.compute_logits(hidden[1:], self.target.lm_head)


@dataclass
class GenerationStats:
    method: str
    prompt_tokens: int
    acceptance_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        """Target forward passes after the prefill (verify rounds; decode steps for AR)."""
        return len(self.acceptance_lengths)

    @property
    def tau(self) -> float:
        """Mean acceptance length per round (accepted drafts + bonus); 0.0 before any round."""
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0

    @property
    def num_correct_drafts(self) -> int:
        return sum(length - 1 for length in self.acceptance_lengths)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + time.perf_counter() - begin

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "prompt_tokens": self.prompt_tokens,
            "rounds": self.rounds,
            "tau": self.tau,
            "acceptance_lengths": list(self.acceptance_lengths),
            "tree_sizes": list(self.tree_sizes),
            "stage_seconds": dict(self.stage_seconds),
        }


@dataclass
class GenerationResult:
    tokens: list[int]
    finish_reason: Literal["stop", "length"]
    matched_stop: int | None
    stats: GenerationStats
    target_cache: KVCache | HybridCache | None = None
    """The target cache at the end (only with ``keep_cache=True``): holds the prompt and every committed
    token except the final bonus."""


class _Output:
    """Collects generated tokens and applies stop tokens and max_new_tokens."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.tokens: list[int] = []
        self.finish_reason: Literal["stop", "length"] = "length"
        self.matched_stop: int | None = None
        self.done = params.max_new_tokens == 0

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.tokens)

    def push(self, new_tokens: Sequence[int]) -> None:
        for token in new_tokens:
            if self.remaining <= 0:
                break
            self.tokens.append(int(token))
            if int(token) in self.params.stop_token_ids:
                self.finish_reason, self.matched_stop, self.done = "stop", int(token), True
                return
        if self.remaining <= 0:
            self.done = True


@dataclass
class _SpecState:
    cache: KVCache | HybridCache
    drafter_state: Any
    committed: list[int]
    bonus: int
    pending_features: torch.Tensor | None

    @property
    def start(self) -> int:
        """Position of the bonus token = number of tokens in the target cache."""
        return len(self.committed)

    def add_features(self, features: torch.Tensor | None) -> None:
        if features is None:
            return
        if self.pending_features is None:
            self.pending_features = features
        else:
            self.pending_features = torch.cat([self.pending_features, features], dim=0)


@dataclass
class _RoundSettings:
    params: SamplingParams
    method: Method
    depth_limit: int
    budget: int
    max_topk: int | None
    generator: torch.Generator | None
    capture: Sequence[int] = ()
    stats: GenerationStats = field(default_factory=lambda: GenerationStats(method="", prompt_tokens=0))


class SpeculativeDecoder:
    """Runs any of the three decoders on one target (and optionally one drafter)."""

    def __init__(self, target: TargetModel, drafter: Drafter | None = None) -> None:
        self.target = target
        self.drafter = drafter

    def depth_limit(self, draft_tokens: int) -> int:
        if self.drafter is None:
            raise ValueError("speculative decoding needs a drafter")
        if not 1 <= draft_tokens <= self.drafter.block_size:
            raise ValueError(f"draft_tokens must be in [1, {self.drafter.block_size}] (the drafter's block size)")
        return draft_tokens - 1

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        method: Method = "ar",
        *,
        draft_tokens: int = 16,
        budget: int = 16,
        max_topk: int | None = None,
        keep_cache: bool = False,
        generator: torch.Generator | None = None,
    ) -> GenerationResult:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        vocab = self.target.config.vocab_size
        if any(not 0 <= int(t) < vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        if generator is None and not params.greedy:
            generator = params.make_generator(self.target.device)
        if method == "ar":
            return self._generate_ar(prompt_ids, params, keep_cache, generator)
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
        settings = _RoundSettings(
            params=params,
            method=method,
            depth_limit=self.depth_limit(draft_tokens),
            budget=budget,
            max_topk=max_topk,
            generator=generator,
        )
        return self._generate_speculative(prompt_ids, settings, keep_cache)

    # -- autoregressive -------------------------------------------------------------------------------

    def _generate_ar(
        self, prompt_ids: Sequence[int], params: SamplingParams, keep_cache: bool, generator: torch.Generator | None
    ) -> GenerationResult:
        stats = GenerationStats(method="ar", prompt_tokens=len(prompt_ids))
        output = _Output(params)
        cache = self.target.new_cache()
        if not output.done:
            device = self.target.device
            ids = torch.tensor(list(prompt_ids), dtype=torch.long, device=device)
            with stats.timed("prefill"):
                out = self.target(ids, torch.arange(len(ids), device=device), cache, last_logits_only=True)
                token = int(sample_tokens(out.logits[-1], params, generator))
            output.push([token])
            while not output.done:
                with stats.timed("verify"):
                    position = torch.tensor([cache.length], device=device)
                    out = self.target(torch.tensor([token], device=device), position, cache)
                    token = int(sample_tokens(out.logits[-1], params, generator))
                stats.acceptance_lengths.append(1)
                output.push([token])
        return GenerationResult(
            output.tokens, output.finish_reason, output.matched_stop, stats, cache if keep_cache else None
        )

    # -- DFlash and DDTree ----------------------------------------------------------------------------

    def _prefill_speculative(self, prompt_ids: Sequence[int], settings: _RoundSettings) -> _SpecState:
        assert self.drafter is not None
        device = self.target.device
        ids = torch.tensor(list(prompt_ids), dtype=torch.long, device=device)
        cache = self.target.new_cache()
        out = self.target(
            ids, torch.arange(len(ids), device=device), cache, capture_layers=settings.capture, last_logits_only=True
        )
        bonus = int(sample_tokens(out.logits[-1], settings.params, settings.generator))
        return _SpecState(cache, self.drafter.new_state(), [int(t) for t in prompt_ids], bonus, out.features)

    def _draft_logits(self, state: _SpecState, depth: int) -> torch.Tensor:
        assert self.drafter is not None and state.pending_features is not None
        logits = self.drafter.draft(state.drafter_state, state.committed, state.bonus, state.pending_features)
        state.pending_features = None
        return logits[:depth]

    def _generate_speculative(
        self, prompt_ids: Sequence[int], settings: _RoundSettings, keep_cache: bool
    ) -> GenerationResult:
        assert self.drafter is not None
        settings.capture = self.drafter.feature_layers if settings.depth_limit > 0 else ()
        stats = settings.stats = GenerationStats(method=settings.method, prompt_tokens=len(prompt_ids))
        output = _Output(settings.params)
        state: _SpecState | None = None
        if not output.done:
            with stats.timed("prefill"):
                state = self._prefill_speculative(prompt_ids, settings)
            output.push([state.bonus])
            round_fn = self._dflash_round if settings.method == "dflash" else self._ddtree_round
            while not output.done:
                output.push(round_fn(state, settings, min(settings.depth_limit, output.remaining - 1)))
        cache = state.cache if (keep_cache and state is not None) else None
        return GenerationResult(output.tokens, output.finish_reason, output.matched_stop, stats, cache)

    def _dflash_round(self, state: _SpecState, settings: _RoundSettings, depth: int) -> list[int]:
        stats = settings.stats
        device = self.target.device
        start = state.start
        chain = torch.zeros(0, dtype=torch.long, device=device)
        if depth > 0:
            with stats.timed("draft"):
                chain = torch.argmax(self._draft_logits(state, depth), dim=-1)
        ids = torch.cat([torch.tensor([state.bonus], device=device), chain])
        with stats.timed("verify"):
            positions = torch.arange(start, start + len(ids), device=device)
            out = self.target(ids, positions, state.cache, capture_layers=settings.capture)
        with stats.timed("sample_walk"):
            posterior = sample_tokens(out.logits, settings.params, settings.generator)
            matches = (chain == posterior[:-1]).to(torch.long)
            accepted_drafts = int(torch.cumprod(matches, dim=0).sum()) if depth > 0 else 0
            bonus = int(posterior[accepted_drafts])
        with stats.timed("commit"):
            state.cache.crop(start + accepted_drafts + 1)
            if out.features is not None:
                state.add_features(out.features[: accepted_drafts + 1])
        stats.tree_sizes.append(depth)
        stats.acceptance_lengths.append(accepted_drafts + 1)
        committed = ids[: accepted_drafts + 1].tolist()
        state.committed.extend(committed)
        state.bonus = bonus
        return [*committed[1:], bonus]

    def _ddtree_round(self, state: _SpecState, settings: _RoundSettings, depth: int) -> list[int]:
        stats = settings.stats
        device = self.target.device
        start = state.start
        if depth > 0 and settings.budget > 0:
            with stats.timed("draft"):
                draft_logits = self._draft_logits(state, depth)
            with stats.timed("tree_build"):
                tree = build_tree(draft_logits, settings.budget, settings.max_topk)
        else:
            tree = build_tree(torch.zeros(0, 1), 0)
        tree = _on_device(tree, device)
        ids = tree.verify_input_ids(state.bonus)
        with stats.timed("verify"):
            mask = tree.attention_mask(start)
            positions = tree.positions(start)
            out = self.target(ids, positions, state.cache, attention_mask=mask, capture_layers=settings.capture)
        with stats.timed("sample_walk"):
            result = verify_tree(tree, out.logits, settings.params, settings.generator)
        with stats.timed("commit"):
            state.cache.compact(start, result.accepted)
            if out.features is not None:
                accepted_index = torch.tensor(result.accepted, dtype=torch.long, device=device)
                state.add_features(out.features.index_select(0, accepted_index))
        stats.tree_sizes.append(tree.num_nodes)
        stats.acceptance_lengths.append(result.acceptance_length)
        committed = ids[result.accepted].tolist()
        state.committed.extend(committed)
        state.bonus = result.bonus
        return [*committed[1:], result.bonus]


def _on_device(tree: Any, device: torch.device) -> Any:
    if tree.token_ids.device == device:
        return tree
    return type(tree)(**{name: getattr(tree, name).to(device) for name in tree.__dataclass_fields__})
