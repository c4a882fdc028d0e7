"""Benchmark without a GPU: the PyTorch operators a DDTree round's bookkeeping dispatches, per step.

Under SGLang's overlap scheduler the CPU prepares round t+1 while the GPU runs round t, so the host's work per round
is hidden only while it stays below the GPU's; every eager operator costs a dispatch (a few microseconds of CPU) and,
on a GPU, a kernel launch. This counts the operators of the round's steps that run outside CUDA graphs and need no
SGLang and take the same path on CPU and GPU (SGLang's padding of the verify inputs, the tree walk's results in node
terms, the accepted-first slot order, the committed tokens and the bonus) with ``TorchDispatchMode`` on CPU tensors
of a round's real shapes: what a GPU launches for the same steps (each operator one kernel, or a view). The tree and
its verify inputs themselves are two compiled kernels on a GPU (``ddtree_runtime.ops``), not counted here.

    python -m ddtree_runtime.bench.round_ops --batches 1,16 --budgets 15,64
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddtree_runtime.sglang.tree_inputs import (
    accepted_first_order,
    accepted_paths,
    committed_tokens,
    sglang_verify_inputs,
    with_sglang_padding,
)
from ddtree_runtime.tree import build_tree_batch_from_topk, ranked_topk

DRAFT_TOKENS = 16


class OperatorCounter(TorchDispatchMode):
    """Counts every ATen operator dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def count_operators(step: Callable[[], Any]) -> Counter[str]:
    with OperatorCounter() as counter:
        step()
    return counter.counts


def round_steps(batch: int, budget: int, seed: int = 0) -> dict[str, Callable[[], Any]]:
    """The bookkeeping steps of one round at ``batch`` requests and ``budget`` nodes, on CPU tensors."""
    generator = torch.Generator().manual_seed(seed)
    depth, vocab, width = DRAFT_TOKENS - 1, 4096, budget + 1
    logits = torch.randn(batch, depth, vocab, generator=generator)
    log_probs, ids = ranked_topk(torch.log_softmax(logits, dim=-1), min(budget, vocab))
    roots = torch.randint(0, vocab, (batch,), generator=generator)
    seq_lens = torch.randint(100, 400, (batch,), generator=generator)
    trees = build_tree_batch_from_topk(log_probs, ids, torch.full((batch,), budget))
    verify = sglang_verify_inputs(trees, roots, seq_lens, width, seq_lens_sum=int(seq_lens.sum()))
    # the walk's output in SGLang's layout: the root, then node 1's chain of first children, 3 nodes accepted
    accept_index = torch.full((batch, DRAFT_TOKENS), -1, dtype=torch.int32)
    accept_index[:, 0] = torch.arange(batch) * width
    accept_index[:, 1:4] = accept_index[:, :1] + torch.tensor([1, 2, 3], dtype=torch.int32)
    accept_lens = torch.full((batch,), 4, dtype=torch.int32)
    predicts = torch.randint(0, vocab, (batch * width,), generator=generator)
    paths = accepted_paths(accept_index, accept_lens - 1, width)
    return {
        "SGLang padding of the verify inputs": lambda: with_sglang_padding(verify, roots),
        "accepted paths": lambda: accepted_paths(accept_index, accept_lens - 1, width),
        "accepted-first slot order": lambda: accepted_first_order(paths, width),
        "committed tokens and bonus": lambda: torch.gather(
            committed_tokens(predicts, paths, DRAFT_TOKENS), 1, (paths.lengths - 1)[:, None]),
    }


def measure(batches: list[int], budgets: list[int]) -> list[dict[str, Any]]:
    rows = []
    for batch in batches:
        for budget in budgets:
            for step, run in round_steps(batch, budget).items():
                counts = count_operators(run)
                rows.append({"batch": batch, "budget": budget, "step": step, "operators": sum(counts.values()),
                             "by_operator": dict(sorted(counts.items()))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree_runtime.bench.round_ops", description=__doc__)
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--budgets", default="15,64", help="comma-separated tree budgets")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    rows = measure([int(b) for b in args.batches.split(",")], [int(b) for b in args.budgets.split(",")])
    print("| batch | budget | step | operators |\n|---:|---:|---|---:|")
    for row in rows:
        print(f"| {row['batch']} | {row['budget']} | {row['step']} | {row['operators']} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
