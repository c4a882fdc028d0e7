"""Benchmark: acceptance length (tau) and CPU throughput of AR vs DFlash vs DDTree on a model pair.

By default the pair is the random byte pair of :mod:`ddtree_runtime.reference.tiny` (a Qwen3 target + a DFlash
drafter, saved under a temp dir; the lab's server makes the same models for paths that are not on disk). With random
weights the drafter carries no information about the target, so tau is about 1 for every method; that is the expected
result, not a bug.
Pass ``--target``/``--drafter`` directories to run a trained pair instead.

    python -m ddtree_runtime.bench.tau --prompts 8 --max-new-tokens 64 --budgets 16,64,256
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from ddtree_runtime.reference import DFlashDrafter, SpeculativeDecoder, load_dflash, save_dflash, save_qwen3
from ddtree_runtime.reference.target import load_target
from ddtree_runtime.reference.tiny import name_seed, random_byte_drafter, random_byte_target
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tokenizer import chat_prompt, load_tokenizer

PROMPTS = [
    "Explain speculative decoding in one paragraph.",
    "Write a Python function that reverses a linked list.",
    "What is the capital of France?",
    "List three prime numbers greater than 100.",
    "Summarise the plot of Hamlet.",
    "Translate 'good morning' into German.",
    "Why is the sky blue?",
    "Give me a haiku about GPUs.",
]


def save_random_pair(root: Path) -> tuple[Path, Path]:
    """The random byte pair saved under ``root``: the target's directory and the drafter's (seeded from the names
    ``/bench/target`` and ``/bench/drafter``, the weights this benchmark has always run)."""
    target = random_byte_target(name_seed("/bench/target"))
    target_dir, drafter_dir = root / "target", root / "drafter"
    save_qwen3(target, target_dir)
    save_dflash(random_byte_drafter(target.config, name_seed("/bench/drafter")), drafter_dir)
    return target_dir, drafter_dir


def load_pair(target: str | None, drafter: str | None, dtype: torch.dtype) -> tuple[SpeculativeDecoder, Path]:
    """The decoder and the target's directory (whose tokenizer the prompts use)."""
    if target is None:
        target_dir, drafter_dir = save_random_pair(Path(tempfile.mkdtemp(prefix="ddtree-bench-")))
        model = load_target(target_dir, dtype=dtype)
    else:
        target_dir, model = Path(target), load_target(target, dtype=dtype)
        drafter_dir = Path(drafter) if drafter else None
    draft = DFlashDrafter(load_dflash(drafter_dir, dtype=dtype), model) if drafter_dir else None
    return SpeculativeDecoder(model, draft), target_dir


def bench_prompts(target_dir: Path, count: int) -> list[list[int]]:
    """The first ``count`` prompts as chat prompts, in the ids of the target's tokenizer (:func:`load_tokenizer`)."""
    tokenizer = load_tokenizer(target_dir)
    return [tokenizer.encode(chat_prompt([{"role": "user", "content": t}])) for t in PROMPTS[:count]]


def run(
    decoder: SpeculativeDecoder,
    prompts: list[list[int]],
    method: str,
    params: SamplingParams,
    reference: list[list[int]],
    **kw: int,
) -> tuple[str, list[list[int]]]:
    """One table row (tau, tokens, CPU tokens/s, whether every output equals ``reference``) and the outputs."""
    taus, outputs, seconds = [], [], 0.0
    for ids in prompts:
        begin = time.perf_counter()
        result = decoder.generate(ids, params, method, **kw)  # type: ignore[arg-type]
        seconds += time.perf_counter() - begin
        outputs.append(result.tokens)
        taus.append(result.stats.tau)
    tokens = sum(len(o) for o in outputs)
    tau = sum(taus) / len(taus)
    label = method if method == "ar" else f"{method} {kw}"
    same = "yes" if not reference or outputs == reference else "NO"
    return f"| {label} | {tau:.3f} | {tokens} | {tokens / seconds:.1f} | {same} |", outputs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target")
    p.add_argument("--drafter")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--draft-tokens", type=int, default=16)
    p.add_argument("--budgets", default="16,64,256")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    decoder, target_dir = load_pair(args.target, args.drafter, torch.float32)
    prompts = bench_prompts(target_dir, args.prompts)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    print(f"prompts={len(prompts)} max_new_tokens={args.max_new_tokens} greedy, threads={args.threads}")
    print("| method | mean tau | tokens | tokens/s (CPU) | output == AR |")
    print("|---|---|---|---|---|")
    row, reference = run(decoder, prompts, "ar", params, [])
    print(row)
    print(run(decoder, prompts, "dflash", params, reference, draft_tokens=args.draft_tokens)[0])
    for budget in (int(b) for b in args.budgets.split(",")):
        print(run(decoder, prompts, "ddtree", params, reference, draft_tokens=args.draft_tokens, budget=budget)[0])


if __name__ == "__main__":
    main()
