"""Comparisons the cases make: token-sequence agreement and a two-sample distribution test."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

import torch


@dataclass(frozen=True)
class Agreement:
    """How a run's outputs compare with the baseline's, prompt by prompt."""

    prompts: int
    equal: int
    first_divergence: dict[str, int]
    """Prompt name -> index of the first differing token (or the shorter length) for the unequal ones."""

    @property
    def divergent(self) -> int:
        return self.prompts - self.equal

    @property
    def rate(self) -> float:
        return self.divergent / self.prompts if self.prompts else 0.0

    def as_dict(self) -> dict[str, object]:
        return {"prompts": self.prompts, "equal": self.equal, "divergent": self.divergent,
                "divergence_rate": self.rate, "first_divergence": self.first_divergence}


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, or None when ``a == b``."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(names: Sequence[str], outputs: Sequence[Sequence[int]], baseline: Sequence[Sequence[int]]) -> Agreement:
    if not len(names) == len(outputs) == len(baseline):
        raise ValueError("names, outputs and baseline must have one entry per prompt")
    divergences = {}
    for name, ours, theirs in zip(names, outputs, baseline, strict=True):
        index = first_difference(ours, theirs)
        if index is not None:
            divergences[name] = index
    return Agreement(prompts=len(names), equal=len(names) - len(divergences), first_divergence=divergences)


def top2_margins(meta_info: Mapping[str, Any]) -> list[float | None]:
    """Per output position, the log-probability gap between the server's first and second choice (SGLang's
    ``output_top_logprobs``: one list of ``[logprob, token_id, text]`` per position); None where fewer than two
    were returned."""
    margins: list[float | None] = []
    for row in meta_info.get("output_top_logprobs") or []:
        values = [entry[0] for entry in row or [] if entry and entry[0] is not None]
        margins.append(float(values[0]) - float(values[1]) if len(values) >= 2 else None)
    return margins


def margins_at_divergence(divergences: Mapping[str, int], references: Mapping[str, Sequence[int]],
                          margin_paths: Mapping[str, Sequence[int]],
                          margins: Mapping[str, Sequence[float | None]]) -> dict[str, float | None]:
    """The baseline's own top-2 margin at each first divergence (``name`` -> index; a name may carry a ``#``
    suffix, as the load requests do). ``margin_paths`` are the outputs the margins were measured along (the
    baseline's logprob pass). A margin at position ``i`` is the gap given the tokens before ``i``, so it is known
    where the reference agrees with that path before the divergence; None otherwise (the logprob pass itself forked
    earlier, or the reference is another request's)."""
    found: dict[str, float | None] = {}
    for name, index in divergences.items():
        prompt = name.split("#", 1)[0]
        reference, path, row = references.get(name), margin_paths.get(prompt), margins.get(prompt)
        known = (reference is not None and path is not None and row is not None
                 and index < min(len(reference), len(row))
                 and list(reference[:index]) == list(path[:index]))
        found[name] = row[index] if known and row is not None else None
    return found


def fisher_one_sided(divergent: int, prompts: int, other_divergent: int, other_prompts: int) -> float:
    """One-sided Fisher exact test: the probability, if both runs shared one per-prompt divergence probability,
    of the first run diverging on ``divergent`` or more of its prompts given both runs' totals."""
    if not (0 <= divergent <= prompts and 0 <= other_divergent <= other_prompts) or prompts + other_prompts == 0:
        raise ValueError("counts must satisfy 0 <= divergent <= prompts for both runs")
    total, successes = prompts + other_prompts, divergent + other_divergent
    denominator = comb(total, prompts)
    upper = min(successes, prompts)
    tail = sum(comb(successes, k) * comb(total - successes, prompts - k) for k in range(divergent, upper + 1))
    return tail / denominator


@dataclass(frozen=True)
class HomogeneityTest:
    """Pearson's chi-square two-sample test of one token position's histogram."""

    statistic: float
    degrees_of_freedom: int
    p_value: float
    samples: tuple[int, int]
    categories: int


def chi_square_two_sample(first: Sequence[int], second: Sequence[int], min_expected: float = 5.0) -> HomogeneityTest:
    """Are two samples of tokens drawn from one distribution? Tokens whose expected count falls under
    ``min_expected`` in either sample are pooled into one category (the test's usual validity rule)."""
    if not first or not second:
        raise ValueError("both samples need at least one token")
    counts_a, counts_b = Counter(first), Counter(second)
    n_a, n_b = len(first), len(second)
    total = n_a + n_b
    kept, pooled_a, pooled_b = [], 0, 0
    for token in sorted(set(counts_a) | set(counts_b)):
        a, b = counts_a[token], counts_b[token]
        if min((a + b) * n_a / total, (a + b) * n_b / total) < min_expected:
            pooled_a, pooled_b = pooled_a + a, pooled_b + b
        else:
            kept.append((a, b))
    if pooled_a + pooled_b:
        kept.append((pooled_a, pooled_b))
    statistic = 0.0
    for a, b in kept:
        row = a + b
        for observed, n in ((a, n_a), (b, n_b)):
            expected = row * n / total
            statistic += (observed - expected) ** 2 / expected
    dof = max(len(kept) - 1, 0)
    p_value = 1.0
    if dof > 0:  # the chi-square survival function: the regularised upper incomplete gamma Q(dof/2, x/2)
        half_dof = torch.tensor(dof / 2, dtype=torch.float64)
        p_value = float(torch.special.gammaincc(half_dof, torch.tensor(statistic / 2, dtype=torch.float64)))
    return HomogeneityTest(statistic, dof, p_value, (n_a, n_b), len(kept))
