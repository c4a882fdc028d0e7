# ruff: noqa: PLC0415 - each command imports only the SGLang modules it probes (importing all takes seconds)
"""Runs INSIDE .venv-sglang (CPython 3.11, stock SGLang 0.5.23 on CPU); the contract tests call it by subprocess.

``python sglang_probe.py COMMAND [ARGS...]`` prints one JSON object on stdout. Commands:

- ``plugins``: the ``sglang.srt.plugins`` entry points, then ``load_plugins()`` and what ``DDTREE`` resolves to;
- ``plugins-as VERSION``: the same with SGLang reporting another version (the version guard must refuse);
- ``parse -- ARGV...``: ``prepare_server_args(ARGV)`` after ``load_plugins()`` (a parse error exits 2);
- ``resolve-spec -- ARGV...``: parse, then run DDTREE's validate/handle through SGLang's own recorder
  (``record_foreign_defaults``) and report the declared resolutions and the two widths;
- ``hooks``: the hook targets after ``load_plugins()`` are the plugin's wrappers, and the worker class;
- ``greedy-verify SEED``: SGLang's Triton greedy tree-verify kernel (interpreter mode, CPU) on trees laid out
  by ddtree_runtime, against ddtree_runtime's reference walk.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from importlib.metadata import entry_points
from typing import Any


def _loaded() -> Any:
    from sglang.srt.plugins import load_plugins
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    load_plugins()
    return SpeculativeAlgorithm


def cmd_plugins(_unused: list[str]) -> dict[str, Any]:
    found = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    algorithm_class = _loaded()
    try:
        resolved = repr(algorithm_class.from_string("DDTREE"))
        error = None
    except Exception as exc:
        resolved, error = None, f"{type(exc).__name__}: {exc}"
    from ddtree_runtime.sglang import registration_error

    refusal = registration_error()
    return {"entry_points": found, "resolved": resolved, "error": error,
            "refusal": None if refusal is None else f"{type(refusal).__name__}: {refusal}"}


def cmd_plugins_as(argv: list[str]) -> dict[str, Any]:
    """``plugins`` with ``importlib.metadata`` reporting SGLang as version ``argv[0]`` (the version guard's view)."""
    import importlib.metadata

    real_version = importlib.metadata.version
    importlib.metadata.version = lambda name: argv[0] if name == "sglang" else real_version(name)
    return cmd_plugins([])


def _parse(argv: list[str]) -> Any:
    from sglang.srt.server_args import prepare_server_args

    _loaded()
    return prepare_server_args(argv)


def cmd_parse(argv: list[str]) -> dict[str, Any]:
    args = _parse(argv)
    return {"model_path": args.model_path, "speculative_algorithm": args.speculative_algorithm,
            "speculative_num_draft_tokens": args.speculative_num_draft_tokens, "tp_size": args.tp_size}


def cmd_resolve_spec(argv: list[str]) -> dict[str, Any]:
    from sglang.srt.arg_groups.overrides import record_foreign_defaults, resolution_result

    args = _parse(argv)
    args.device = "cuda"  # what the GPU host resolves; device detection needs an accelerator
    algorithm = _loaded().from_string(args.speculative_algorithm)
    record_foreign_defaults(args, "contract.validate", algorithm.validate_server_args)
    record_foreign_defaults(args, "contract.handle", algorithm.handle_server_args)
    fields = ("speculative_num_steps", "speculative_eagle_topk", "disable_overlap_schedule",
              "speculative_num_draft_tokens", "max_running_requests", "page_size")
    resolved = {name: resolution_result(args, name) for name in fields}
    return {
        "resolved": resolved,
        "predicates": {name: getattr(algorithm, name)() for name in (
            "is_dflash", "is_dflash_family", "supports_target_verify_for_draft", "has_draft_kv", "is_eagle")},
        "max_draft_tokens": algorithm.resolve_max_speculative_num_draft_tokens(args),
        "target_verify_width": algorithm.get_num_tokens_per_req_for_target_verify(
            resolved["speculative_num_draft_tokens"], False),
        "draft_verify_width": algorithm.get_num_tokens_per_req_for_target_verify(
            resolved["speculative_num_draft_tokens"], True),
    }


def cmd_hooks(_unused: list[str]) -> dict[str, Any]:
    import pkgutil

    _loaded()
    from ddtree_runtime.sglang import compat, plugin

    wrapped = {}
    for target in compat.HOOK_TARGETS:
        function = pkgutil.resolve_name(target)
        wrapped[target] = getattr(function, "__wrapped__", None) is not None and function.__name__ == target.rsplit(
            ".", 1)[1]
    from ddtree_runtime.sglang.worker import DDTreeVerifyInput, DDTreeWorker
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    worker = plugin.worker_class(None)
    return {
        "wrapped": wrapped,
        "worker": f"{worker.__module__}.{worker.__qualname__}",
        "worker_is_dflash_v2": issubclass(DDTreeWorker, DFlashWorkerV2),
        "verify_input_fields": sorted(DDTreeVerifyInput.__dataclass_fields__),
        "missing": compat.missing_attributes((*compat.HOOK_TARGETS, *compat.REQUIRED_ATTRIBUTES)),
    }


def cmd_greedy_verify(argv: list[str]) -> dict[str, Any]:
    import torch
    from ddtree_runtime.sglang.tree_inputs import accepted_paths, tree_verify_tensors
    from ddtree_runtime.tree import build_tree_batch
    from ddtree_runtime.verify import follow_greedy
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    seed = int(argv[0])
    generator = torch.Generator().manual_seed(seed)
    batch, depth, vocab, width = 3, 5, 10, 12
    logits = torch.randn(batch, depth, vocab, generator=generator) * 2
    trees = build_tree_batch(logits, [11, 6, 3], max_topk=3)
    roots = torch.randint(0, vocab, (batch,), generator=generator)
    tensors = tree_verify_tensors(trees, roots, torch.tensor([4, 7, 2]), width=width)
    target = torch.randint(0, vocab, (batch, width), generator=generator)
    for b in range(batch):  # plant each tree's deepest path so acceptance is exercised
        tree = trees.tree(b)
        path = tree.path_to(int(torch.argmax(tree.depths)) + 1) if tree.num_nodes else [0]
        for parent, child in itertools.pairwise(path):
            target[b, parent] = tree.token_ids[child - 1]
    steps = depth + 1
    predicts = torch.zeros(batch * width, dtype=torch.int32)
    accept_index = torch.full((batch, steps), -1, dtype=torch.int32)
    accept_num = torch.zeros(batch, dtype=torch.int32)
    verify_tree_greedy_triton(predicts, accept_index, accept_num, tensors.candidates, tensors.retrieve_index,
                              tensors.retrieve_next_token, tensors.retrieve_next_sibling, target)
    paths = accepted_paths(accept_index, accept_num, width)
    result = []
    for b in range(batch):
        tree = trees.tree(b)
        accepted, bonus = follow_greedy(tree, target[b, : tree.num_nodes + 1])
        committed = predicts[paths.rows[b, : int(paths.lengths[b])]].tolist()
        result.append({"sglang_nodes": paths.nodes[b, : int(paths.lengths[b])].tolist(), "ddtree_nodes": accepted,
                       "sglang_committed": committed, "ddtree_committed": [int(target[b, n]) for n in accepted],
                       "bonus": bonus})
    return {"requests": result}


COMMANDS = {"plugins": cmd_plugins, "plugins-as": cmd_plugins_as, "parse": cmd_parse,
            "resolve-spec": cmd_resolve_spec, "hooks": cmd_hooks, "greedy-verify": cmd_greedy_verify}


def main() -> int:
    command, rest = sys.argv[1], sys.argv[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # SGLang and plugins may print; keep stdout for the one JSON line
    try:
        result = COMMANDS[command](rest)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
