"""``python -m ddtree_runtime.acceptance``: the GPU acceptance suite (see :mod:`ddtree_runtime.acceptance`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddtree_runtime.acceptance.environment import describe_environment, skip_reason
from ddtree_runtime.acceptance.launch import DEFAULT_DTYPE
from ddtree_runtime.acceptance.plan import PLANS, make_suite, run_steps, select_steps
from ddtree_runtime.acceptance.report import mirror_results, write_report
from ddtree_runtime.acceptance.suite import Suite, SuiteSettings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddtree_runtime.acceptance", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("acceptance-results"),
                        help="directory for results.json, results.md and the servers' logs")
    parser.add_argument("--plan", choices=sorted(PLANS), default="full",
                        help="which servers and cases to run (default: full)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs sglang.launch_server (default: this one)")
    parser.add_argument("--only", type=lambda text: [n for n in text.split(",") if n], default=[],
                        help="comma-separated steps of the plan to run (servers by name, or 'hybrid', "
                             "'refusals', 'round-cost', 'round-cost-8b', 'round-cost-27b')")
    parser.add_argument("--resume", action="store_true",
                        help="go on from the state an earlier run left in --out: its baseline and case lines are "
                             "kept and its finished steps skipped")
    parser.add_argument("--mirror", type=Path,
                        help="after each step also copy results.json, results.md and a logs.tgz of --out here")
    parser.add_argument("--stop-after", type=float,
                        help="start no further step after this many seconds (exit 3; go on with --resume)")
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, help=f"--dtype of every server (default {DEFAULT_DTYPE})")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--tp-size", type=int, default=1,
                        help="--tp-size of every server; above 1 each round's tree digest is compared across ranks "
                             "(DDTREE_DEBUG_TREE_DIGEST) and NCCL's NVLink multicast is off")
    parser.add_argument("--health-timeout", type=float, default=600.0,
                        help="seconds a server may take to answer /health_generate (first starts compile kernels)")
    parser.add_argument("--left-out", action="append", default=[],
                        help="a package SGLang imports that this machine lacks, and why (recorded in the results)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    environment = {**describe_environment(args.python, args.left_out), "tp_size": args.tp_size}
    reason = skip_reason(environment, args.tp_size)
    if reason is not None:
        write_report(args.out, environment, results=[], servers=[], skipped=reason, figures={},
                     max_new_tokens=args.max_new_tokens)
        print(f"acceptance: skipped: {reason}")
        return 0
    steps = select_steps(args.plan, args.only)
    settings = SuiteSettings(args.python, args.max_new_tokens, args.health_timeout, args.dtype, args.tp_size)
    suite = make_suite(args.out, settings, args.resume)
    # Steps named with --only run again even when an earlier run finished them.
    suite.steps_done = [name for name in suite.steps_done if name not in args.only]

    def after_step(done: Suite) -> None:
        done.save()
        write_report(args.out, environment, results=done.all_results(), servers=done.servers, skipped=None,
                     figures=done.figures(), max_new_tokens=done.max_new_tokens)
        if args.mirror is not None:
            mirror_results(args.out, args.mirror)

    left = run_steps(suite, steps, after_step, args.stop_after)
    results = suite.all_results()
    failed = [r for r in results if not r.ok]
    print(f"acceptance: {len(results) - len(failed)} passed, {len(failed)} failed "
          f"(results in {args.out / 'results.md'})")
    if left:
        print(f"acceptance: stopped after {args.stop_after:g} s; not run yet: {', '.join(left)} (go on with --resume)")
        return 3
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
