"""Where a decode round's time goes, from a torch-profiler trace of a real server (SGLang's ``/start_profile``).

The trace is the Chrome-format JSON the profiler exports (``*.trace.json.gz``). Three kinds of events matter:

- GPU work: ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events (device time), each with a ``correlation`` id;
- its launches: ``cuda_runtime`` / ``cuda_driver`` events (host time) with the same ``correlation``, among them
  ``cudaGraphLaunch`` for every kernel of a CUDA-graph replay;
- the DDTree worker's stage ranges: ``user_annotation`` events named ``ddtree.<stage>``
  (:data:`ddtree_runtime.sglang.round_stages.ROUND_STAGES`), which the worker opens only while a profiler runs.

Each GPU event belongs to the innermost stage range that holds its launch on the launching thread (``other`` when
none does: the scheduler's own work, or a stock worker without ranges), and to a CUDA graph or not by its launch.
Over the profiled window (first GPU event's start to the last one's end) the GPU is idle wherever no GPU event runs;
figures are per decode round (the caller says how many rounds the window holds).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_runtime.acceptance.launch import Server, ServerError, generate
from ddtree_runtime.sglang.round_stages import RANGE_PREFIX

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
HOST_WAITS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                        "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2"})
"""Runtime calls that make the launching thread wait for the GPU (a blocking copy or an explicit synchronize)."""
OTHER = "other"


@dataclass(frozen=True)
class Interval:
    start: float
    end: float


@dataclass(frozen=True)
class StageRange:
    name: str
    tid: Any
    start: float
    end: float


def load_trace(path: Path) -> list[dict[str, Any]]:
    """The events of a Chrome trace (``.json`` or ``.json.gz``; a top-level list or ``{"traceEvents": [...]}``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        data = json.load(handle)
    events = data.get("traceEvents", []) if isinstance(data, Mapping) else data
    return [event for event in events if isinstance(event, Mapping)]


def _complete(events: Iterable[Mapping[str, Any]], categories: frozenset[str]) -> list[Mapping[str, Any]]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in categories and "ts" in e and "dur" in e]


def _launches(events: Iterable[Mapping[str, Any]]) -> dict[Any, Mapping[str, Any]]:
    """Each launch (runtime or driver call) by its correlation id."""
    return {e.get("args", {}).get("correlation"): e for e in _complete(events, LAUNCH_CATEGORIES)}


def _stage_ranges(events: Iterable[Mapping[str, Any]]) -> list[StageRange]:
    """The worker's ``ddtree.<stage>`` ranges."""
    return [StageRange(str(e["name"]), e.get("tid"), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in _complete(events, frozenset({"user_annotation"}))
            if str(e.get("name", "")).startswith(RANGE_PREFIX)]


def busy_time(intervals: Sequence[Interval]) -> float:
    """Length of the union of ``intervals`` (overlapping GPU work, e.g. two streams, counts once)."""
    total, reach = 0.0, float("-inf")
    for interval in sorted(intervals, key=lambda i: i.start):
        if interval.end <= reach:
            continue
        total += interval.end - max(interval.start, reach)
        reach = interval.end
    return total


def _stage_of(launch: Mapping[str, Any] | None, ranges: Sequence[StageRange]) -> str:
    if launch is None:
        return OTHER
    at, tid = float(launch["ts"]), launch.get("tid")
    holding = [r for r in ranges if r.tid == tid and r.start <= at <= r.end]
    if not holding:
        return OTHER
    innermost = min(holding, key=lambda r: r.end - r.start)
    return innermost.name.removeprefix(RANGE_PREFIX)


def summarize(events: Sequence[Mapping[str, Any]], rounds: int) -> dict[str, Any]:
    """Per-round GPU time by stage, in and out of CUDA graphs, and the GPU's idle time, in milliseconds; and how
    often a round's host thread waits for the GPU (:data:`HOST_WAITS`) in each stage.

    Raises ValueError when the trace holds no GPU work or ``rounds`` is not positive.
    """
    if rounds <= 0:
        raise ValueError(f"rounds must be positive, got {rounds}")
    gpu = _complete(events, GPU_CATEGORIES)
    if not gpu:
        raise ValueError("the trace holds no GPU events (was the profiler started with the GPU activity?)")
    launches, ranges = _launches(events), _stage_ranges(events)
    by_stage: dict[str, float] = {}
    in_graphs = 0.0
    intervals = []
    for event in gpu:
        start, duration = float(event["ts"]), float(event["dur"])
        intervals.append(Interval(start, start + duration))
        launch = launches.get(event.get("args", {}).get("correlation"))
        stage = _stage_of(launch, ranges)
        by_stage[stage] = by_stage.get(stage, 0.0) + duration
        if launch is not None and launch.get("name") in GRAPH_LAUNCHES:
            in_graphs += duration
    waits: dict[str, int] = {}
    for call in _complete(events, LAUNCH_CATEGORIES):
        if call.get("name") in HOST_WAITS:
            stage = _stage_of(call, ranges)
            waits[stage] = waits.get(stage, 0) + 1
    window = max(i.end for i in intervals) - min(i.start for i in intervals)
    busy = busy_time(intervals)
    per_round_ms = 1e-3 / rounds  # trace times are microseconds

    def ms(value: float) -> float:
        return round(value * per_round_ms, 4)

    return {
        "rounds": rounds,
        "window_ms_per_round": ms(window),
        "gpu_busy_ms_per_round": ms(busy),
        "gpu_idle_ms_per_round": ms(window - busy),
        "gpu_idle_share": round((window - busy) / window, 4) if window > 0 else None,
        "gpu_ms_per_round_by_stage": {stage: ms(total) for stage, total in sorted(by_stage.items())},
        "gpu_ms_per_round_in_cuda_graphs": ms(in_graphs),
        "gpu_ms_per_round_outside_graphs": ms(sum(by_stage.values()) - in_graphs),
        "host_waits_per_round_by_stage": {stage: round(count / rounds, 3) for stage, count in sorted(waits.items())},
        "gpu_events": len(gpu),
        "stage_ranges": len(ranges),
    }


def kernel_table(events: Sequence[Mapping[str, Any]], rounds: int, top: int = 12) -> dict[str, Any]:
    """GPU microseconds and launches per round by kernel: per CUDA graph kind (a replay is ``small`` or ``large``
    by its GPU time, below or above half the largest replay: a DFlash round replays a draft and a verify graph), and
    for work outside graphs by stage; the ``top`` kernels of each."""
    if rounds <= 0:
        raise ValueError(f"rounds must be positive, got {rounds}")
    launches, ranges = _launches(events), _stage_ranges(events)
    replays: dict[Any, list[Mapping[str, Any]]] = {}
    eager: dict[str, dict[str, list[float]]] = {}
    for event in _complete(events, GPU_CATEGORIES):
        launch = launches.get(event.get("args", {}).get("correlation"))
        if launch is not None and launch.get("name") in GRAPH_LAUNCHES:
            replays.setdefault(launch["args"]["correlation"], []).append(event)
            continue
        cell = eager.setdefault(_stage_of(launch, ranges), {}).setdefault(str(event["name"]), [0.0, 0])
        cell[0] += float(event["dur"])
        cell[1] += 1
    largest = max((sum(float(e["dur"]) for e in replay) for replay in replays.values()), default=0.0)
    graphs: dict[str, dict[str, list[float]]] = {}
    for replay in replays.values():
        kind = "large" if sum(float(e["dur"]) for e in replay) > largest / 2 else "small"
        for event in replay:
            cell = graphs.setdefault(kind, {}).setdefault(str(event["name"]), [0.0, 0])
            cell[0] += float(event["dur"])
            cell[1] += 1

    def rows(kernels: Mapping[str, list[float]]) -> dict[str, Any]:
        ranked = sorted(kernels.items(), key=lambda item: -item[1][0])
        return {"us_per_round": round(sum(c[0] for c in kernels.values()) / rounds, 1),
                "launches_per_round": round(sum(c[1] for c in kernels.values()) / rounds, 2),
                "top": [{"kernel": name[:120], "us_per_round": round(c[0] / rounds, 1),
                         "per_round": round(c[1] / rounds, 2)} for name, c in ranked[:top]]}

    return {"graphs": {kind: rows(k) for kind, k in sorted(graphs.items())},
            "outside_graphs": {stage: rows(k) for stage, k in sorted(eager.items())}}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ddtree_runtime.acceptance.round_trace TRACE [--rounds N]``: the summary and the kernel table of a
    kept trace, as JSON."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--rounds", type=int, default=None, help="decode rounds in the trace (default: the profile's)")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    rounds = args.rounds or PROFILE_ROUNDS
    events = load_trace(args.trace)
    json.dump({"summary": summarize(events, rounds), "kernels": kernel_table(events, rounds, args.top)}, sys.stdout,
              indent=1)
    print()
    return 0


PROFILE_ROUNDS = 40
"""Decode rounds each profile covers (SGLang's ``num_steps``: the profiler stops itself after them)."""
PROFILE_NEW_TOKENS = 400
"""The profiled request's length: with random weights a round commits one token, so 40 rounds end well inside it."""
PROFILE_SETTLE_SECONDS = 1.0
"""Wait between sending the request and starting the profiler, so its prefill is over and every step is a round."""
TRACE_TIMEOUT_SECONDS = 180.0


def newest_trace(directory: Path) -> Path | None:
    """The newest rank-0 (or only) trace SGLang wrote under ``directory``."""
    traces = sorted(directory.glob("**/*.trace.json*"), key=lambda p: p.stat().st_mtime)
    ranked = [p for p in traces if "TP-0" in p.name] or traces
    return ranked[-1] if ranked else None


def profile_decode_rounds(server: Server, directory: Path, prompt: Sequence[int]) -> dict[str, Any]:
    """Profile :data:`PROFILE_ROUNDS` decode rounds of one greedy request (batch 1) on ``server`` with SGLang's
    ``/start_profile`` (CPU and GPU activity) and :func:`summarize` its trace; the trace stays in ``directory``.

    Raises :class:`ServerError` when the profiler does not start or no trace appears in time.
    """
    directory.mkdir(parents=True, exist_ok=True)
    sampling = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": PROFILE_NEW_TOKENS}
    outcome: dict[str, Any] = {}

    def decode() -> None:
        try:
            outcome["answers"] = generate(server, [list(prompt)], sampling)
        except Exception as error:  # reported below, in the calling thread
            outcome["error"] = error

    request = threading.Thread(target=decode, daemon=True)
    request.start()
    time.sleep(PROFILE_SETTLE_SECONDS)
    answer = server.call("/start_profile", {"output_dir": str(directory), "num_steps": PROFILE_ROUNDS,
                                            "activities": ["CPU", "GPU"], "profile_id": server.spec.name})
    request.join()
    if answer.status != 200:
        raise ServerError(f"{server.spec.name}: /start_profile answered {answer.status}: {str(answer.body)[:300]}")
    if "error" in outcome:
        raise ServerError(f"{server.spec.name}: the profiled request failed: {outcome['error']}")
    deadline = time.monotonic() + TRACE_TIMEOUT_SECONDS
    trace = newest_trace(directory)
    while trace is None and time.monotonic() < deadline:
        time.sleep(2.0)
        trace = newest_trace(directory)
    if trace is None:
        raise ServerError(f"{server.spec.name}: no trace under {directory} {TRACE_TIMEOUT_SECONDS:g} s after the "
                          "profiled request")
    wait_until_written(trace, deadline)
    return {**summarize(load_trace(trace), PROFILE_ROUNDS), "trace": str(trace)}


def wait_until_written(path: Path, deadline: float, settle: float = 2.0) -> None:
    """Wait until ``path`` keeps its size for ``settle`` seconds (the exporter writes the file it just created)."""
    size = -1
    while time.monotonic() < deadline:
        current = path.stat().st_size
        if current == size and current > 0:
            return
        size = current
        time.sleep(settle)
    raise ServerError(f"{path} was still being written {TRACE_TIMEOUT_SECONDS:g} s after the profiled request")


if __name__ == "__main__":
    sys.exit(main())
