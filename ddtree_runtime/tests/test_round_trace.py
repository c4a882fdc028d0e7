"""Where a round's time goes: the worker's stage ranges in a real torch-profiler trace, and the trace summary."""

from __future__ import annotations

import gzip
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from ddtree_runtime.acceptance.launch import ServerError
from ddtree_runtime.acceptance.round_trace import (
    Interval,
    busy_time,
    kernel_table,
    load_trace,
    main,
    summarize,
    wait_until_written,
)
from ddtree_runtime.sglang.round_stages import ROUND_STAGES, RoundStages


def round_of_stages() -> None:
    stages = RoundStages()
    try:
        for stage in ROUND_STAGES:
            stages.enter(stage)
            torch.ones(8).add_(1)
    finally:
        stages.close()


def test_stage_ranges_reach_a_profiler_trace_in_round_order(tmp_path: Path) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        round_of_stages()
    trace = tmp_path / "round.trace.json"
    profiler.export_chrome_trace(str(trace))
    ranges = sorted((e for e in load_trace(trace) if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    assert [e["name"] for e in ranges] == [f"ddtree.{stage}" for stage in ROUND_STAGES]
    for earlier, later in itertools.pairwise(ranges):
        assert earlier["ts"] + earlier["dur"] <= later["ts"], "one stage closes before the next opens"


def test_without_a_profiler_no_range_is_opened() -> None:
    stages = RoundStages()
    stages.enter("draft")
    assert stages._open is None
    stages.close()
    with pytest.raises(ValueError, match="unknown round stage 'lm_head'"):
        stages.enter("lm_head")


def kernel(ts: float, dur: float, correlation: int, name: str = "k") -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7,
            "args": {"correlation": correlation}}


def launch(ts: float, correlation: int, name: str = "cudaLaunchKernel", tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 2, "tid": tid,
            "args": {"correlation": correlation}}


def stage(name: str, ts: float, dur: float, tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": f"ddtree.{name}", "ts": ts, "dur": dur, "tid": tid}


def two_rounds() -> list[dict[str, Any]]:
    """Two rounds of 1000 us each: a draft graph (300 us), an eager top-k kernel (100 us), a verify graph (400 us)
    and a commit kernel (50 us) in the first; the second the same 1000 us later. Gaps: 150 us a round."""
    events: list[dict[str, Any]] = []
    for r in range(2):
        base = 1000.0 * r
        c = 10 * r
        events += [stage("draft", base, 40), launch(base + 5, c + 1, "cudaGraphLaunch"),
                   kernel(base + 10, 300, c + 1),
                   stage("topk", base + 40, 20), launch(base + 45, c + 2), kernel(base + 310, 100, c + 2),
                   stage("verify", base + 60, 30), launch(base + 65, c + 3, "cudaGraphLaunch"),
                   kernel(base + 450, 250, c + 3), kernel(base + 700, 150, c + 3),
                   stage("commit", base + 90, 10), launch(base + 95, c + 4), kernel(base + 900, 50, c + 4)]
    # a kernel the scheduler launched outside every range, and a stage range of another thread that holds it
    events += [launch(2500, 99, tid=2), stage("accept", 2400, 200, tid=3), kernel(1960, 40, 99)]
    return events


def test_summary_attributes_gpu_time_to_the_stage_that_launched_it() -> None:
    summary = summarize(two_rounds(), rounds=2)
    expected = {"draft": 0.3, "topk": 0.1, "verify": 0.4, "commit": 0.05, "other": 0.02}
    assert summary["gpu_ms_per_round_by_stage"] == expected
    assert summary["gpu_ms_per_round_in_cuda_graphs"] == 0.7
    assert summary["gpu_ms_per_round_outside_graphs"] == pytest.approx(0.17)
    # window 10 .. 2000 us; busy 2 x 850 + 40 (the scheduler's kernel) = 1740 us
    assert summary["window_ms_per_round"] == pytest.approx(0.995)
    assert summary["gpu_busy_ms_per_round"] == pytest.approx(0.87)
    assert summary["gpu_idle_ms_per_round"] == pytest.approx(0.125)
    assert summary["gpu_idle_share"] == pytest.approx(250 / 1990, abs=1e-4)


def test_host_waits_for_the_gpu_are_counted_per_round_in_the_stage_that_waited() -> None:
    events = two_rounds()
    # round 1: the accept stage reads the device (a blocking copy), the scheduler synchronizes outside every range
    events += [stage("accept", 100, 5), launch(101, 50, "cudaMemcpy"), launch(600, 51, "cudaStreamSynchronize"),
               launch(1600, 52, "cudaStreamSynchronize"), launch(1601, 53, "cudaMemcpyAsync")]
    summary = summarize(events, rounds=2)
    assert summary["host_waits_per_round_by_stage"] == {"accept": 0.5, "other": 1.0}
    assert summarize(two_rounds(), rounds=2)["host_waits_per_round_by_stage"] == {}


def test_the_kernel_table_splits_graph_replays_by_size_and_eager_work_by_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [*two_rounds(), launch(3000, 77, "cudaGraphLaunch"), kernel(3010, 20, 77, name="tiny")]
    table = kernel_table(events, rounds=2)
    # replays of 300 and 400 us are "large" (above half the largest), the 20 us one "small"
    assert table["graphs"]["large"]["us_per_round"] == 700.0
    assert table["graphs"]["large"]["launches_per_round"] == 3.0
    assert table["graphs"]["small"] == {"us_per_round": 10.0, "launches_per_round": 0.5,
                                        "top": [{"kernel": "tiny", "us_per_round": 10.0, "per_round": 0.5}]}
    assert table["outside_graphs"]["topk"] == {"us_per_round": 100.0, "launches_per_round": 1.0,
                                               "top": [{"kernel": "k", "us_per_round": 100.0, "per_round": 1.0}]}
    assert table["outside_graphs"]["other"]["us_per_round"] == 20.0
    with pytest.raises(ValueError, match="rounds must be positive"):
        kernel_table(two_rounds(), rounds=0)
    trace = tmp_path / "t.trace.json"
    trace.write_text(json.dumps(two_rounds()))
    assert main([str(trace), "--rounds", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"] == summarize(two_rounds(), rounds=2)
    assert printed["kernels"] == kernel_table(two_rounds(), rounds=2)


def test_overlapping_gpu_work_counts_once_and_bad_input_is_refused(tmp_path: Path) -> None:
    assert busy_time([Interval(0, 10), Interval(5, 12), Interval(20, 21), Interval(1, 3)]) == 13
    with pytest.raises(ValueError, match="no GPU events"):
        summarize([stage("draft", 0, 5)], rounds=1)
    with pytest.raises(ValueError, match="rounds must be positive"):
        summarize(two_rounds(), rounds=0)
    packed = tmp_path / "rank0.trace.json.gz"
    with gzip.open(packed, "wt") as handle:
        json.dump({"traceEvents": two_rounds()}, handle)
    assert summarize(load_trace(packed), rounds=2) == summarize(two_rounds(), rounds=2)


def test_a_trace_is_read_only_once_the_exporter_stopped_writing_it(tmp_path: Path) -> None:
    written = tmp_path / "done.trace.json"
    written.write_text("{}")
    wait_until_written(written, time.monotonic() + 5, settle=0.05)
    empty = tmp_path / "empty.trace.json"
    empty.touch()
    with pytest.raises(ServerError, match="still being written"):
        wait_until_written(empty, time.monotonic() + 0.3, settle=0.05)
