"""Command line: the pair, a random drafter for comparison, held-out prompts, checksums, tokenizer files.

    python -m ddtree_runtime.train pair --out DIR [--shape tiny|tiny-hybrid] [--device cuda] [--target-seconds 150] ...
    python -m ddtree_runtime.train random-drafter --like DRAFTER_DIR --out DIR [--seed 7]
    python -m ddtree_runtime.train held-out-prompts --out FILE [--count 12]
    python -m ddtree_runtime.train checksums DIR [--write]
    python -m ddtree_runtime.train tokenizer-files DIR...
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from ddtree_runtime.reference import DFlashConfig, random_dflash, save_dflash
from ddtree_runtime.train.corpus import list_sources, split_sources, stdlib_root
from ddtree_runtime.train.loop import DraftSettings
from ddtree_runtime.train.pair import (
    CHECKSUM_FILE,
    SHAPES,
    verify_checksums,
    write_checksums,
    write_tokenizer_files,
)
from ddtree_runtime.train.pipeline import PairRecipe, make_pair
from ddtree_runtime.train.prompts import held_out_prompts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddtree_runtime.train", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    pair = sub.add_parser("pair", help="train the target and the drafter, write both checkpoints")
    pair.add_argument("--out", type=Path, required=True)
    pair.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    pair.add_argument("--shape", choices=sorted(SHAPES), default="tiny",
                      help="architecture and size: tiny / smoke (Qwen3), tiny-hybrid / smoke-hybrid (Qwen3.5/3.6)")
    pair.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    pair.add_argument("--seed", type=int, default=0)
    pair.add_argument("--stdlib", type=Path, help="corpus root (default: this Python's standard library)")
    pair.add_argument("--max-files", type=int, help="use only the first N source files (smoke runs)")
    pair.add_argument("--seq-len", type=int, default=512)
    pair.add_argument("--target-seconds", type=float, default=150)
    pair.add_argument("--target-steps", type=int, default=100_000)
    pair.add_argument("--target-batch", type=int, default=128)
    pair.add_argument("--target-lr", type=float, default=3e-3)
    pair.add_argument("--drafter-seconds", type=float, default=120)
    pair.add_argument("--drafter-steps", type=int, default=100_000)
    pair.add_argument("--drafter-batch", type=int, default=64)
    pair.add_argument("--drafter-lr", type=float, default=2e-3)
    pair.add_argument("--warmup-steps", type=int, default=100)
    pair.add_argument("--distill-seconds", type=float, default=20)
    pair.add_argument("--distill-batch", type=int, default=512)
    pair.add_argument("--distill-batches", type=int, default=64)
    pair.add_argument("--prompt-tokens", type=int, default=128)
    pair.add_argument("--new-tokens", type=int, default=256)
    pair.add_argument("--anchors", type=int, default=32)
    pair.add_argument("--log-every", type=int, default=50)
    pair.add_argument("--target-from", type=Path,
                      help="a target `train pair` wrote before: use it as it is and train only the drafter")
    rand = sub.add_parser("random-drafter", help="a random-weight drafter with another drafter's config")
    rand.add_argument("--like", type=Path, required=True)
    rand.add_argument("--out", type=Path, required=True)
    rand.add_argument("--seed", type=int, default=7)
    held = sub.add_parser("held-out-prompts", help="JSONL prompts from held-out standard-library functions")
    held.add_argument("--out", type=Path, required=True)
    held.add_argument("--count", type=int, default=12)
    held.add_argument("--stdlib", type=Path)
    sums = sub.add_parser("checksums", help="verify (or --write) SHA256SUMS of model directories")
    sums.add_argument("dirs", type=Path, nargs="+")
    sums.add_argument("--write", action="store_true")
    tok = sub.add_parser("tokenizer-files", help="(re)write the tokenizer note and a target's Hugging Face tokenizer "
                                                 "files in model directories, then their SHA256SUMS")
    tok.add_argument("dirs", type=Path, nargs="+")
    return p


def recipe_from(args: argparse.Namespace) -> PairRecipe:
    base = PairRecipe()
    return PairRecipe(
        shape=args.shape,
        seed=args.seed,
        seq_len=args.seq_len,
        target=replace(
            base.target,
            seconds=args.target_seconds,
            max_steps=args.target_steps,
            batch=args.target_batch,
            lr=args.target_lr,
            warmup_steps=args.warmup_steps,
            log_every=args.log_every,
        ),
        drafter=replace(
            base.drafter,
            seconds=args.drafter_seconds,
            max_steps=args.drafter_steps,
            batch=args.drafter_batch,
            lr=args.drafter_lr,
            warmup_steps=args.warmup_steps,
            log_every=args.log_every,
        ),
        draft=DraftSettings(
            prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens,
            distill_batch=args.distill_batch,
            distill_seconds=args.distill_seconds,
            distill_max_batches=args.distill_batches,
            anchors_per_sequence=args.anchors,
        ),
        max_files=args.max_files,
    )


def write_random_drafter(like: Path, out: Path, seed: int) -> None:
    config = DFlashConfig.from_dict(json.loads((like / "config.json").read_text()))
    save_dflash(random_dflash(config, seed, std=0.02), out)
    marker = {"kind": "dflash_drafter", "random_weights": True, "seed": seed, "config_from": str(like)}
    (out / "pivot_model.json").write_text(json.dumps(marker, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "pair":
        if args.threads:
            torch.set_num_threads(args.threads)
        make_pair(recipe_from(args), args.out, args.device, args.stdlib, target_from=args.target_from)
    elif args.command == "random-drafter":
        write_random_drafter(args.like, args.out, args.seed)
    elif args.command == "tokenizer-files":
        for directory in args.dirs:
            written = write_tokenizer_files(directory)
            write_checksums(directory)
            print(f"{directory}: {', '.join(path.name for path in written)}, {CHECKSUM_FILE}")
    elif args.command == "held-out-prompts":
        _unused, held_out = split_sources(list_sources(args.stdlib or stdlib_root()))
        records = held_out_prompts(held_out, args.count)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        failed = False
        for directory in args.dirs:
            if args.write:
                write_checksums(directory)
                continue
            bad = verify_checksums(directory)
            print(f"{directory}: {'OK' if not bad else 'MISMATCH ' + ', '.join(bad)}")
            failed |= bool(bad)
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
