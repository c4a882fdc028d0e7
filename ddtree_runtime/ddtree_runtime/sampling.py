"""Sampling parameters and the per-position target sampler shared by every decoder.

Temperature 0 (anything below ``GREEDY_TEMPERATURE``) is greedy: ``argmax`` with ties to the lowest token id.
Otherwise the distribution is ``softmax(logits / T)`` in float64, optionally restricted to the ``top_k`` most
likely tokens (ties to the lowest id) and to the smallest most-likely set whose mass reaches ``top_p``, and
sampled with ``torch.multinomial`` from the request's own ``torch.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A generator seeded with ``seed`` (or from the global RNG when no seed was given)."""
        generator = torch.Generator(device=device)
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        generator.manual_seed(seed)
        return generator


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Float64 sampling distribution ``[..., V]`` for non-greedy params."""
    scores = logits.double() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(vocab, device=scores.device).expand_as(order))
        scores = scores.masked_fill(rank >= params.top_k, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(order.values, dim=-1) - order.values
        keep_sorted = mass_before < params.top_p
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order.indices, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``logits [..., V]``, each drawn independently (greedy: argmax)."""
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    probs = sampling_probs(logits, params)
    flat = probs.reshape(-1, probs.shape[-1])
    drawn = torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
    return drawn
