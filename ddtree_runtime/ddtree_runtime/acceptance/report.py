"""``results.json`` and ``results.md``: versions, GPU, flags, servers and one line per case."""

from __future__ import annotations

import json
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

from ddtree_runtime.acceptance.launch import COMMON_FLAGS, STRICT_MEMORY_CHECK
from ddtree_runtime.acceptance.suite import CaseResult


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(payload: dict[str, Any]) -> str:
    env = payload["environment"]
    lines = ["# DDTree GPU acceptance: stock SGLang with the ddtree_runtime plugin", ""]
    lines.append(f"- When: {payload['when']}")
    for key in ("gpu", "nvidia_smi", "sglang", "sglang-kernel", "torch", "torch_cuda", "flashinfer-python", "triton",
                "transformers", "ddtree_runtime", "ddtree_kernels", "python"):
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
    lines += ["", "## Servers", "", "| server | ready (s) | exit | command |", "|---|---|---|---|"]
    for s in payload["servers"]:
        lines.append(f"| {s['name']} | {s.get('ready_seconds', '-')} | {s.get('exit_code')} | "
                     f"`{' '.join(s['command'][1:])}` {_cell(s.get('extra_env') or '')} |")
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, environment: dict[str, Any], results: list[CaseResult],
                 servers: list[dict[str, Any]], skipped: str | None) -> dict[str, Any]:
    payload = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment,
        "common_flags": list(COMMON_FLAGS),
        "environment_vars": dict(STRICT_MEMORY_CHECK),
        "skipped": skipped,
        "results": [r.as_dict() for r in results],
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
