# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Phase 0's rules: a run's inputs (the serving and the training host's variables) in, one sentence per problem out.

``input_problems`` judges the pivot's inputs (both hosts), ``resume_input_problems`` a training host's inputs to
``resume_training.yml`` (and ``rollback_nextn.yml`` with ``resume_training_after_rollback``). A value that still holds
one of the production inventory's ``<PLACEHOLDER>``s (``<TRAINING_LOG_FILE>``, ``<CONFIRM: ...>``) is named as such.

Values given with ``-e key=value`` arrive as strings, so numbers are judged by their text. Draft length, budget and
top-k are the DDTree plugin's own rule (:mod:`ddtree_rules`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ansible_collections.pivot.ops.plugins.plugin_utils import ddtree_rules

Problem = str | None
NUMBER = re.compile(r"^[0-9]*\.?[0-9]+$")
# What the production inventory leaves for the user to fill in: <TRAINING_LOG_FILE>, <CONFIRM: the trainer's option>.
PLACEHOLDER = re.compile(r"<[A-Z][^<>]*>")


def placeholders(value: Any) -> list[str]:
    """The ``<PLACEHOLDER>``s left in a value: a string, or the strings in a list or a mapping (its values)."""
    if isinstance(value, str):
        return PLACEHOLDER.findall(value)
    if isinstance(value, Mapping):
        return [found for item in value.values() for found in placeholders(item)]
    if isinstance(value, (list, tuple)):
        return [found for item in value for found in placeholders(item)]
    return []


# How Ansible reaches a host: set per host in the inventory's hosts.yml, where the production example leaves
# <PLACEHOLDER>s too.
CONNECTION_VARIABLES = ("ansible_host", "ansible_port", "ansible_user", "ansible_private_key_file",
                        "ansible_ssh_private_key_file", "ansible_ssh_common_args", "proxmox_vmid")


def connection_placeholders(host_vars: Mapping[str, Any]) -> list[Problem]:
    """A connection variable that still holds a placeholder: the host could not be reached (a paramiko traceback)."""
    host = host_vars.get("inventory_hostname", "the host")
    return [f"{host}'s {name} still holds the placeholder {', '.join(placeholders(host_vars.get(name)))}: replace it "
            "in the inventory's hosts.yml"
            for name in CONNECTION_VARIABLES if placeholders(host_vars.get(name))]


def _integer(value: Any) -> int | None:
    text = str(value).strip()
    return int(text) if re.fullmatch(r"[0-9]+", text) else None


def _number(value: Any) -> float | None:
    text = str(value).strip()
    return float(text) if NUMBER.fullmatch(text) else None


def _absolute(name: str, value: Any, where: str) -> Problem:
    left = placeholders(value)
    if left:
        return f"{name} still holds the placeholder {', '.join(left)}: replace it with an absolute path on the {where}"
    if isinstance(value, str) and value.startswith("/"):
        return None
    return f"{name} must be an absolute path on the {where}; got {value if value is not None else 'nothing'}"


def ddtree_settings(s: Mapping[str, Any]) -> Problem:
    draft, budget, topk = (s.get(k) for k in ("pivot_ddtree_draft_tokens", "pivot_ddtree_budget", "pivot_ddtree_topk"))
    refusal = ddtree_rules.settings_problem(draft, budget, topk)
    if refusal is None:
        return None
    return (f"The DDTree plugin would refuse pivot_ddtree_draft_tokens={draft}, pivot_ddtree_budget={budget}, "
            f"pivot_ddtree_topk={topk}: {refusal}")


def mamba_tracking(s: Mapping[str, Any]) -> Problem:
    draft, budget, topk = (s.get(k) for k in ("pivot_ddtree_draft_tokens", "pivot_ddtree_budget", "pivot_ddtree_topk"))
    flags = s.get("pivot_serving_common_args") or {}
    refusal = ddtree_rules.mamba_tracking_problem(draft, budget, topk, flags if isinstance(flags, Mapping) else {})
    if refusal is None:
        return None
    return (f"The DDTree plugin would refuse pivot_ddtree_budget={budget} with pivot_serving_common_args as they are: "
            f"{refusal} (in the inventory: mamba-track-interval under pivot_serving_common_args, or "
            "pivot_ddtree_budget)")


def accept_gate(s: Mapping[str, Any]) -> Problem:
    value = s.get("pivot_ddtree_min_accept_length")
    number = _number(value)
    if number is not None and number > 0:
        return None
    return f"pivot_ddtree_min_accept_length must be a number > 0; got {value}"


def quality_gate(s: Mapping[str, Any]) -> Problem:
    value = s.get("pivot_quality_min_agreement", 0.8)
    number = _number(value)
    if number is not None and 0 <= number <= 1:
        return None
    return f"pivot_quality_min_agreement must be a number from 0 (gate off) to 1; got {value}"


def port(s: Mapping[str, Any]) -> Problem:
    value = s.get("pivot_serving_port")
    number = _integer(value)
    if number is not None and 1 <= number <= 65535:
        return None
    return f"pivot_serving_port must be a TCP port; got {value}"


def health_timeout(s: Mapping[str, Any]) -> Problem:
    value = s.get("pivot_serving_health_timeout", 1800)
    number = _integer(value)
    if number is not None and number >= 1:
        return None
    return ("pivot_serving_health_timeout (seconds a starting server may take to become healthy) must be an integer "
            f">= 1; got {value}")


def single_config_file(s: Mapping[str, Any]) -> Problem:
    if "config" in (s.get("pivot_serving_common_args") or {}):
        return ("pivot_serving_common_args must not set config: Pivot passes the API key to SGLang in its own --config "
                "file, and SGLang takes only one")
    return None


def serving_paths(s: Mapping[str, Any]) -> list[Problem]:
    names = ("pivot_serving_venv", "pivot_serving_target_model", "pivot_serving_drafter_model", "pivot_release_root",
             "pivot_release_python")
    return [_absolute(name, s.get(name), "serving host") for name in names]


def wheelhouse(s: Mapping[str, Any]) -> Problem:
    if str(s.get("pivot_release_wheelhouse") or "").strip():
        return None
    return ("pivot_release_wheelhouse must name the release wheelhouse's directory on the controller (with "
            "pivot_release_wheelhouse_lock, Pivot downloads it there)")


def job_selector(t: Mapping[str, Any]) -> Problem:
    job = t.get("pivot_training_job") or {}
    if isinstance(job, Mapping) and any(key in job for key in ("cmdline_match", "pidfile", "unit")):
        return None
    return "pivot_training_job needs one of cmdline_match, pidfile or unit to find the job"


def checkpoint_path(t: Mapping[str, Any]) -> Problem:
    checkpoint = t.get("pivot_training_checkpoint") or {}
    if not checkpoint:
        return None
    return _absolute("pivot_training_checkpoint.path", checkpoint.get("path"), "training host")


def log_file(t: Mapping[str, Any]) -> Problem:
    value = t.get("pivot_training_log_file")
    return None if value in (None, "") else _absolute("pivot_training_log_file", value, "training host")


# --- resume_training.yml: what starting the job again needs -------------------------------------------------------


def resume_log_file(t: Mapping[str, Any]) -> Problem:
    """The resume waits for a step after the checkpoint's in the log, so the log is needed (the pivot's is optional)."""
    return _absolute("pivot_training_log_file", t.get("pivot_training_log_file"), "training host")


def resume_from(t: Mapping[str, Any]) -> Problem:
    value = t.get("pivot_resume_from")
    return None if value in (None, "") else _absolute("pivot_resume_from", value, "training host")


def resume_command(command: Any) -> Problem:
    if not isinstance(command, list) or not command or not all(isinstance(item, str) and item for item in command):
        return ("pivot_training_resume.command must be the job's command line as a list, one argument per element (no "
                f"shell), with {{checkpoint}} where the checkpoint's path goes; got {command!r}")
    left = placeholders(command)
    if left:
        return (f"pivot_training_resume.command still holds the placeholder {', '.join(left)}: replace it with how the "
                "trainer takes the checkpoint to resume from (for example --resume_from_checkpoint followed by "
                "\"{checkpoint}\"), or leave the element out if the trainer resumes from its newest checkpoint by "
                "itself")
    return None


def resume_settings(t: Mapping[str, Any]) -> list[Problem]:
    resume = t.get("pivot_training_resume")
    if not isinstance(resume, Mapping):
        return ["pivot_training_resume must say how to start the job again: at least its command (docs/operations.md, "
                f"\"Resuming training\"); got {resume!r}"]
    paths = [_absolute(f"pivot_training_resume.{name}", resume.get(name), "training host")
             for name in ("chdir", "output_file", "pidfile") if resume.get(name) not in (None, "")]
    return [resume_command(resume.get("command")), *paths]


SERVING_RULES: tuple[Callable[[Mapping[str, Any]], Problem], ...] = (
    ddtree_settings, mamba_tracking, single_config_file, accept_gate, quality_gate, port, health_timeout, wheelhouse,
)
TRAINING_RULES: tuple[Callable[[Mapping[str, Any]], Problem], ...] = (job_selector, checkpoint_path, log_file)
RESUME_RULES: tuple[Callable[[Mapping[str, Any]], Problem], ...] = (
    job_selector, checkpoint_path, resume_log_file, resume_from,
)


def input_problems(serving: Mapping[str, Any], training: Mapping[str, Any]) -> list[str]:
    found: list[Problem] = connection_placeholders(serving) + connection_placeholders(training)
    found += [rule(serving) for rule in SERVING_RULES] + serving_paths(serving)
    found += [rule(training) for rule in TRAINING_RULES]
    return [problem for problem in found if problem]


def resume_input_problems(training: Mapping[str, Any]) -> list[str]:
    found: list[Problem] = connection_placeholders(training)
    found += [rule(training) for rule in RESUME_RULES] + resume_settings(training)
    return [problem for problem in found if problem]
