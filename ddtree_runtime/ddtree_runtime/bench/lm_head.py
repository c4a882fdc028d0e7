"""Benchmark: what fusing the top-K into the drafter's LM head could save (issue 15's fused entry point).

The drafter's hidden states ``[B * L, H]`` go through the target's LM head ``[V, H]`` (bf16; Qwen3.6-27B:
H = 5120, V = 248320) and then through the per-depth top-K. A fused kernel would skip writing and re-reading
the logits, but it still has to read the whole LM-head weight once, so its floor is the weight's bytes at the
bandwidth of a device-to-device copy of that weight. This measures, as CUDA-graph replays on random weights: the
LM head alone (cuBLAS, ``torch.mm``), the extension's top-K alone, both in sequence (the path served today), and
that floor. What the top-K adds to the sequence is all that fusing it could save with a GEMM as fast as cuBLAS's;
a fused kernel that also beat cuBLAS could at most reach the floor.

    python -m ddtree_runtime.bench.lm_head --batches 1,4,16 --json lm_head.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from ddtree_runtime import ops
from ddtree_runtime.bench.kernels import CUDA, graph_us, spin_up, terabytes_per_second


def measure(batch: int, weight: torch.Tensor, copy: torch.Tensor, args: argparse.Namespace) -> dict[str, float | int]:
    vocab, hidden_size = weight.shape
    rows = batch * args.depth
    generator = torch.Generator(device=CUDA).manual_seed(batch)
    hidden = torch.randn(rows, hidden_size, generator=generator, device=CUDA, dtype=torch.bfloat16)
    logits = F.linear(hidden, weight).view(batch, args.depth, vocab)

    def head() -> None:
        torch.mm(hidden, weight.t(), out=logits.view(rows, vocab))

    def topk() -> None:
        ops.topk_log_probs(logits, args.k)

    def head_then_topk() -> None:
        head()
        topk()

    spin_up(args.spin_up)
    weight_bytes = weight.numel() * weight.element_size()
    logits_bytes = logits.numel() * logits.element_size()
    result: dict[str, float | int] = {
        "batch": batch,
        "rows": rows,
        "hidden": hidden_size,
        "vocab": vocab,
        "k": args.k,
        "weight_bytes": weight_bytes,
        "logits_bytes": logits_bytes,
        "head_us": graph_us(head, args.iterations, args.calls),
        "topk_us": graph_us(topk, args.iterations, args.calls),
        "head_then_topk_us": graph_us(head_then_topk, args.iterations, args.calls),
        # A copy reads and writes the weight: half its time is the floor of one read.
        "weight_read_floor_us": graph_us(lambda: copy.copy_(weight), args.iterations, args.calls) / 2,
    }
    result["head_tb_s"] = terabytes_per_second(weight_bytes, result["head_us"])
    result["floor_tb_s"] = terabytes_per_second(weight_bytes, result["weight_read_floor_us"])
    result["topk_in_sequence_us"] = result["head_then_topk_us"] - result["head_us"]
    result["topk_share"] = result["topk_in_sequence_us"] / result["head_then_topk_us"]
    result["most_fusion_saves_us"] = result["head_then_topk_us"] - result["weight_read_floor_us"]
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=5120, help="hidden size (Qwen3.6-27B: 5120)")
    p.add_argument("--vocab", type=int, default=248320)
    p.add_argument("--depth", type=int, default=15, help="drafted positions per request (rows of the LM head)")
    p.add_argument("--k", type=int, default=64, help="per-depth top-K (a tree budget's k)")
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--iterations", type=int, default=20, help="graph replays per timing (mean)")
    p.add_argument("--calls", type=int, default=3, help="calls captured per graph")
    p.add_argument("--spin-up", type=float, default=0.3, help="seconds of matmuls before each row's timings")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if not (torch.cuda.is_available() and ops.extension_available()):
        raise SystemExit(f"needs a CUDA GPU and the extension: {ops.extension_error() or 'no GPU'}")
    weight = torch.randn(args.vocab, args.hidden, device=CUDA, dtype=torch.bfloat16) * 0.02
    copy = torch.empty_like(weight)
    rows = [measure(batch, weight, copy, args) for batch in map(int, args.batches.split(","))]
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, LM head [{args.vocab}, {args.hidden}] "
          f"bf16, L={args.depth}, k={args.k}, per call in a {args.calls}-call graph")
    print("| batch | LM head us (TB/s) | top-K alone us | head + top-K us | top-K in the sequence us (share) | "
          "weight-read floor us (TB/s) | most a fused kernel saves us |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['head_us']:.1f} ({r['head_tb_s']:.2f}) | {r['topk_us']:.1f} | "
              f"{r['head_then_topk_us']:.1f} | {r['topk_in_sequence_us']:.1f} ({100 * r['topk_share']:.1f}%) | "
              f"{r['weight_read_floor_us']:.1f} ({r['floor_tb_s']:.2f}) | {r['most_fusion_saves_us']:.1f} |")
    if args.json:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
        with open(args.json, "w") as handle:
            json.dump({"meta": meta, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
