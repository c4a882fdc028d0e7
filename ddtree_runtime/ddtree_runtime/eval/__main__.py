"""Command line of the acceptance-length evaluation.

Reference engine (defaults to the shipped pair, the coding suite, AR + DFlash chain + DDTree-4/8/16):

    python -m ddtree_runtime.eval --budgets 4,8,16 --markdown eval.md --json eval.json

A running SGLang (or lab) server, which decodes however it was launched:

    python -m ddtree_runtime.eval --server http://127.0.0.1:30000 --api-key KEY --json served.json

Exit status: 0 on success, 1 when a speculative greedy run's output differs from AR's (reference backend
only), 2 on bad arguments or an unusable backend.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ddtree_runtime.eval.backends import SHIPPED_DRAFTER, SHIPPED_TARGET, EvalError, HttpBackend, ReferenceBackend
from ddtree_runtime.eval.report import markdown, report_dict, write_json
from ddtree_runtime.eval.runner import RunResult, build_specs, evaluate
from ddtree_runtime.eval.tasks import CODING_TASKS, EvalPrompt, check_unique, load_prompts
from ddtree_runtime.sampling import SamplingParams


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddtree_runtime.eval", description=__doc__.splitlines()[0])
    source = p.add_argument_group("backend")
    source.add_argument("--target", type=Path, help=f"target directory (default {SHIPPED_TARGET})")
    source.add_argument("--drafter", type=Path, action="append", help="drafter directory (repeatable)")
    source.add_argument("--server", help="URL of a running SGLang-compatible server instead of local models")
    source.add_argument("--api-key")
    source.add_argument("--device", default="cpu")
    source.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16"))
    source.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    prompts = p.add_argument_group("prompts")
    prompts.add_argument("--no-suite", action="store_true", help="leave out the built-in coding tasks")
    prompts.add_argument("--tasks", help="comma-separated subset of the coding tasks")
    prompts.add_argument("--prompts", type=Path, action="append", default=[], help="prompt file or directory")
    prompts.add_argument("--limit", type=int, help="evaluate only the first N prompts")
    runs = p.add_argument_group("decoding")
    runs.add_argument("--methods", default="ar,dflash,ddtree")
    runs.add_argument("--budgets", type=_int_list, default=[4, 8, 16])
    runs.add_argument("--draft-tokens", type=int, default=16)
    runs.add_argument("--max-topk", type=int)
    runs.add_argument("--max-new-tokens", type=int, default=128)
    runs.add_argument("--temperature", type=float, default=0.0)
    runs.add_argument("--seed", type=int)
    runs.add_argument("--ignore-eos", action="store_true")
    runs.add_argument("--warmup-tokens", type=int, default=8, help="untimed generation before each run")
    out = p.add_argument_group("output")
    out.add_argument("--json", type=Path)
    out.add_argument("--markdown", type=Path)
    out.add_argument("--quiet", action="store_true")
    return p


def select_prompts(args: argparse.Namespace) -> list[EvalPrompt]:
    chosen: list[EvalPrompt] = []
    if not args.no_suite:
        chosen = list(CODING_TASKS)
        if args.tasks:
            wanted = [t.strip() for t in args.tasks.split(",") if t.strip()]
            known = {t.name: t for t in CODING_TASKS}
            missing = [w for w in wanted if w not in known]
            if missing:
                raise ValueError(f"unknown tasks {missing}; known: {sorted(known)}")
            chosen = [known[w] for w in wanted]
    chosen += load_prompts(args.prompts)
    check_unique(chosen)
    if args.limit is not None:
        chosen = chosen[: args.limit]
    if not chosen:
        raise ValueError("no prompts: drop --no-suite or pass --prompts")
    return chosen


def run(args: argparse.Namespace) -> tuple[list[RunResult], dict, dict]:
    prompts = select_prompts(args)
    if args.server:
        backend = HttpBackend(args.server, args.api_key, ignore_eos=args.ignore_eos)
        specs = [backend.served_spec()]
        stop: frozenset[int] = frozenset()
    else:
        torch.set_num_threads(args.threads)
        drafter_dirs = args.drafter if args.drafter is not None else ([] if args.target else [SHIPPED_DRAFTER])
        named = {d.name: d for d in drafter_dirs}
        if len(named) != len(drafter_dirs):
            raise ValueError("drafter directories must have distinct names")
        backend = ReferenceBackend(args.target or SHIPPED_TARGET, named, args.device, args.dtype)
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        specs = build_specs(methods, list(named), args.budgets, args.draft_tokens, args.max_topk)
        stop = frozenset() if args.ignore_eos else backend.eos
    params = SamplingParams(
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, stop_token_ids=stop, seed=args.seed
    )
    settings = {
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "ignore_eos": args.ignore_eos,
        "draft_tokens": None if args.server else args.draft_tokens,
        "max_topk": args.max_topk,
    }
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    results = evaluate(backend, prompts, specs, params, warmup_tokens=args.warmup_tokens, progress=progress)
    return results, settings, backend.description


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        results, settings, backend = run(args)
    except (ValueError, FileNotFoundError, EvalError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = markdown(results, settings, backend)
    if args.json:
        write_json(args.json, report_dict(results, settings, backend))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    print(text)
    return 1 if any(r.matches_ar is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
