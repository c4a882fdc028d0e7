"""Benchmark: DDTree tree-build time per round on the CPU.

Times one round's tree construction from ``[L, V]`` float32 draft logits, split into the stages that
:func:`ddtree_runtime.tree.build_tree` reports: float32 logsumexp + ranked top-k, the Python best-first
heap, the numpy visibility matrix, and the total (median per stage). Optionally also the
batched pure-PyTorch path (:func:`build_tree_batch`, its visibility matrix included as in the total). Reports
the median over ``--rounds`` rounds, each on fresh random logits (``randn * scale``).

    python -m ddtree_runtime.bench.tree_build --vocab 151936 --budgets 16,32,64,128,256,512,1024
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from ddtree_runtime.tree import build_tree, build_tree_batch


def median_ms(fn: Callable[[torch.Tensor], object], inputs: list[torch.Tensor]) -> float:
    samples = []
    for logits in inputs:
        begin = time.perf_counter()
        fn(logits)
        samples.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--depth", type=int, default=15)
    p.add_argument("--budgets", default="16,32,64,128,256,512,1024")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--scale", type=float, default=3.0, help="scale of the random logits")
    p.add_argument("--peak", type=float, default=0.0, help="logit boost of one random token per depth")
    p.add_argument("--batched", action="store_true", help="also time build_tree_batch with batch 1")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    inputs = []
    for _unused in range(args.rounds):
        logits = torch.randn(args.depth, args.vocab, generator=generator) * args.scale
        favourite = torch.randint(0, args.vocab, (args.depth, 1), generator=generator)
        inputs.append(logits.scatter_add(1, favourite, torch.full((args.depth, 1), args.peak)))
    build_tree(inputs[0], 16)  # warm-up
    header = "| budget | topk+logsumexp ms | heap ms | visibility ms | build_tree total ms | nodes | max depth |"
    if args.batched:
        header += " build_tree_batch ms |"
    print(f"L={args.depth} V={args.vocab} rounds={args.rounds} threads={args.threads}", end=" ")
    print(f"scale={args.scale} peak={args.peak}")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for budget in (int(b) for b in args.budgets.split(",")):
        stages: dict[str, list[float]] = {"topk": [], "heap": [], "visibility": [], "total": []}
        for logits in inputs:
            timings: dict[str, float] = {}
            begin = time.perf_counter()
            tree = build_tree(logits, budget, timings=timings)
            stages["total"].append(time.perf_counter() - begin)
            for name in ("topk", "heap", "visibility"):
                stages[name].append(timings[name])
        ms = {name: statistics.median(values) * 1e3 for name, values in stages.items()}
        row = f"| {budget} | {ms['topk']:.2f} | {ms['heap']:.2f} | {ms['visibility']:.2f} | {ms['total']:.2f} |"
        row += f" {tree.num_nodes} | {tree.max_depth} |"
        if args.batched:
            batch_inputs = [x[None] for x in inputs[:3]]
            row += f" {median_ms(lambda x, b=budget: build_tree_batch(x, [b]).visibility, batch_inputs):.1f} |"
        print(row)


if __name__ == "__main__":
    main()
