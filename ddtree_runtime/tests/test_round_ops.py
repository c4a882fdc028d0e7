"""The round's host-side operator count (``python -m ddtree_runtime.bench.round_ops``) measures what it says."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from ddtree_runtime.bench.round_ops import count_operators, main, measure


def test_the_counter_sees_every_dispatched_operator() -> None:
    x = torch.arange(6)
    counts = count_operators(lambda: (x + 1).view(2, 3).sum())
    assert counts == {"add": 1, "view": 1, "sum": 1}


def test_every_bookkeeping_step_is_counted_at_every_shape(tmp_path: Path) -> None:
    rows = measure([1, 16], [15, 64])
    assert len(rows) == 2 * 2 * 4
    assert {row["step"] for row in rows} == {"SGLang padding of the verify inputs", "accepted paths",
                                             "accepted-first slot order", "committed tokens and bonus"}
    assert all(row["operators"] == sum(row["by_operator"].values()) > 0 for row in rows)
    out = tmp_path / "ops.json"
    assert main(["--batches", "1", "--budgets", "64", "--json", str(out)]) == 0
    assert [row["step"] for row in json.loads(out.read_text())] == [row["step"] for row in rows[4:8]]
