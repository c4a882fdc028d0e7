# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Preflight rules: facts the preflight role read on a host in, named checks out.

Every rule is a small function from the facts (``ansible.builtin`` task results, as registered) to one
``{"name", "ok", "detail"}``; a fact that is missing or malformed makes that check fail with a sentence, never the
phase. The model-shape and draft-length rules are the DDTree plugin's own (:mod:`ddtree_rules`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.pivot.ops.plugins.plugin_utils import ddtree_rules

Facts = Mapping[str, Any]
Check = dict[str, Any]
GIB = 1024**3


def check(name: str, ok: bool, detail: str) -> Check:
    return {"name": name, "ok": bool(ok), "detail": " ".join(str(detail).split())}


def one_line(text: object, limit: int = 300) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def slurped_json(result: Any) -> tuple[Mapping[str, Any] | None, str]:
    """A slurp result's JSON object, or None and why it is not one."""
    if not isinstance(result, Mapping) or "content" not in result:
        msg = result.get("msg", "missing") if isinstance(result, Mapping) else "missing"
        return None, one_line(msg)
    try:
        value = json.loads(base64.b64decode(result["content"]))
    except (ValueError, TypeError) as error:
        return None, f"not JSON: {error}"
    if not isinstance(value, Mapping):
        return None, "not a JSON object"
    return value, ""


def slurped_text(result: Any) -> str:
    if isinstance(result, Mapping) and "content" in result:
        try:
            return base64.b64decode(result["content"]).decode(errors="replace")
        except (ValueError, TypeError):
            return ""
    return ""


def command_ok(result: Any) -> bool:
    return isinstance(result, Mapping) and result.get("rc") == 0


def command_error(result: Any) -> str:
    if not isinstance(result, Mapping):
        return "not run"
    command = result.get("cmd")
    if not result.get("stderr") and isinstance(command, list) and command:
        # the command module's answer when the program itself is missing or not executable
        return f"cannot run {command[0]}: {one_line(result.get('msg'))}"
    lines = str(result.get("stderr") or result.get("msg") or "").strip().splitlines()
    return one_line(lines[-1] if lines else f"exit status {result.get('rc')}")


def as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# --- models -------------------------------------------------------------------------------------------------------


class ModelPair:
    """The target's text settings and the drafter's config, as far as they could be read."""

    def __init__(self, facts: Facts) -> None:
        layout = ddtree_rules.layout_module()
        self.target_path = str(facts.get("target_model", ""))
        self.drafter_path = str(facts.get("drafter_model", ""))
        self.target, self.target_error = slurped_json(facts.get("target_config"))
        self.drafter, self.drafter_error = slurped_json(facts.get("drafter_config"))
        self.text: Mapping[str, Any] = layout.text_settings(self.target) if self.target else {}
        self.nested = self.target is not None and self.text is not self.target
        self.layers = as_int(self.text.get("num_hidden_layers")) or 0
        self.layer_ids = (layout.drafter_target_layer_ids(self.drafter) or []) if self.drafter else []
        dflash = (self.drafter or {}).get("dflash_config")
        dflash = dflash if isinstance(dflash, Mapping) else {}
        self.mask_id = as_int(dflash.get("mask_token_id", (self.drafter or {}).get("mask_token_id")))
        self.block = as_int((self.drafter or {}).get("block_size")) or 0


def target_config(pair: ModelPair, facts: Facts) -> Check:
    if pair.target is None:
        return check("target_config", False, f"cannot read {pair.target_path}/config.json: {pair.target_error}")
    text = pair.text
    arch = (pair.target.get("architectures") or ["?"])[0]
    ok = pair.layers > 0 and "vocab_size" in text and "hidden_size" in text
    return check("target_config", ok,
                 f"{pair.target_path}: {arch}, {pair.layers} layers, hidden {text.get('hidden_size', '?')}, "
                 f"vocab {text.get('vocab_size', '?')}{' (text_config)' if pair.nested else ''}")


def drafter_config(pair: ModelPair, facts: Facts) -> Check:
    if pair.drafter is None:
        return check("drafter_config", False, f"cannot read {pair.drafter_path}/config.json: {pair.drafter_error}")
    vocab = as_int(pair.text.get("vocab_size"))
    mask_ok = pair.mask_id is not None and vocab is not None and 0 <= pair.mask_id < vocab
    window_problem = ddtree_rules.layout_module().drafter_window_problem(pair.drafter)
    ok = pair.block > 0 and bool(pair.layer_ids) and mask_ok and window_problem is None
    mask = pair.mask_id if pair.mask_id is not None else "missing"
    return check("drafter_config", ok,
                 f"{pair.drafter_path}: block_size {pair.block}, target_layer_ids {pair.layer_ids}, "
                 f"mask_token_id {mask} (target vocab {vocab if vocab is not None else '?'})"
                 f"{'; ' + window_problem if window_problem else ''}")


def drafter_block_size(pair: ModelPair, facts: Facts) -> Check:
    draft = facts.get("draft_tokens")
    problem = ddtree_rules.settings_problem(draft, facts.get("budget", 1), facts.get("topk", 1))
    if problem is not None:
        return check("drafter_block_size", False, f"the DDTree plugin refuses draft length {draft}: {problem}")
    ok = pair.drafter is not None and pair.block >= int(str(draft))
    return check("drafter_block_size", ok, f"draft length {draft} needs drafter block_size >= it; drafter has "
                                           f"{pair.block}")


def drafter_target_layers(pair: ModelPair, facts: Facts) -> Check:
    if pair.target is None or pair.drafter is None or not pair.layer_ids or pair.layers <= 0:
        return check("drafter_target_layers", False, "needs both configs and the drafter's target_layer_ids")
    problem = ddtree_rules.layout_module().capture_problem(pair.layer_ids, pair.layers)
    trained_on = as_int(pair.drafter.get("num_target_layers"))
    if problem is None and trained_on is not None and trained_on != pair.layers:
        problem = (f"the drafter was trained on a {trained_on}-layer target, this target has {pair.layers} layers: "
                   "it is not this target's drafter")
    detail = problem or (f"drafter reads target layers {pair.layer_ids}, which SGLang can capture from this "
                         f"{pair.layers}-layer target")
    return check("drafter_target_layers", problem is None, detail)


def same_setting(key: str) -> Callable[[ModelPair, Facts], Check]:
    def rule(pair: ModelPair, facts: Facts) -> Check:
        target = pair.text.get(key) if pair.target is not None else None
        drafter = (pair.drafter or {}).get(key)
        ok = target is not None and target == drafter
        return check(key, ok, f"target {target if target is not None else '?'}, "
                              f"drafter {drafter if drafter is not None else '?'}")

    return rule


# --- the host -----------------------------------------------------------------------------------------------------


def baseline_sglang(facts: Facts) -> Check:
    result = facts.get("baseline_sglang")
    venv = facts.get("baseline_venv")
    if not command_ok(result):
        return check("baseline_sglang", False,
                     f"no SGLang in {venv}, the venv the NEXTN baseline runs from ({command_error(result)}): the "
                     "rollback target could not start; fix that venv or point pivot_serving_venv at the right one")
    version = str(result.get("stdout", "")).strip()
    return check("baseline_sglang", True,
                 f"SGLang {version} in {venv} serves the NEXTN baseline; Pivot leaves that venv as it is "
                 f"(the DDTree release gets its own venv)")


def release_python(facts: Facts) -> Check:
    result = facts.get("release_python")
    path = facts.get("release_python_path")
    if not command_ok(result):
        return check("release_python", False,
                     f"{path} does not run ({command_error(result)}): set pivot_release_python to the interpreter the "
                     "release venv is made from (the wheelhouse's Python version)")
    return check("release_python", True, f"{path}: Python {str(result.get('stdout', '')).strip()}")


def gpu_count(facts: Facts) -> Check:
    result = facts.get("gpus")
    if not isinstance(result, Mapping) or result.get("failed") or "gpus" not in result:
        msg = result.get("msg", "gpu query failed") if isinstance(result, Mapping) else "gpu query failed"
        return check("gpu_count", False, one_line(msg))
    names = sorted({str(gpu.get("name")) for gpu in result["gpus"]})
    return check("gpu_count", True, f"{len(result['gpus'])} GPUs: {', '.join(names)}")


def _holder_text(process: Mapping[str, Any]) -> str:
    where = f"GPU {process.get('gpu_index')}" if process.get("gpu_index") is not None else "a GPU"
    memory = process.get("used_memory_mib")
    command = one_line(process.get("cmdline") or process.get("name"), 100)
    return f"PID {process.get('pid')} ({command}) holds {memory if memory is not None else '?'} MiB on {where}"


def allowed_holder(facts: Facts) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an allow-pattern (searched in the command line) covers a GPU holder."""
    patterns = [re.compile(str(pattern)) for pattern in facts.get("allowed_gpu_holders") or []]
    return lambda process: any(p.search(str(process.get("cmdline") or "")) for p in patterns)


def gpu_holders(facts: Facts, owner: Callable[[Mapping[str, Any]], bool], owner_text: str) -> Check:
    """Every process holding GPU memory is the one Pivot stops (owner), allowed, or named as a reason to stop here."""
    result = facts.get("gpus")
    if not isinstance(result, Mapping) or "processes" not in result:
        # gpu_count fails with the query's reason; a second failure here would say nothing new.
        return check("gpu_holders", True, "not checked: the GPU query failed (see gpu_count)")
    allowed = allowed_holder(facts)
    others, hidden = [], []
    for process in result["processes"]:
        if not process.get("visible", True):
            hidden.append(process)
        elif not owner(process) and not allowed(process):
            others.append(process)
    note = (f"; {len(hidden)} holder(s) not visible in this host's /proc (another container or the host), so "
            "whose they are cannot be told here: the GPU check after the stop will see if they remain"
            if hidden else "")
    if others:
        listed = "; ".join(_holder_text(p) for p in others)
        return check("gpu_holders", False,
                     f"GPU memory held by processes other than {owner_text}: {listed}. They would keep the GPUs "
                     f"busy after the stop: end them, or allow them with {facts.get('allow_variable')}{note}")
    count = len(result["processes"]) - len(hidden)
    return check("gpu_holders", True, f"{count} GPU process(es), all {owner_text} or allowed{note}")


def unit_cgroup_owner(facts: Facts) -> Callable[[Mapping[str, Any]], bool]:
    unit = facts.get("unit_name", "")
    cgroups: Mapping[str, Any] = facts.get("holder_cgroups") or {}

    def owned(process: Mapping[str, Any]) -> bool:
        text = cgroups.get(str(process.get("pid")), "")
        return bool(unit) and any(line.endswith("/" + unit) or f"/{unit}/" in line for line in text.splitlines())

    return owned


def cuda_toolchain(facts: Facts) -> Check:
    """The extension build's needs, from ``pivot.ops.cuda_toolchain`` (the probe the release venv's build uses)."""
    cuda = facts.get("cuda") or {}
    required = bool(facts.get("require_cuda"))
    if cuda.get("build_possible"):
        return check("cuda_toolchain", True, f"{cuda.get('nvcc')}: {cuda.get('nvcc_release') or '?'}; compute "
                                             f"capability {', '.join(cuda.get('compute_capabilities') or [])}")
    tail = "" if required else "; its PyTorch path will be used"
    why = cuda.get("why_not") or one_line(cuda.get("msg", "the CUDA probe did not run"))
    return check("cuda_toolchain", not required, f"the ddtree_runtime extension cannot be built: {why}{tail}")


def free_disk(facts: Facts) -> Check:
    need = float(facts.get("min_free_gib", 0))
    rows = [line.split() for line in (facts.get("disk") or {}).get("stdout_lines", [])]
    rows = [row for row in rows if len(row) >= 2 and row[0].isdigit()]
    if not rows:
        return check("free_disk", False, f"could not measure free disk space ({command_error(facts.get('disk'))})")
    ok = min(int(row[0]) for row in rows) >= need * GIB
    listed = "; ".join(f"{row[1]}: {int(row[0]) / GIB:.1f} GiB free" for row in rows)
    return check("free_disk", ok, f"{listed}; need {int(need) if need.is_integer() else need} GiB")


def port(facts: Facts) -> Check:
    number, unit = facts.get("port"), facts.get("unit_name")
    listener = " ".join(str((facts.get("listener") or {}).get("stdout", "")).split())
    if not listener:
        return check("port", True, f"port {number} is free")
    if unit and unit in slurped_text(facts.get("listener_cgroup")):
        return check("port", True, f"port {number} is held by {unit}, which the switch restarts")
    return check("port", False, f"port {number} is held by something other than {unit}: {listener}")


def systemd_unit(facts: Facts) -> Check:
    status = (facts.get("unit") or {}).get("status") or {}
    name = facts.get("unit_name")
    if "LoadState" not in status:
        return check("systemd_unit", False, f"cannot talk to systemd: {one_line((facts.get('unit') or {}).get('msg'))}")
    return check("systemd_unit", True, f"{name}: {status['LoadState']}, {status.get('ActiveState', '?')}")


def unit_drop_ins(facts: Facts) -> Check:
    status = (facts.get("unit") or {}).get("status") or {}
    name = facts.get("unit_name")
    drop_ins = str(status.get("DropInPaths") or "").split()
    if not drop_ins:
        return check("unit_drop_ins", True, f"no drop-ins for {name}")
    return check("unit_drop_ins", False,
                 f"{name} has drop-ins ({', '.join(drop_ins)}): Pivot links {name} to each release's unit, and a "
                 "drop-in (systemctl edit) would apply to every release, e.g. override its ExecStart. Fold the "
                 "drop-in into the unit file, or move it away, and run again")


SERVING_MODEL_RULES: tuple[Callable[[ModelPair, Facts], Check], ...] = (
    target_config, drafter_config, drafter_block_size, drafter_target_layers, same_setting("vocab_size"),
    same_setting("hidden_size"),
)


def serving_checks(facts: Facts) -> list[Check]:
    pair = ModelPair(facts)
    checks = [rule(pair, facts) for rule in SERVING_MODEL_RULES]
    checks += [baseline_sglang(facts), release_python(facts), gpu_count(facts),
               gpu_holders(facts, unit_cgroup_owner(facts), f"{facts.get('unit_name')} (stopped by the switch)"),
               cuda_toolchain(facts), free_disk(facts), port(facts), systemd_unit(facts), unit_drop_ins(facts)]
    return checks


# --- training side ------------------------------------------------------------------------------------------------


def unallowed_holders(facts: Facts) -> list[Mapping[str, Any]]:
    """GPU holders no allow-pattern covers, visible in /proc here or not."""
    result = facts.get("gpus")
    processes = (result.get("processes") or []) if isinstance(result, Mapping) else []
    allowed = allowed_holder(facts)
    return [p for p in processes if not allowed(p)]


def training_job(facts: Facts) -> Check:
    job = facts.get("job") or {}
    if job.get("failed"):
        return check("training_job", False, one_line(job.get("msg", "job lookup failed"), 600))
    pids: Sequence[Mapping[str, Any]] = job.get("pids") or []
    if not pids:
        holders = unallowed_holders(facts)
        if holders:
            # "Already gone" with the GPUs still busy is a selector that misses the job, not a stopped job: going on
            # would stop nothing and fail at the GPU check after the stop, telling the user to kill their trainer.
            listed = "; ".join(_holder_text(p) if p.get("visible", True)
                               else f"PID {p.get('pid')} (not visible in this host's /proc) holds "
                                    f"{p.get('used_memory_mib', '?')} MiB" for p in holders[:6])
            selector = one_line(json.dumps(facts.get("job_selector") or {}), 200)
            return check("training_job", False,
                         f"no process matches the job selector {selector} (pivot_training_job), yet the training "
                         f"GPUs are held: {listed}. If that is the training "
                         "job, the selector misses it: match the trainer by its script's path or name "
                         "(cmdline_match, see docs/modules.md), a pidfile or its unit. If the job really ended, end "
                         "those processes or allow them with pivot_training_allowed_gpu_holders")
        return check("training_job", True, "no training job is running (already gone) and no process holds the "
                                           "training GPUs: nothing to stop")
    shown = "; ".join(f"PID {p.get('pid')} {one_line(p.get('cmdline'), 60)}" for p in pids[:4])
    more = "; ..." if len(pids) > 4 else ""
    found = f"found the job: {len(pids)} processes, {shown}{more}"
    if job.get("checkpoint_signal_targets") == []:
        # The stop would refuse this (a signal without a handler kills the process) after the release venv was built
        signal_name = facts.get("checkpoint_signal") or "SIGUSR1"
        if boolean(facts.get("force"), strict=False):
            return check("training_job", True, f"{found}; no process of it handles {signal_name}: with "
                                               "pivot_training_force the stop goes ahead WITHOUT a checkpoint")
        return check("training_job", False,
                     f"{found}; none of its processes handles {signal_name}, so the checkpoint cannot be requested "
                     f"by signal (sending it would kill them). Set pivot_training_checkpoint.request=file if the "
                     f"trainer watches a trigger file, signal_targets=all if it really handles {signal_name}, or "
                     "pivot_training_force=true to stop without a checkpoint (the work since the last one is lost)")
    return check("training_job", True, found)


def checkpoint_dir(facts: Facts) -> Check:
    path = facts.get("checkpoint_dir") or ""
    stat = (facts.get("checkpoint_stat") or {}).get("stat") or {}
    if not path:
        return check("checkpoint_dir", True, "no checkpoint requested")
    if not stat.get("exists"):
        return check("checkpoint_dir", False, f"{path} does not exist")
    if not stat.get("isdir"):
        return check("checkpoint_dir", False, f"{path} is not a directory")
    if not stat.get("writeable"):
        return check("checkpoint_dir", False, f"{path} is not writable")
    return check("checkpoint_dir", True, f"{path} is a writable directory")


def checkpoint_space(facts: Facts) -> Check:
    """The checkpoint the stop asks for must fit: free space at least the size of the newest complete one."""
    space = (facts.get("job") or {}).get("checkpoint_space") or {}
    if not space:
        return check("checkpoint_space", True, "no checkpoint requested, or no job to checkpoint")
    directory, free, newest, size = (space.get(k) for k in ("directory", "free_bytes", "newest", "newest_bytes"))
    if free is None:
        return check("checkpoint_space", False, f"cannot read the free space of {directory}")
    if not newest or size is None:
        return check("checkpoint_space", True,
                     f"{directory}: {free / GIB:.1f} GiB free; no complete checkpoint yet to size the next one by")
    fits = int(free) >= int(size)
    detail = (f"{directory}: {free / GIB:.1f} GiB free, the newest checkpoint ({newest}) takes {size / GIB:.1f} GiB")
    if fits:
        return check("checkpoint_space", True, detail)
    return check("checkpoint_space", False,
                 f"{detail}: the checkpoint the stop asks for would not fit, and a trainer that runs out of space "
                 "while saving fails with ENOSPC (its work since the newest checkpoint lost). Free space there (move "
                 "older checkpoints away) and run again")


def job_owner(facts: Facts) -> Callable[[Mapping[str, Any]], bool]:
    pids = {as_int(p.get("pid")) for p in (facts.get("job") or {}).get("pids") or []}
    return lambda process: as_int(process.get("pid")) in pids


def training_checks(facts: Facts) -> list[Check]:
    return [training_job(facts), checkpoint_dir(facts), checkpoint_space(facts), gpu_count(facts),
            gpu_holders(facts, job_owner(facts), "the training job (stopped by the pivot)")]


def skip(checks: list[Check], skipped: Sequence[str]) -> list[Check]:
    """Checks named in ``skipped`` count as passed and say so."""
    return [{**c, "ok": True, "skipped": True} if c["name"] in skipped else c for c in checks]
