"""Benchmark: one DDTree round's tree work on a GPU, the reference path vs the CUDA extension.

Reference (as the paper's code does it): per request, ``build_tree`` = top-K and logsumexp on the GPU, a
device-to-host copy, the Python heap and the numpy ancestor matrix; a batch is a loop over requests.
Ours: ``ops.build_tree`` (fused top-K kernel + best-first tree kernel) and ``ops.tree_verify_inputs`` (tokens,
positions, ancestor mask and retrieve lists; the flat SGLang mask is timed separately), batched in one launch
per kernel, timed with CUDA events (eager) and as one CUDA-graph replay. Logits are bf16 ``[B, 15, V]`` with one
boosted token per depth (a confident drafter: deep trees), at the user's vocabulary (Qwen3.6, 248320) and Qwen3's
(151936) by default. The top-K's bandwidth is the logits' bytes over its time; beside it, the same bytes read by
``torch.amax`` over the last dim, a memory-bound floor measured on the same tensor, and one row's ``amax`` as a
graph replay (the latency floor of a single-row read). A one-call graph's replay is bound by the host's launch
cost, so the round, the top-K and the one-row read are also timed per call in a graph of ten calls (GPU time).
``--compare-topk-paths`` times the top-K with the filter and the chunked path forced, where both apply.

    python -m ddtree_runtime.bench.kernels --batches 1,4,16,48 --json kernels.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from collections.abc import Callable

import torch

from ddtree_runtime import ops
from ddtree_runtime.tree import build_tree

CUDA = torch.device("cuda")
GRAPH_CALLS = 10


def make_logits(batch: int, depth: int, vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, depth, vocab, generator=generator)
    favourite = torch.randint(0, vocab, (batch, depth, 1), generator=generator)
    logits.scatter_add_(2, favourite, torch.full((batch, depth, 1), 14.0))
    return logits.to(torch.bfloat16).to(CUDA)


def reference_us(logits: torch.Tensor, budget: int, rounds: int) -> float:
    build_tree(logits[0], budget)  # warm-up
    samples = []
    for _unused in range(rounds):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for b in range(logits.shape[0]):
            build_tree(logits[b], budget)
        samples.append((time.perf_counter() - begin) * 1e6)
    return statistics.median(samples)


def event_us(fn: Callable[[], object], iterations: int) -> float:
    for _unused in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _unused in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iterations


def graph_us(fn: Callable[[], object], iterations: int, calls: int = 1) -> float:
    """Time per call of ``fn`` captured ``calls`` times in one CUDA graph. With one call a small graph's replay is
    bound by the host's launch (~10 us on the H100 here); with several, the GPU's own time per call shows."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _unused in range(calls):
            fn()
    return event_us(graph.replay, iterations) / calls


TOPK_PATH_ENV = "DDTREE_TOPK_PATH"


def forced_path_graph_us(path: str, fn: Callable[[], object], iterations: int, calls: int) -> float:
    """``graph_us`` with the extension's top-K path forced (DDTREE_TOPK_PATH, read at each launch)."""
    saved = os.environ.get(TOPK_PATH_ENV)
    os.environ[TOPK_PATH_ENV] = path
    try:
        return graph_us(fn, iterations, calls)
    finally:
        if saved is None:
            del os.environ[TOPK_PATH_ENV]
        else:
            os.environ[TOPK_PATH_ENV] = saved


def kernel_us(fn: Callable[[], object], iterations: int) -> dict[str, float]:
    """GPU time per call of each kernel that ``fn`` launches (torch profiler, eager calls), in microseconds."""
    for _unused in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _unused in range(iterations):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0.0)
        if device_us > 0:
            name = kernel_name(event.key)
            times[name] = times.get(name, 0.0) + device_us / iterations
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def kernel_name(key: str) -> str:
    """The function name of a profiler key (``void ddtree::(anonymous namespace)::tree_links_kernel<256, 4>(...)``
    -> ``tree_links_kernel``); other keys (memsets, torch's own kernels) cut to 60 characters."""
    match = re.search(r"(\w+_kernel)\b", key)
    return match.group(1) if match else key[:60]


def spin_up(seconds: float) -> None:
    """Keep the GPU busy so that it leaves its idle clocks before a timing (they start near 345 MHz)."""
    a = torch.randn(4096, 4096, device=CUDA, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _unused in range(20):
            a @ a
        torch.cuda.synchronize()


def sm_clock_mhz() -> int | None:
    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # pynvml missing or not permitted: the clock is then simply not reported
        return None


def terabytes_per_second(nbytes: int, microseconds: float) -> float:
    return nbytes / (microseconds * 1e-6) / 1e12


def measure(vocab: int, batch: int, budget: int, args: argparse.Namespace) -> dict[str, float | int | None]:
    logits = make_logits(batch, args.depth, vocab, seed=batch * 7919 + budget)
    logits_bytes = logits.numel() * logits.element_size()
    budgets = torch.full((batch,), budget, dtype=torch.long, device=CUDA)
    roots = torch.zeros(batch, dtype=torch.long, device=CUDA)
    seq_lens = torch.full((batch,), args.seq_len, dtype=torch.long, device=CUDA)
    width = budget + 1
    flat_numel = batch * width * (args.seq_len + width)
    top, tree = ops.build_tree(logits, budgets, max_budget=budget)

    def ours() -> None:
        _unused, t = ops.build_tree(logits, budgets, max_budget=budget)
        ops.tree_verify_inputs(t, roots, seq_lens, mask_numel=0)

    result: dict[str, float | int | None] = {
        "vocab": vocab,
        "batch": batch,
        "budget": budget,
        "nodes_first_request": int(tree.num_nodes[0]),
        "reference_us": reference_us(logits, budget, args.rounds),
    }
    spin_up(args.spin_up)
    result |= {
        "sm_clock_mhz_before": sm_clock_mhz(),
        "topk_us": event_us(lambda: ops.topk_log_probs(logits, top.ids.shape[2]), args.iterations),
        "tree_us": event_us(lambda: ops.build_tree_from_topk(top.log_probs, top.ids, budgets, budget), args.iterations),
        "verify_inputs_us": event_us(lambda: ops.tree_verify_inputs(tree, roots, seq_lens, 0), args.iterations),
        "flat_mask_us": event_us(lambda: ops.tree_verify_inputs(tree, roots, seq_lens, flat_numel), args.iterations),
        "ours_us": event_us(ours, args.iterations),
        "ours_graph_us": graph_us(ours, args.iterations),
        "sm_clock_mhz_after": sm_clock_mhz(),
        "empty_graph_kernel_us": graph_us(lambda: roots.add_(0), args.iterations),
        "read_floor_us": event_us(lambda: torch.amax(logits, dim=-1), args.iterations),
        # One row's read, as a graph replay: the latency floor that a top-K at batch 1 is compared with.
        "row_floor_graph_us": graph_us(lambda: torch.amax(logits[0, 0], dim=-1), args.iterations),
        "topk_graph_us": graph_us(lambda: ops.topk_log_probs(logits, top.ids.shape[2]), args.iterations),
        # The same three with GRAPH_CALLS calls per graph: GPU time per call, without the host's replay cost.
        "ours_graph_calls_us": graph_us(ours, args.iterations, GRAPH_CALLS),
        "row_floor_graph_calls_us": graph_us(lambda: torch.amax(logits[0, 0], dim=-1), args.iterations, GRAPH_CALLS),
        "topk_graph_calls_us": graph_us(lambda: ops.topk_log_probs(logits, top.ids.shape[2]), args.iterations,
                                        GRAPH_CALLS),
        "logits_bytes": logits_bytes,
    }
    # The chunked path exists only for fewer rows than SMs (elsewhere forcing it would time the automatic choice).
    if args.compare_topk_paths and batch * args.depth < torch.cuda.get_device_properties(CUDA).multi_processor_count:
        for path in ("filter", "chunked"):
            result[f"topk_graph_calls_{path}_us"] = forced_path_graph_us(
                path, lambda: ops.topk_log_probs(logits, top.ids.shape[2]), args.iterations, GRAPH_CALLS)
    result["topk_tb_s"] = terabytes_per_second(logits_bytes, result["topk_us"])
    result["read_floor_tb_s"] = terabytes_per_second(logits_bytes, result["read_floor_us"])
    if args.kernel_times:
        result["kernel_us"] = kernel_us(ours, args.iterations)  # type: ignore[assignment]
    result["speedup"] = result["reference_us"] / result["ours_us"]
    result["speedup_graph"] = result["reference_us"] / result["ours_graph_us"]
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocabs", default="248320,151936", help="vocabulary sizes, each measured in the same run")
    p.add_argument("--depth", type=int, default=15)
    p.add_argument("--budgets", default="16,64,256,1024")
    p.add_argument("--batches", default="1,4,16,48")
    p.add_argument("--rounds", type=int, default=10, help="reference rounds (median)")
    p.add_argument("--iterations", type=int, default=50, help="kernel iterations per timing (mean)")
    p.add_argument("--seq-len", type=int, default=1024, help="committed length for the flat-mask timing")
    p.add_argument("--spin-up", type=float, default=0.3, help="seconds of matmuls before each kernel timing")
    p.add_argument("--kernel-times", action="store_true", help="also profile each kernel's GPU time per call")
    p.add_argument("--compare-topk-paths", action="store_true",
                   help="also time the top-K with the filter and the chunked path forced (where each applies)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if not (torch.cuda.is_available() and ops.extension_available()):
        raise SystemExit(f"needs a CUDA GPU and the extension: {ops.extension_error() or 'no GPU'}")
    rows = [measure(vocab, batch, budget, args) for vocab in map(int, args.vocabs.split(","))
            for batch in map(int, args.batches.split(",")) for budget in map(int, args.budgets.split(","))]
    header = ("| V | batch | budget | reference us | ours us (eager) | ours us (graph) | speedup (eager / graph) | "
              "top-K us | top-K TB/s | top-K graph us | amax floor us (TB/s) | "
              "one-row amax graph us | tree us | verify inputs us | + flat mask us | "
              "one-kernel graph us | SM MHz | per call in a 10-call graph: ours / top-K / one-row amax us |")
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"L={args.depth} bf16")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in rows:
        print(f"| {r['vocab']} | {r['batch']} | {r['budget']} | {r['reference_us']:.0f} | {r['ours_us']:.1f} | "
              f"{r['ours_graph_us']:.1f} | {r['speedup']:.0f}x / {r['speedup_graph']:.0f}x | {r['topk_us']:.1f} | "
              f"{r['topk_tb_s']:.2f} | {r['topk_graph_us']:.1f} | "
              f"{r['read_floor_us']:.1f} ({r['read_floor_tb_s']:.2f}) | "
              f"{r['row_floor_graph_us']:.1f} | {r['tree_us']:.1f} | "
              f"{r['verify_inputs_us']:.1f} | {r['flat_mask_us']:.1f} | "
              f"{r['empty_graph_kernel_us']:.1f} | {r['sm_clock_mhz_before']}/{r['sm_clock_mhz_after']} | "
              f"{r['ours_graph_calls_us']:.1f} / {r['topk_graph_calls_us']:.1f} / "
              f"{r['row_floor_graph_calls_us']:.1f} |")
    for r in rows:
        if "topk_graph_calls_filter_us" in r:
            print(f"V {r['vocab']} batch {r['batch']} k {r['budget']} top-K per call (10-call graph): "
                  f"filter {r['topk_graph_calls_filter_us']:.1f} us, chunked {r['topk_graph_calls_chunked_us']:.1f} us")
    for r in rows:
        if "kernel_us" in r:
            kernels = ", ".join(f"{name} {us:.1f}" for name, us in r["kernel_us"].items())  # type: ignore[union-attr]
            print(f"V {r['vocab']} batch {r['batch']} budget {r['budget']} kernel us per call: {kernels}")
    if args.json:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
                "depth": args.depth, "vocabs": args.vocabs, "seq_len": args.seq_len}
        with open(args.json, "w") as handle:
            json.dump({"meta": meta, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
