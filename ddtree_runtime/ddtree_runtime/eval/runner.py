"""Run prompts x decoding configurations on a backend and aggregate acceptance length and speed.

Aggregates follow the DDTree paper: a run's tau is the mean over prompts of each prompt's mean acceptance
length per verify round (accepted drafts + the bonus token); tokens/s is total generated tokens over total
generation wall time (prefill included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ddtree_runtime.eval.backends import RunSpec, Sample
from ddtree_runtime.eval.tasks import EvalPrompt
from ddtree_runtime.sampling import SamplingParams


class Backend(Protocol):
    description: dict[str, Any]

    def generate(self, prompt: str, spec: RunSpec, params: SamplingParams) -> Sample: ...


@dataclass
class PromptResult:
    name: str
    tau: float
    rounds: int
    tokens: int
    seconds: float
    text: str
    token_ids: list[int]
    acceptance_lengths: list[int]
    matches_ar: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tau": self.tau,
            "rounds": self.rounds,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens / self.seconds if self.seconds > 0 else None,
            "matches_ar": self.matches_ar,
            "acceptance_lengths": self.acceptance_lengths,
            "text": self.text,
        }


@dataclass
class RunResult:
    spec: RunSpec
    prompts: list[PromptResult] = field(default_factory=list)

    @property
    def mean_tau(self) -> float:
        return sum(p.tau for p in self.prompts) / len(self.prompts) if self.prompts else 0.0

    @property
    def rounds(self) -> int:
        return sum(p.rounds for p in self.prompts)

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.prompts)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.prompts)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def matches_ar(self) -> bool | None:
        checks = [p.matches_ar for p in self.prompts]
        return None if any(c is None for c in checks) else all(checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.spec.label,
            "method": self.spec.method,
            "drafter": self.spec.drafter,
            "budget": self.spec.budget if self.spec.method == "ddtree" else None,
            "draft_tokens": self.spec.draft_tokens if self.spec.method != "ar" else None,
            "max_topk": self.spec.max_topk,
            "mean_tau": self.mean_tau,
            "rounds": self.rounds,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "matches_ar": self.matches_ar,
            "prompts": [p.as_dict() for p in self.prompts],
        }


def build_specs(
    methods: Sequence[str],
    drafters: Sequence[str],
    budgets: Sequence[int],
    draft_tokens: int,
    max_topk: int | None,
) -> list[RunSpec]:
    """AR once, then per drafter the DFlash chain and one DDTree run per budget (in that order)."""
    unknown = set(methods) - {"ar", "dflash", "ddtree"}
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; expected ar, dflash, ddtree")
    if any(b < 1 for b in budgets):
        raise ValueError("DDTree budgets must be >= 1")
    if ("dflash" in methods or "ddtree" in methods) and not drafters:
        raise ValueError("the dflash and ddtree methods need a drafter")
    if "ddtree" in methods and not budgets:
        raise ValueError("the ddtree method needs at least one budget")
    specs = [RunSpec("ar")] if "ar" in methods else []
    for drafter in drafters:
        if "dflash" in methods:
            specs.append(RunSpec("dflash", drafter, 0, draft_tokens))
        if "ddtree" in methods:
            specs += [RunSpec("ddtree", drafter, b, draft_tokens, max_topk) for b in budgets]
    return specs


def evaluate(
    backend: Backend,
    prompts: Sequence[EvalPrompt],
    specs: Sequence[RunSpec],
    params: SamplingParams,
    *,
    warmup_tokens: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[RunResult]:
    """Every spec over every prompt. With greedy sampling and an AR run first, each later prompt result
    records whether its tokens equal AR's."""
    if not prompts:
        raise ValueError("no prompts to evaluate")
    results = []
    reference: dict[str, list[int]] = {}
    for spec in specs:
        if warmup_tokens > 0:
            backend.generate(prompts[0].text, spec, _with_max_tokens(params, warmup_tokens))
        run = RunResult(spec)
        for prompt in prompts:
            sample = backend.generate(prompt.text, spec, params)
            matches = None
            if params.greedy and prompt.name in reference:
                matches = sample.tokens == reference[prompt.name]
            run.prompts.append(
                PromptResult(
                    name=prompt.name,
                    tau=sample.tau,
                    rounds=sample.rounds,
                    tokens=len(sample.tokens) if sample.tokens else len(sample.text.encode()),
                    seconds=sample.seconds,
                    text=sample.text,
                    token_ids=sample.tokens,
                    acceptance_lengths=sample.acceptance_lengths,
                    matches_ar=matches,
                )
            )
            if spec.method == "ar":
                reference[prompt.name] = sample.tokens
        if progress is not None:
            progress(f"{spec.label} [{spec.drafter or '-'}]: tau {run.mean_tau:.3f}, {run.tokens_per_s:.1f} tok/s")
        results.append(run)
    return results


def _with_max_tokens(params: SamplingParams, count: int) -> SamplingParams:
    return replace(params, max_new_tokens=count)
