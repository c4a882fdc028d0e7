"""JSON and Markdown renderings of an evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddtree_runtime.eval.runner import RunResult


def report_dict(results: list[RunResult], settings: dict[str, Any], backend: dict[str, Any]) -> dict[str, Any]:
    return {"backend": backend, "settings": settings, "runs": [r.as_dict() for r in results]}


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def headline_table(results: list[RunResult]) -> str:
    """Rows: drafters; columns: DFlash chain and each DDTree configuration; cells: mean tau."""
    speculative = [r for r in results if r.spec.method != "ar"]
    columns: list[str] = []
    for run in speculative:
        label = "vanilla (DFlash chain)" if run.spec.method == "dflash" else run.spec.label
        if label not in columns:
            columns.append(label)
    rows: dict[str, dict[str, float]] = {}
    for run in speculative:
        label = "vanilla (DFlash chain)" if run.spec.method == "dflash" else run.spec.label
        rows.setdefault(run.spec.drafter or "-", {})[label] = run.mean_tau
    lines = ["| drafter | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for drafter, cells in rows.items():
        values = [f"{cells[c]:.2f}" if c in cells else "-" for c in columns]
        lines.append(f"| {drafter} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def runs_table(results: list[RunResult]) -> str:
    lines = [
        "| method | drafter | mean tau | rounds | tokens | seconds | tokens/s | output == AR |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for run in results:
        lines.append(
            f"| {run.spec.label} | {run.spec.drafter or '-'} | {run.mean_tau:.2f} | {run.rounds} | {run.tokens} "
            f"| {run.seconds:.2f} | {run.tokens_per_s:.1f} | {_yes_no(run.matches_ar)} |"
        )
    return "\n".join(lines)


def per_prompt_table(results: list[RunResult]) -> str:
    """Rows: prompts; columns: runs; cells: that prompt's tau."""
    if not results:
        return ""
    headers = [f"{r.spec.label}" + (f" [{r.spec.drafter}]" if r.spec.drafter else "") for r in results]
    lines = ["| prompt | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
    for index, prompt in enumerate(results[0].prompts):
        cells = [f"{r.prompts[index].tau:.2f}" for r in results]
        lines.append(f"| {prompt.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(results: list[RunResult], settings: dict[str, Any], backend: dict[str, Any]) -> str:
    described = ", ".join(f"{k}={v}" for k, v in backend.items() if v is not None)
    configured = ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None)
    parts = [
        "## Acceptance length (tau, mean accepted tokens per verify round incl. the bonus token)",
        "",
        f"Backend: {described}. Settings: {configured}.",
        "",
        headline_table(results),
        "",
        "### Runs",
        "",
        runs_table(results),
        "",
        "### Per prompt (tau)",
        "",
        per_prompt_table(results),
        "",
    ]
    return "\n".join(parts)
