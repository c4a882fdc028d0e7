"""Two runs of the acceptance suite side by side, typically ``--tp-size 1`` against ``--tp-size 2`` on one machine.

    python -m ddtree_runtime.acceptance.compare TP1_OUT TP2_OUT [--out comparison.md]

Each run already holds its own speculative servers to its own baseline token for token. What only a comparison shows
is whether the two baselines agree with each other: tensor parallelism splits each matrix product across GPUs and
sums the parts in another order, so a bf16 logit can round differently and greedy decoding may take the other token
where the first run's top-2 gap is a near-tie. Every divergence is judged by that gap (from the first run's logprob
pass): below :data:`~ddtree_runtime.acceptance.suite.TIE_MARGIN` it is explained by reduction order; a wide or
unknown gap is not, and makes the exit status 1. Accept lengths and throughput are listed server by server.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_runtime.acceptance.prompts import suite_prompts
from ddtree_runtime.acceptance.stats import agreement, margins_at_divergence
from ddtree_runtime.acceptance.suite import STATE_FILE, TIE_MARGIN
from ddtree_runtime.acceptance.throughput import throughput_rows


@dataclass(frozen=True)
class BaselineComparison:
    """One baseline (dense or hybrid) of both runs, prompt by prompt."""

    name: str
    prompts: int
    equal: int
    margins: dict[str, float | None]
    """Prompt -> the first run's top-2 gap where the second run's output leaves it (None: not measured there)."""

    @property
    def unexplained(self) -> list[str]:
        return sorted(prompt for prompt, gap in self.margins.items() if gap is None or gap >= TIE_MARGIN)


def load_state(out_dir: Path) -> dict[str, Any]:
    path = out_dir / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give the --out directory of a finished acceptance run")
    return json.loads(path.read_text())


def _baseline_outputs(state: Mapping[str, Any]) -> dict[str, list[list[int]]]:
    """Baseline name -> its greedy outputs, for the baselines the run has."""
    found = {}
    if state.get("baseline"):
        found["baseline"] = state["baseline"]["outputs"]
    if state.get("hybrid_baseline"):
        found[state.get("hybrid_baseline_name", "hybrid-baseline")] = state["hybrid_baseline"]["outputs"]
    return found


def compare_baselines(first: Mapping[str, Any], second: Mapping[str, Any],
                      prompt_names: Sequence[str]) -> list[BaselineComparison]:
    """Each baseline both runs have, the second's greedy outputs against the first's."""
    ours, theirs = _baseline_outputs(first), _baseline_outputs(second)
    compared = []
    for name in sorted(ours.keys() & theirs.keys()):
        found = agreement(prompt_names, theirs[name], ours[name])
        references = dict(zip(prompt_names, ours[name], strict=True))
        gaps = margins_at_divergence(found.first_divergence, references, first.get("margin_paths", {}).get(name, {}),
                                     first.get("margins", {}).get(name, {}))
        compared.append(BaselineComparison(name, found.prompts, found.equal, gaps))
    return compared


def _figure_rows(first: Mapping[str, Any], second: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(server, figure, first run, second run) for every accept length and throughput figure either run has."""
    rows = []
    for server in sorted(first.get("accept_lengths", {}).keys() | second.get("accept_lengths", {}).keys()):
        values = [state.get("accept_lengths", {}).get(server) for state in (first, second)]
        rows.append((server, "accept length", *(f"{v:.2f}" if v is not None else "-" for v in values)))
    tokens_per_s = [{(row["server"], row["batch"]): row["tokens_per_s"] for row in throughput_rows(
        state.get("throughput", {}))} for state in (first, second)]
    for server, batch in sorted(tokens_per_s[0].keys() | tokens_per_s[1].keys()):
        values = [figures.get((server, batch)) for figures in tokens_per_s]
        rows.append((server, f"tokens/s at batch {batch}", *("-" if v is None else f"{v:.1f}" for v in values)))
    return rows


def render(first_dir: Path, second_dir: Path, first: Mapping[str, Any], second: Mapping[str, Any],
           baselines: Sequence[BaselineComparison]) -> str:
    label = [f"{d} (--tp-size {s.get('tp_size', 1)})" for d, s in ((first_dir, first), (second_dir, second))]
    lines = [f"# Acceptance runs compared: {label[0]} against {label[1]}", "",
             "| baseline | prompts | token for token equal | divergences at a near-tie (top-2 gap < "
             f"{TIE_MARGIN}) | not explained |", "|---|---:|---:|---:|---|"]
    for b in baselines:
        ties = len(b.margins) - len(b.unexplained)
        lines.append(f"| {b.name} | {b.prompts} | {b.equal} | {ties} | {', '.join(b.unexplained) or '-'} |")
    if not baselines:
        lines.append("| (no baseline in both runs) | | | | |")
    lines += ["", "| server | figure | first | second |", "|---|---|---:|---:|"]
    lines += [f"| {server} | {figure} | {a} | {b} |" for server, figure, a, b in _figure_rows(first, second)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree_runtime.acceptance.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path, help="--out directory of the first run (the reference, e.g. TP=1)")
    parser.add_argument("second", type=Path, help="--out directory of the second run (e.g. TP=2)")
    parser.add_argument("--out", type=Path, help="also write the comparison (Markdown) to this file")
    args = parser.parse_args(argv)
    first, second = load_state(args.first), load_state(args.second)
    settings = [(state["dtype"], state["max_new_tokens"]) for state in (first, second)]
    if settings[0] != settings[1]:
        parser.error(f"the runs used other settings (dtype, new tokens): {settings[0]} and {settings[1]}")
    names = [prompt.name for prompt in suite_prompts()]
    baselines = compare_baselines(first, second, names)
    text = render(args.first, args.second, first, second, baselines)
    if args.out is not None:
        args.out.write_text(text)
    print(text, end="")
    unexplained = [f"{b.name}: {', '.join(b.unexplained)}" for b in baselines if b.unexplained]
    if unexplained:
        print(f"compare: divergences not at a near-tie (or not measured there): {'; '.join(unexplained)}")
        return 1
    if not baselines:
        print("compare: the runs have no baseline in common")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
