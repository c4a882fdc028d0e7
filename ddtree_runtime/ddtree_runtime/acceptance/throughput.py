"""Greedy tokens/s on the trained pair, measured on servers the suite starts anyway (figures, not pass/fail).

Batch 1: the first :data:`BATCH_1_REQUESTS` prompts, one request at a time; the figure is their summed completion
tokens over their summed wall time. Batch 16: :data:`BATCH_16_REQUESTS` prompts (the suite's, in order, repeated
when it has fewer) in one ``/generate`` call. Greedy, with the suite's output length and stop tokens, after the
server's greedy case has run (Triton kernels compiled). The report compares every server with the baseline, and
DDTREE with DFLASH, at the same batch (:func:`throughput_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddtree_runtime.acceptance.launch import Server
from ddtree_runtime.acceptance.measure import TimedCall, figure_of, ratio, summed, timed_call
from ddtree_runtime.acceptance.prompts import Prompt

BATCH_1_REQUESTS = 4
BATCH_16_REQUESTS = 16
BASELINE = "none"
"""The ``algorithm`` a non-speculative server reports in the figures (``ServerSpec.describe``)."""


def batch_1_throughput(server: Server, prompts: Sequence[Prompt], sampling: Mapping[str, Any]) -> TimedCall:
    return summed([timed_call(server, [p.input_ids], sampling) for p in prompts[:BATCH_1_REQUESTS]])


def batch_16_throughput(server: Server, prompts: Sequence[Prompt], sampling: Mapping[str, Any]) -> TimedCall:
    batch = [prompts[i % len(prompts)].input_ids for i in range(BATCH_16_REQUESTS)]
    return timed_call(server, batch, sampling)


THROUGHPUT_BATCHES: dict[str, tuple[int, Callable[[Server, Sequence[Prompt], Mapping[str, Any]], TimedCall]]] = {
    "batch_1": (1, batch_1_throughput),
    "batch_16": (BATCH_16_REQUESTS, batch_16_throughput),
}
"""Figure name -> (batch size, measurement)."""


def throughput_rows(table: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per server and batch, with tokens/s against the baseline's and (DDTREE) against DFLASH's at the same
    batch. ``table``: server name -> ``{"algorithm", "budget", "batch_1": TimedCall.as_dict(), "batch_16": ...}``."""
    rows = []
    for name, entry in table.items():
        algorithm = entry.get("algorithm")
        for figure, (batch, _measure) in THROUGHPUT_BATCHES.items():
            measured = entry.get(figure)
            if not isinstance(measured, Mapping):
                continue
            tokens_per_s = measured.get("tokens_per_s")
            baseline = figure_of(table, BASELINE, (figure, "tokens_per_s"))
            dflash = figure_of(table, "DFLASH", (figure, "tokens_per_s"))
            rows.append({
                "server": name, "algorithm": algorithm, "budget": entry.get("budget"), "batch": batch,
                "requests": measured.get("requests"), "tokens": measured.get("tokens"),
                "seconds": measured.get("seconds"), "tokens_per_s": tokens_per_s,
                "vs_baseline": None if algorithm == BASELINE else ratio(tokens_per_s, baseline),
                "ddtree_vs_dflash": ratio(tokens_per_s, dflash) if algorithm == "DDTREE" else None,
            })
    return rows
