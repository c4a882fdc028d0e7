"""Which servers the suite starts, in which order, and which cases each one serves."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from ddtree_runtime.acceptance.hybrid import write_hybrid_pair
from ddtree_runtime.acceptance.launch import ServerSpec
from ddtree_runtime.acceptance.prompts import (
    DRAFTER_DIR,
    HYBRID_DRAFTER_DIR,
    HYBRID_TARGET_DIR,
    TARGET_DIR,
    suite_prompts,
)
from ddtree_runtime.acceptance.round_cost import (
    RANDOM_PAIR_FLAGS,
    RANDOM_TARGET_FLAGS,
    SHAPE_8B,
    SHAPE_27B,
    SHAPES,
    SYNC_FLAGS,
    RoundCostShape,
    write_shape_pair,
)
from ddtree_runtime.acceptance.suite import Suite, SuiteSettings

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


HYBRID_FLAGS = ("--mamba-full-memory-ratio", "0.5", "--mamba-radix-cache-strategy", "extra_buffer")
"""The mamba settings the production unit renders (``pivot_serving_common_args`` in
inventory/production/group_vars/serving.yml; a controller test holds the two equal)."""


def _hybrid_trio(target: Path, drafter: Path, name: str) -> list[ServerSpec]:
    """Baseline, DDTREE (budget 16) and DFLASH on one hybrid target, named ``<name>-baseline``,
    ``ddtree-<name>-b16`` and ``dflash-<name>``."""
    return [
        ServerSpec(f"{name}-baseline", target, extra_flags=HYBRID_FLAGS),
        ServerSpec(f"ddtree-{name}-b16", target, algorithm="DDTREE", draft_model_path=drafter,
                   draft_tokens=DRAFT_TOKENS, budget=16, extra_flags=HYBRID_FLAGS),
        ServerSpec(f"dflash-{name}", target, algorithm="DFLASH", draft_model_path=drafter, draft_tokens=DRAFT_TOKENS,
                   extra_flags=HYBRID_FLAGS),
    ]


def hybrid_specs(models: Path) -> list[ServerSpec]:
    """Case 7: baseline, DDTREE (budget 16) and DFLASH on the random Qwen3.5/3.6-style target."""
    return _hybrid_trio(models / "hybrid-target", models / "hybrid-dflash", "hybrid")


def trained_hybrid_specs() -> list[ServerSpec]:
    """Case 7 again on the shipped trained hybrid pair (``pivot-coder-tiny-hybrid`` and its drafter): its
    distributions are peaked, so greedy agreement with the baseline says more than on the random target, where
    every position is a bf16 near-tie, and its accept length is a trained drafter's."""
    return _hybrid_trio(HYBRID_TARGET_DIR, HYBRID_DRAFTER_DIR, "hybrid-trained")


def _run_hybrid(suite: Suite, specs: Sequence[ServerSpec], label: str) -> None:
    baseline, *speculative = specs
    suite.run_hybrid_baseline(baseline, label)
    for spec in speculative:
        suite.run_hybrid_speculative(spec, label)


def _hybrid(suite: Suite) -> None:
    models = suite.out_dir / "models"
    write_hybrid_pair(models)
    _run_hybrid(suite, hybrid_specs(models), "hybrid")


def _trained_hybrid(suite: Suite) -> None:
    _run_hybrid(suite, trained_hybrid_specs(), "trained hybrid")


ROUND_COST_BUDGETS = {SHAPE_8B.name: (15, 16, 64, 256), SHAPE_27B.name: (15, 64)}
"""DDTREE budgets measured per shape: 15 has DFLASH's verify width (16), 16 the default of production's draft
length, 64 and 256 wider trees. At 27B, 256 is left out: with the production mamba flags SGLang refuses a verify
wider than ``mamba_track_interval`` (256)."""
ROUND_COST_SYNC_BUDGET = 64
"""The DDTREE budget also measured without overlap scheduling (what overlap is worth to a tree round)."""


def round_cost_shape_specs(shape: RoundCostShape, models: Path) -> list[ServerSpec]:
    """Baseline, DFLASH as SGLang runs it by default and without overlap scheduling, DDTREE at every budget of
    :data:`ROUND_COST_BUDGETS` (and one without overlap) on ``shape``'s config-only models under ``models``."""
    target, drafter = shape.dirs(models)
    flags = shape.target_flags
    pair = {"model_path": target, "draft_model_path": drafter, "draft_tokens": DRAFT_TOKENS}

    def ddtree(budget: int, sync: bool = False) -> ServerSpec:
        return ServerSpec(f"ddtree-{shape.name}-b{budget}{'-sync' if sync else ''}", algorithm="DDTREE",
                          budget=budget, extra_flags=(*RANDOM_PAIR_FLAGS, *flags, *(SYNC_FLAGS if sync else ())),
                          **pair)

    return [
        ServerSpec(f"{shape.name}-baseline", target, extra_flags=(*RANDOM_TARGET_FLAGS, *flags)),
        ServerSpec(f"dflash-{shape.name}", algorithm="DFLASH", extra_flags=(*RANDOM_PAIR_FLAGS, *flags), **pair),
        ServerSpec(f"dflash-{shape.name}-sync", algorithm="DFLASH",
                   extra_flags=(*RANDOM_PAIR_FLAGS, *flags, *SYNC_FLAGS), **pair),
        *(ddtree(budget) for budget in ROUND_COST_BUDGETS[shape.name]),
        ddtree(ROUND_COST_SYNC_BUDGET, sync=True),
    ]


def round_cost_specs(models: Path) -> list[ServerSpec]:
    """Every round-cost server, shape by shape (:data:`ddtree_runtime.acceptance.round_cost.SHAPES`)."""
    return [spec for shape in SHAPES for spec in round_cost_shape_specs(shape, models)]


def _round_cost_step(shape: RoundCostShape, index: int, name: str) -> Step:
    def run(suite: Suite) -> None:
        models = suite.out_dir / "models"
        write_shape_pair(shape, models)
        suite.run_round_cost(round_cost_shape_specs(shape, models)[index], shape)

    return Step(name, run, groups=("round-cost", f"round-cost-{shape.name}"))


PROFILED = ("dflash-8b", "ddtree-8b-b15", "ddtree-8b-b64")
"""Round-cost servers also profiled (SGLang's ``/start_profile``): DFLASH and DDTREE side by side at 8B, batch 1."""


def _round_profile_step(index: int, name: str) -> Step:
    def run(suite: Suite) -> None:
        models = suite.out_dir / "models"
        write_shape_pair(SHAPE_8B, models)
        spec = round_cost_shape_specs(SHAPE_8B, models)[index]
        suite.run_round_profile(replace(spec, name=f"profile-{spec.name}"), SHAPE_8B)

    return Step(f"profile-{name}", run, groups=("round-profile",))


def round_profile_steps() -> list[Step]:
    """One step per profiled server (:data:`PROFILED`), in the group ``round-profile``."""
    specs = round_cost_shape_specs(SHAPE_8B, Path("models"))
    return [_round_profile_step(index, spec.name) for index, spec in enumerate(specs) if spec.name in PROFILED]


def round_cost_steps() -> list[Step]:
    """One step per round-cost server (its models written under the suite's ``--out``), in the groups
    ``round-cost`` and ``round-cost-<shape>``."""
    return [_round_cost_step(shape, index, spec.name) for shape in SHAPES
            for index, spec in enumerate(round_cost_shape_specs(shape, Path("models")))]


DETERMINISTIC_FLAGS = ("--enable-deterministic-inference",)


def deterministic_specs() -> list[ServerSpec]:
    """Case 9: the baseline, DFLASH and DDTREE (budget 64) with SGLang's deterministic inference."""
    return [replace(baseline_spec(), name="deterministic-baseline", extra_flags=DETERMINISTIC_FLAGS),
            replace(dflash_spec(), name="deterministic-dflash", extra_flags=DETERMINISTIC_FLAGS),
            ddtree_spec(64, name="deterministic-ddtree-b64", extra_flags=DETERMINISTIC_FLAGS)]


def deterministic_steps() -> list[Step]:
    return [Step(spec.name, partial(Suite.run_deterministic, spec=spec), groups=("deterministic",))
            for spec in deterministic_specs()]


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


@dataclass(frozen=True)
class Step:
    """One server of a plan (or the refusal starts), by the name ``--only`` selects it with (or a group's)."""

    name: str
    run: Callable[[Suite], None]
    groups: tuple[str, ...] = ()


def _speculative(spec: ServerSpec, *, load: bool = False, sampling: bool = False, requests: bool = False) -> Step:
    return Step(spec.name, lambda suite: suite.run_speculative(spec, load=load, sampling=sampling, requests=requests))


def _refusals(suite: Suite) -> None:
    for spec, message in refusal_specs():
        suite.run_refusal(spec, message)


def speculative_specs(cuda_graphs: bool) -> list[ServerSpec]:
    return [*(ddtree_spec(b, cuda_graphs=cuda_graphs) for b in DDTREE_BUDGETS), dflash_spec(cuda_graphs)]


def serving_specs(models: Path | None = None) -> list[ServerSpec]:
    """Every server of the full plan that must start and serve (the refusals are :func:`refusal_specs`); the
    hybrid and round-cost ones when given the directory their models are written to."""
    specs = [baseline_spec(), *speculative_specs(True), *speculative_specs(False), *trained_hybrid_specs(),
             *deterministic_specs()]
    return specs + ([*hybrid_specs(models), *round_cost_specs(models)] if models is not None else [])


def full_plan() -> list[Step]:
    """Every case: graphs on (load, sampling and requests on the largest budget; throughput), graphs off, the
    random and the trained hybrid target, refusals, then the round cost at real size."""
    largest = ddtree_spec(max(DDTREE_BUDGETS)).name
    steps = [Step("baseline", lambda suite: suite.run_baseline(baseline_spec()))]
    steps += [_speculative(spec, load=True, sampling=spec.name == largest, requests=spec.name == largest)
              for spec in speculative_specs(True)]
    steps += [_speculative(spec) for spec in speculative_specs(False)]
    steps.append(Step("hybrid", _hybrid))
    steps.append(Step("hybrid-trained", _trained_hybrid))
    steps.append(Step("refusals", _refusals))
    steps += deterministic_steps()
    steps += round_cost_steps()
    steps += round_profile_steps()
    return steps


def quick_plan() -> list[Step]:
    """Baseline, DDTREE at budget 64 and DFLASH, CUDA graphs on, with their throughput (a first look on a new
    machine)."""
    return [Step("baseline", lambda suite: suite.run_baseline(baseline_spec())),
            _speculative(ddtree_spec(64), load=True, requests=True), _speculative(dflash_spec())]


PLANS: dict[str, Callable[[], list[Step]]] = {"full": full_plan, "quick": quick_plan}


def select_steps(plan: str, only: Sequence[str]) -> list[Step]:
    """The plan's steps, or those ``only`` names (a step's name or one of its groups), in plan order."""
    steps = PLANS[plan]()
    if not only:
        return steps
    known = {step.name for step in steps} | {group for step in steps for group in step.groups}
    unknown = sorted(set(only) - known)
    if unknown:
        names = ", ".join(dict.fromkeys([*(step.name for step in steps),
                                         *(group for step in steps for group in step.groups)]))
        raise ValueError(f"--only {', '.join(unknown)}: not a step of plan {plan!r} ({names})")
    wanted = set(only)
    return [step for step in steps if step.name in wanted or wanted & set(step.groups)]


def run_steps(suite: Suite, steps: Sequence[Step], after_step: Callable[[Suite], None],
              stop_after: float | None = None) -> list[str]:
    """Run the ``steps`` not done yet, in order; ``after_step`` (saving state and results) runs after each, so a run
    cut short keeps what it finished. No step starts once ``stop_after`` seconds have passed. Returns the names of
    the steps left to run."""
    started = time.monotonic()
    pending = [step for step in steps if step.name not in suite.steps_done]
    while pending:
        if stop_after is not None and time.monotonic() - started > stop_after:
            break
        step = pending.pop(0)
        step.run(suite)
        suite.steps_done.append(step.name)
        after_step(suite)
    return [step.name for step in pending]


def make_suite(out_dir: Path, settings: SuiteSettings, resume: bool) -> Suite:
    suite = Suite(out_dir, suite_prompts(), settings)
    if resume:
        suite.resume()
    return suite
