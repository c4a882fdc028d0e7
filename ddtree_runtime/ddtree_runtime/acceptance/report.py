"""``results.json`` and ``results.md``: versions, GPU, flags, servers, one line per case, and the measured figures
(throughput on the trained pair, round cost at real size) with their ratios."""

from __future__ import annotations

import json
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

from ddtree_runtime.acceptance import round_cost, round_trace
from ddtree_runtime.acceptance.launch import COMMON_FLAGS, MULTICAST_OFF, STRICT_MEMORY_CHECK, TREE_DIGEST
from ddtree_runtime.acceptance.round_cost import round_cost_rows
from ddtree_runtime.acceptance.suite import CaseResult
from ddtree_runtime.acceptance.throughput import BATCH_1_REQUESTS, BATCH_16_REQUESTS, throughput_rows


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _figure(value: Any) -> str:
    """A measured figure: '-' when missing, thousands without decimals, smaller figures to 4 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return _cell(value)


def throughput_markdown(rows: list[dict[str, Any]], max_new_tokens: Any) -> list[str]:
    if not rows:
        return []
    lines = ["", "## Throughput on the trained pair (figures, not pass/fail)", "",
             f"Greedy, up to {max_new_tokens} new tokens, CUDA graphs on. Batch 1: the first {BATCH_1_REQUESTS} "
             f"prompts one request at a time (summed tokens / summed wall time); batch {BATCH_16_REQUESTS}: "
             f"{BATCH_16_REQUESTS} prompts in one /generate call.", "",
             "| server | algorithm | batch | tokens | seconds | tokens/s | x baseline | DDTREE / DFLASH |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['algorithm']} | {r['batch']} | {_figure(r['tokens'])} | "
                     f"{_figure(r['seconds'])} | {_figure(r['tokens_per_s'])} | {_figure(r['vs_baseline'])} | "
                     f"{_figure(r['ddtree_vs_dflash'])} |")
    return lines


def round_cost_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["", "## Round cost at real size (figures, not pass/fail)", "",
             f"Random weights (`{' '.join(round_cost.RANDOM_PAIR_FLAGS)}`), config-only models: "
             + "; ".join(f"`{shape.name}`: {shape.title}, batch {', '.join(map(str, shape.batches))}"
                         for shape in round_cost.SHAPES)
             + f". Greedy, ignore_eos, {round_cost.PROMPT_TOKENS}-token prompts at {round_cost.SHORT_NEW_TOKENS} "
             f"and {round_cost.LONG_NEW_TOKENS} new tokens (batch n: n prompts in one call); ms per round = "
             "difference in seconds / difference in decode rounds per request (spec_verify_ct; the baseline: "
             "tokens), tokens/s over the same difference. x DFLASH: against SGLang's DFLASH as it runs by default "
             "(overlap scheduling on), same shape and batch; `sync`: `--disable-overlap-schedule`.", "",
             "| server | shape | algorithm | budget | overlap | batch | ms per round | tokens per round | tokens/s "
             "| x DFLASH ms per round |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['shape']} | {r['algorithm']} | {_figure(r['budget'])} | "
                     f"{'on' if r['overlap'] else 'off'} | {r['batch']} | {_figure(r['ms_per_round'])} | "
                     f"{_figure(r['tokens_per_round'])} | {_figure(r['tokens_per_s'])} | "
                     f"{_figure(r['vs_dflash_ms_per_round'])} |")
    return lines


def round_profile_markdown(profiles: dict[str, dict[str, Any]]) -> list[str]:
    if not profiles:
        return []
    stages = ["draft", "topk", "tree", "verify", "accept", "commit", "other"]
    lines = ["", "## Where a round's time goes (figures, not pass/fail)", "",
             f"A torch-profiler trace (SGLang's `/start_profile`, CPU and GPU) of {round_trace.PROFILE_ROUNDS} decode "
             "rounds of one greedy request on the round-cost servers; GPU ms per round by the stage that launched "
             "the work (the DDTree worker's `ddtree.<stage>` ranges; `other`: the scheduler, or a stock worker "
             "without ranges), in CUDA graphs, and idle (the window between the first and the last GPU event "
             "less the union of GPU events). Host waits: the calls per round with which a thread waited for the GPU "
             "(a synchronize or a blocking copy), in the worker's stages and elsewhere (`other`).", "",
             "| server | window ms | busy ms | idle ms | idle share | in graphs ms | "
             + " | ".join(stages) + " | host waits, stages | host waits, other |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * (len(stages) + 2)]
    for name, p in profiles.items():
        by_stage = p.get("gpu_ms_per_round_by_stage", {})
        waits = p.get("host_waits_per_round_by_stage", {})
        in_stages = sum(count for stage, count in waits.items() if stage != "other")
        lines.append(f"| {name} | {_figure(p.get('window_ms_per_round'))} | {_figure(p.get('gpu_busy_ms_per_round'))} "
                     f"| {_figure(p.get('gpu_idle_ms_per_round'))} | {_figure(p.get('gpu_idle_share'))} | "
                     f"{_figure(p.get('gpu_ms_per_round_in_cuda_graphs'))} | "
                     + " | ".join(_figure(by_stage.get(stage)) for stage in stages)
                     + f" | {_figure(in_stages)} | {_figure(waits.get('other', 0))} |")
    return lines


def render_markdown(payload: dict[str, Any]) -> str:
    env = payload["environment"]
    lines = ["# DDTree GPU acceptance: stock SGLang with the ddtree_runtime plugin", ""]
    lines.append(f"- When: {payload['when']}")
    for key in ("gpu", "nvidia_smi", "sglang", "sglang-kernel", "torch", "torch_cuda", "flashinfer-python", "triton",
                "transformers", "tokenizers", "xgrammar", "ddtree_runtime", "ddtree_kernels", "python", "tp_size"):
        if key in env:
            lines.append(f"- {key}: {env[key]}")
    if env.get("left_out"):
        lines.append("- left out on this machine: " + "; ".join(env["left_out"]))
    lines.append(f"- flags of every server: `{' '.join(payload['common_flags'])}`; environment: "
                 f"`SGLANG_PLUGINS=ddtree` + {', '.join(f'`{k}={v}`' for k, v in payload['environment_vars'].items())}")
    if payload.get("skipped"):
        lines += ["", f"**Skipped:** {payload['skipped']}", ""]
        return "\n".join(lines)
    results = payload["results"]
    passed = sum(1 for r in results if r["ok"])
    lines += ["", f"**{passed} passed, {len(results) - passed} failed**", "",
              "| case | server | result | figures | detail |", "|---|---|---|---|---|"]
    for r in results:
        figures = ", ".join(f"{k}={_cell(v)}" for k, v in r["figures"].items() if k != "first_divergence")
        if r["figures"].get("first_divergence"):
            figures += ", first_divergence=" + _cell(r["figures"]["first_divergence"])
        lines.append(f"| {r['case']} | {r['server']} | {'pass' if r['ok'] else '**FAIL**'} | {figures} | "
                     f"{_cell(r['detail'])} |")
    lines += throughput_markdown(payload["throughput"]["table"], payload["throughput"]["max_new_tokens"])
    lines += round_cost_markdown(payload["round_cost"]["table"])
    lines += round_profile_markdown(payload.get("round_profile", {}))
    lines += ["", "## Servers", "", "| server | ready (s) | exit | command |", "|---|---|---|---|"]
    for s in payload["servers"]:
        lines.append(f"| {s['name']} | {s.get('ready_seconds', '-')} | {s.get('exit_code')} | "
                     f"`{' '.join(s['command'][1:])}` {_cell(s.get('extra_env') or '')} |")
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, environment: dict[str, Any], results: list[CaseResult],
                 servers: list[dict[str, Any]], skipped: str | None, *, figures: dict[str, dict[str, Any]],
                 max_new_tokens: int) -> dict[str, Any]:
    """``figures``: the suite's measured figures by kind (:meth:`Suite.figures`); the ratios are added here."""
    throughput, costs = figures.get("throughput", {}), figures.get("round_cost", {})
    payload = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment,
        "common_flags": list(COMMON_FLAGS),
        "environment_vars": {**STRICT_MEMORY_CHECK, **MULTICAST_OFF,
                             **(TREE_DIGEST if environment.get("tp_size", 1) > 1 else {})},
        "skipped": skipped,
        "results": [r.as_dict() for r in results],
        "throughput": {"max_new_tokens": max_new_tokens, "servers": throughput, "table": throughput_rows(throughput)},
        "round_cost": {"servers": costs, "table": round_cost_rows(costs)},
        "round_profile": figures.get("round_profile", {}),
        "servers": servers,
    }
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out_dir / "results.md").write_text(render_markdown(payload))
    return payload


def mirror_results(out_dir: Path, mirror: Path) -> None:
    """Copy the results and a tarball of everything in ``out_dir`` (logs, state) to ``mirror`` (for machines that
    hand back only a few files)."""
    mirror.mkdir(parents=True, exist_ok=True)
    for name in ("results.json", "results.md"):
        shutil.copyfile(out_dir / name, mirror / name)
    partial = mirror / "logs.tgz.partial"
    with tarfile.open(partial, "w:gz") as archive:
        for path in sorted(out_dir.iterdir()):
            if path.suffix in (".log", ".json", ".md"):
                archive.add(path, arcname=path.name)
    partial.replace(mirror / "logs.tgz")
