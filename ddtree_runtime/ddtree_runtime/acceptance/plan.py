"""Which servers the suite starts, in which order, and which cases each one serves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ddtree_runtime.acceptance.launch import ServerSpec
from ddtree_runtime.acceptance.prompts import DRAFTER_DIR, TARGET_DIR, suite_prompts
from ddtree_runtime.acceptance.suite import Suite

DRAFT_TOKENS = 16
DDTREE_BUDGETS = (16, 64)


def baseline_spec(cuda_graphs: bool = True) -> ServerSpec:
    return ServerSpec("baseline" if cuda_graphs else "baseline-nographs", TARGET_DIR, cuda_graphs=cuda_graphs)


def ddtree_spec(budget: int, cuda_graphs: bool = True, **overrides: object) -> ServerSpec:
    suffix = "" if cuda_graphs else "-nographs"
    fields = {"name": f"ddtree-b{budget}{suffix}", "model_path": TARGET_DIR, "algorithm": "DDTREE",
              "draft_model_path": DRAFTER_DIR, "draft_tokens": DRAFT_TOKENS, "budget": budget,
              "cuda_graphs": cuda_graphs}
    fields.update(overrides)
    return ServerSpec(**fields)  # type: ignore[arg-type]


def dflash_spec(cuda_graphs: bool = True) -> ServerSpec:
    return ServerSpec("dflash" if cuda_graphs else "dflash-nographs", TARGET_DIR, algorithm="DFLASH",
                      draft_model_path=DRAFTER_DIR, draft_tokens=DRAFT_TOKENS, cuda_graphs=cuda_graphs)


def refusal_specs() -> list[tuple[ServerSpec, str]]:
    """Starts the plugin must refuse, each with the text its message must carry."""
    return [
        (ddtree_spec(64, name="refuse-bad-budget", extra_env=(("DDTREE_BUDGET", "sixty-four"),)),
         "DDTREE_BUDGET must be a positive integer"),
        (ddtree_spec(64, name="refuse-draft-17", draft_tokens=17), "must be in 2..16 for DDTREE, got 17"),
        (ddtree_spec(64, name="refuse-fa3", extra_flags=("--attention-backend", "fa3")),
         "--attention-backend fa3 cannot verify DDTree trees"),
        (ddtree_spec(64, name="refuse-budget-2048", extra_env=(("DDTREE_BUDGET", "2048"),)),
         "DDTREE_BUDGET must be at most 1024"),
    ]


def plan_full(suite: Suite) -> None:
    suite.run_baseline(baseline_spec())
    for budget in DDTREE_BUDGETS:
        big = budget == max(DDTREE_BUDGETS)
        suite.run_speculative(ddtree_spec(budget), load=True, sampling=big, requests=big)
    suite.run_speculative(dflash_spec(), load=True, sampling=False, requests=False)
    for budget in DDTREE_BUDGETS:
        suite.run_speculative(ddtree_spec(budget, cuda_graphs=False), load=False, sampling=False, requests=False)
    suite.run_speculative(dflash_spec(cuda_graphs=False), load=False, sampling=False, requests=False)
    for spec, message in refusal_specs():
        suite.run_refusal(spec, message)


def plan_quick(suite: Suite) -> None:
    """Baseline, DDTREE at budget 64 and DFLASH, CUDA graphs on (a first look on a new machine)."""
    suite.run_baseline(baseline_spec())
    suite.run_speculative(ddtree_spec(64), load=True, sampling=False, requests=True)
    suite.run_speculative(dflash_spec(), load=False, sampling=False, requests=False)


PLANS: dict[str, Callable[[Suite], None]] = {"full": plan_full, "quick": plan_quick}


def run_plan(name: str, out_dir: Path, python: str, max_new_tokens: int, health_timeout: float) -> Suite:
    suite = Suite(out_dir, python, suite_prompts(), max_new_tokens, health_timeout)
    PLANS[name](suite)
    suite.settle_equality()
    suite.settle_acceptance()
    return suite
