"""Timed ``/generate`` calls and the ratios the report draws from them (figures, not pass/fail cases)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddtree_runtime.acceptance.launch import Server, ServerError, generate


@dataclass(frozen=True)
class TimedCall:
    """What one or more ``/generate`` calls returned, summed, and the wall time they took."""

    requests: int
    tokens: int
    """Completion tokens (SGLang's ``meta_info.completion_tokens``)."""
    verify_rounds: int
    """Speculative verify rounds (SGLang's ``meta_info.spec_verify_ct``; 0 on a non-speculative server)."""
    seconds: float

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    def as_dict(self) -> dict[str, Any]:
        tokens_per_s = self.tokens_per_s
        return {"requests": self.requests, "tokens": self.tokens, "verify_rounds": self.verify_rounds,
                "seconds": round(self.seconds, 4),
                "tokens_per_s": None if tokens_per_s is None else round(tokens_per_s, 1)}


def completion_tokens(answer: Mapping[str, Any]) -> int:
    meta = answer.get("meta_info")
    if not isinstance(meta, Mapping) or "completion_tokens" not in meta:
        raise ServerError(f"answer without meta_info.completion_tokens: {str(answer)[:300]}")
    return int(meta["completion_tokens"])


def verify_rounds(answer: Mapping[str, Any]) -> int:
    return int(answer.get("meta_info", {}).get("spec_verify_ct", 0) or 0)


def timed_call(server: Server, input_ids: Sequence[Sequence[int]], sampling: Mapping[str, Any]) -> TimedCall:
    """One ``/generate`` call for ``input_ids`` (one batch), timed from request to answer."""
    started = time.monotonic()
    answers = generate(server, input_ids, sampling)
    seconds = time.monotonic() - started
    return TimedCall(requests=len(answers), tokens=sum(completion_tokens(a) for a in answers),
                     verify_rounds=sum(verify_rounds(a) for a in answers), seconds=seconds)


def summed(calls: Sequence[TimedCall]) -> TimedCall:
    """Calls made one after another as one figure: summed requests, tokens, rounds and wall time."""
    return TimedCall(requests=sum(c.requests for c in calls), tokens=sum(c.tokens for c in calls),
                     verify_rounds=sum(c.verify_rounds for c in calls), seconds=sum(c.seconds for c in calls))


def ratio(value: float | None, reference: float | None) -> float | None:
    """``value / reference``, or None when either is missing or the reference is not positive."""
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def figure_of(table: Mapping[str, Mapping[str, Any]], algorithm: str, path: Sequence[str]) -> float | None:
    """The figure at ``path`` (keys, outermost first) of the first server in ``table`` that ran ``algorithm``."""
    for entry in table.values():
        if entry.get("algorithm") != algorithm:
            continue
        value: Any = entry
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        return None if value is None else float(value)
    return None
