# ruff: noqa: PLC0415 - each command imports only the SGLang modules it probes (importing all takes seconds)
"""Runs INSIDE .venv-sglang (CPython 3.11, stock SGLang 0.5.23 on CPU); the contract tests call it by subprocess.

``python sglang_probe.py COMMAND [ARGS...]`` prints one JSON object on stdout. Commands:

- ``plugins``: the ``sglang.srt.plugins`` entry points, then ``load_plugins()`` and what ``DDTREE`` resolves to;
- ``plugins-as VERSION``: the same with SGLang reporting another version (the version guard must refuse);
- ``parse -- ARGV...``: ``prepare_server_args(ARGV)`` after ``load_plugins()`` (a parse error exits 2);
- ``handle-changes -- ARGV...``: parse, then what DDTREE's validate/handle changed of the fields it decides;
- ``resolve-spec -- ARGV...``: parse, then run DDTREE's validate/handle through SGLang's own recorder
  (``record_foreign_defaults``) and report the declared resolutions and the two widths;
- ``hooks``: the hook targets after ``load_plugins()`` are the plugin's wrappers, and the worker class;
- ``greedy-verify SEED``: SGLang's Triton greedy tree-verify kernel (interpreter mode, CPU) on trees laid out
  by ddtree_runtime, against ddtree_runtime's reference walk;
- ``acceptance-tokenizers``: the acceptance suite's models loaded as its servers load them at start (tokenizer,
  multimodal processor, xgrammar grammar backend), and the hybrid target without its processor files.

``python sglang_probe.py serve`` imports SGLang's heavy modules once (about 9 s), then answers one request per stdin
line (``{"command", "args", "env"}``) with one stdout line (``{"rc", "stdout", "stderr"}``). Each request runs in a
child forked for it with exactly the requested environment, before any plugin is loaded, so cases stay as isolated
as separate interpreters; only the import time is shared. Start it with ``TRITON_INTERPRET=1``: Triton reads that
when a kernel module is imported, not when the kernel runs.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, BinaryIO

# What every command imports first and what costs the seconds; none of it loads plugins or reads DDTREE_*.
PRELOADED_MODULES = ("torch", "sglang.srt.server_args", "sglang.srt.speculative.spec_info", "sglang.srt.plugins",
                     "sglang.srt.arg_groups.overrides", "sglang.srt.speculative.dflash_worker_v2")


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
    max_draft_tokens = algorithm.resolve_max_speculative_num_draft_tokens(args)
    # The width hooks read the published config (published in the scheduler from these args; publishing here would
    # need the model's config on disk, so the probe stands in for that one read). SGLang calls them with either D or
    # max_speculative_num_draft_tokens() (the crash of the first GPU start was the second).
    import types

    from sglang.srt import runtime_context

    runtime_context.get_spec = lambda: types.SimpleNamespace(
        speculative_num_draft_tokens=resolved["speculative_num_draft_tokens"], speculative_algorithm="DDTREE")
    asked = sorted({resolved["speculative_num_draft_tokens"], max_draft_tokens})
    return {
        "resolved": resolved,
        "predicates": {name: getattr(algorithm, name)() for name in (
            "is_dflash", "is_dflash_family", "supports_target_verify_for_draft", "has_draft_kv", "is_eagle")},
        "max_draft_tokens": max_draft_tokens,
        "target_verify_width": algorithm.get_num_tokens_per_req_for_target_verify(
            resolved["speculative_num_draft_tokens"], False),
        "draft_verify_width": algorithm.get_num_tokens_per_req_for_target_verify(
            resolved["speculative_num_draft_tokens"], True),
        "widths_by_argument": {str(n): [algorithm.get_num_tokens_per_req_for_target_verify(n, False),
                                        algorithm.get_num_tokens_per_req_for_target_verify(n, True)] for n in asked},
        "supports_overlap": algorithm.supports_overlap,
        # What create_worker says for a server with overlap scheduling on (SGLang's default).
        "worker_with_overlap": _worker_name(algorithm, args),
    }


def _worker_name(algorithm: Any, args: Any) -> str:
    try:
        return algorithm.create_worker(args).__name__
    except Exception as error:  # SGLang refuses overlap for an algorithm registered without it
        return f"{type(error).__name__}: {error}"


@contextlib.contextmanager
def _acceptance_models() -> Iterator[tuple[Path, Path]]:
    """The acceptance suite's model pairs (hybrid and round-cost) in a scratch directory that is removed afterwards:
    yields the directory and the hybrid target."""
    from ddtree_runtime.acceptance.hybrid import write_hybrid_pair
    from ddtree_runtime.acceptance.round_cost import SHAPES, write_shape_pair

    with tempfile.TemporaryDirectory(prefix="acceptance-models-") as directory:
        models = Path(directory)
        target, _drafter = write_hybrid_pair(models)
        for shape in SHAPES:
            write_shape_pair(shape, models)
        yield models, target


def cmd_handle_changes(argv: list[str]) -> dict[str, Any]:
    """The fields DDTREE decides (``REQUIRED_SERVER_ARG_FIELDS``): as ``argv`` gives them, and as they resolve once the
    plugin's own validate/handle ran through SGLang's recorder; ``changed`` holds those the plugin decided."""
    from ddtree_runtime.sglang.config import REQUIRED_SERVER_ARG_FIELDS
    from sglang.srt.arg_groups.overrides import record_foreign_defaults, resolution_result

    args = _parse(argv)
    args.device = "cuda"  # what the GPU host resolves; device detection needs an accelerator
    algorithm = _loaded().from_string(args.speculative_algorithm)
    given = {field: getattr(args, field, None) for field in REQUIRED_SERVER_ARG_FIELDS}
    record_foreign_defaults(args, "contract.validate", algorithm.validate_server_args)
    record_foreign_defaults(args, "contract.handle", algorithm.handle_server_args)
    resolved = {field: resolution_result(args, field) for field in REQUIRED_SERVER_ARG_FIELDS}
    changed = {field: [given[field], resolved[field]] for field in resolved if given[field] != resolved[field]}
    return {"given": given, "resolved": resolved, "changed": changed}


def cmd_acceptance_commands(_unused: list[str]) -> dict[str, Any]:
    """Every server command line of the GPU acceptance suite, through SGLang's own ``prepare_server_args`` with
    the plugin loaded and each server's environment: the serving ones must parse, the refusals must fail with the
    plugin's message."""
    from ddtree_runtime.acceptance.plan import HYBRID_FLAGS, refusal_specs, serving_specs

    _loaded()
    with _acceptance_models() as (models, _target):
        cases = [(spec, None) for spec in serving_specs(models)] + refusal_specs()
        outcome = {spec.name: _parsed_command(spec, expected) for spec, expected in cases}
    return {"specs": outcome, "hybrid_flags": list(HYBRID_FLAGS)}


def _parsed_command(spec: Any, expected: str | None) -> dict[str, Any]:
    """One acceptance server's command line through ``prepare_server_args``, in that server's environment."""
    import io

    from ddtree_runtime.acceptance.launch import server_command, server_environment
    from sglang.srt.arg_groups.overrides import record_foreign_defaults
    from sglang.srt.server_args import prepare_server_args

    argv = server_command(spec, "python3", 30000)[3:]
    saved = dict(os.environ)
    os.environ.update(server_environment(spec, {}))
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = prepare_server_args(argv)
            if args.speculative_algorithm == "DDTREE":
                # The server validates at launch (the GPU run's refusal step sees that); here as resolve-spec does.
                args.device = "cuda"
                algorithm = _loaded().from_string("DDTREE")
                record_foreign_defaults(args, "contract.validate", algorithm.validate_server_args)
    except BaseException as error:  # argparse exits with SystemExit; the plugin raises ValueError
        return {"ok": False, "expected": expected,
                "error": f"{type(error).__name__}: {error}\n{stderr.getvalue()[-2000:]}"}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"ok": True, "expected": expected, "algorithm": args.speculative_algorithm,
            "draft_tokens": args.speculative_num_draft_tokens, "load_format": args.load_format,
            "draft_load_format": args.speculative_draft_load_format, "skip_tokenizer_init": args.skip_tokenizer_init,
            "disable_overlap_schedule": bool(args.disable_overlap_schedule)}


GRAMMAR = "[a-z ]+"
"""The acceptance suite's grammar request (case 8)."""


def _uvloop_or_stand_in() -> None:
    """``tokenizer_manager`` (where ``get_processor_wrapper`` lives) imports uvloop only to set the event loop policy;
    the contract venv does not install it (the GPU bundle does), so an absent one is stood in for by asyncio's."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        import asyncio
        import types

        stand_in = types.ModuleType("uvloop")
        stand_in.EventLoopPolicy = asyncio.DefaultEventLoopPolicy  # type: ignore[attr-defined]
        sys.modules["uvloop"] = stand_in


def _allowed(grammar: Any, vocab_size: int) -> list[int]:
    """The token ids SGLang's own mask leaves to sampling after ``grammar``'s current state."""
    import torch

    mask = grammar.allocate_vocab_mask(vocab_size, 1, "cpu")
    grammar.fill_vocab_mask(mask, 0)
    logits = torch.zeros(1, vocab_size)
    grammar.apply_vocab_mask(logits, mask)
    return [i for i in range(vocab_size) if logits[0, i] > float("-inf")]


def _tokenizer_start(argv: list[str]) -> dict[str, Any]:
    """What a server started with ``argv`` makes of its model's tokenizer on start, as SGLang 0.5.23 does it:
    ``TokenizerManager.init_tokenizer_and_processor`` (a multimodal model: ``get_processor_wrapper`` and
    ``get_mm_processor``; otherwise ``get_tokenizer``) and the scheduler's ``GrammarManager``
    (``create_grammar_backend`` with the model's vocabulary size and EOS ids), then the suite's regex through SGLang's
    own vocab mask."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.constrained.base_grammar_backend import create_grammar_backend
    from sglang.srt.runtime_context import get_exec, get_model, get_serving, override_platform, publish
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.hf_transformers.common import get_tokenizer_from_processor
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    _loaded()
    args = prepare_server_args(argv)
    args.device = "cuda"  # what the GPU host resolves
    override_platform(is_cuda=True).install()  # the hybrid's mamba extra_buffer asks the platform (a CUDA host)
    publish(args, role="tokenizer")
    config = ModelConfig.from_server_args(args)
    outcome: dict[str, Any] = {"skip_tokenizer_init": get_serving().skip_tokenizer_init,
                               "grammar_backend": get_exec().kernel.grammar_backend,
                               "multimodal": config.is_multimodal, "vocab_size": config.vocab_size,
                               "eos": sorted(config.hf_eos_token_id or [])}
    if get_serving().skip_tokenizer_init:
        return outcome
    if config.is_multimodal:
        _uvloop_or_stand_in()
        from sglang.srt.managers.multimodal_processor import get_mm_processor, import_processors
        from sglang.srt.managers.tokenizer_manager import get_processor_wrapper
        from sglang.srt.multimodal.transport import determine_tensor_transport_mode

        import_processors("sglang.srt.multimodal.processors")
        processor = get_processor_wrapper()
        mm = get_mm_processor(config.hf_config, args, processor, determine_tensor_transport_mode(),
                              model_config=config)
        tokenizer = get_tokenizer_from_processor(processor)
        outcome.update(processor=type(processor).__name__, mm_processor=type(mm).__name__,
                       image_processor=type(processor.image_processor).__name__,
                       video_processor=type(processor.video_processor).__name__,
                       processor_token_ids=[processor.image_token_id, processor.video_token_id,
                                            processor.vision_start_token_id, processor.vision_end_token_id],
                       mm_token_ids=[mm.IM_TOKEN_ID, mm.VIDEO_TOKEN_ID, mm.IM_START_TOKEN_ID, mm.IM_END_TOKEN_ID])
    else:
        tokenizer = get_tokenizer(get_serving().tokenizer_path, tokenizer_mode=get_serving().tokenizer_mode,
                                  trust_remote_code=get_model().trust_remote_code, revision=get_model().revision,
                                  tokenizer_backend=get_serving().tokenizer_backend)
    from ddtree_runtime.acceptance.prompts import suite_prompts
    from ddtree_runtime.eval.tasks import CODING_TASKS, HELD_OUT_PROMPTS, load_prompt_file
    from ddtree_runtime.tokenizer import ByteTokenizer

    texts = [p.text for p in (*CODING_TASKS, *load_prompt_file(HELD_OUT_PROMPTS))]
    byte = ByteTokenizer()
    outcome.update(tokenizer=type(tokenizer).__name__, tokenizer_size=len(tokenizer),
                   eos_token_id=tokenizer.eos_token_id, has_chat_template=tokenizer.chat_template is not None,
                   prompts_as_suite=tokenizer(texts)["input_ids"] == [p.input_ids for p in suite_prompts()],
                   decomposed_accent=tokenizer("e\u0301")["input_ids"], decomposed_accent_bytes=byte.encode("e\u0301"),
                   specials=tokenizer("<|im_start|><|im_end|><think>")["input_ids"])
    backend = create_grammar_backend(args, tokenizer, config.vocab_size, config.hf_eos_token_id,
                                     think_end_ids=config.think_end_ids)
    outcome["grammar_backend_class"] = type(backend).__name__ if backend is not None else None
    if backend is None:
        return outcome
    grammar = backend.dispatch_regex(GRAMMAR)
    first = _allowed(grammar, config.vocab_size)
    walk = byte.encode("hello world")
    for token in walk:
        grammar.accept_token(token)
    after = _allowed(grammar, config.vocab_size)
    grammar.rollback(len(walk) - 2)  # DDTREE's verify rolls a grammar back past rejected draft tokens
    outcome.update(grammar_first=first, grammar_after_text=after, grammar_after_rollback=_allowed(grammar,
                   config.vocab_size), grammar_refuses_digit=ord("1") not in after)
    return outcome


def cmd_acceptance_tokenizers(_unused: list[str]) -> dict[str, Any]:
    """Each model the acceptance suite serves, started with its baseline server's exact command line
    (:func:`_tokenizer_start`), and the first GPU run's hybrid target without its processor files."""
    with _acceptance_models() as (models, target):
        return _tokenizer_starts(models, target)


def _tokenizer_starts(models: Path, target: Path) -> dict[str, Any]:
    import shutil

    from ddtree_runtime.acceptance.launch import server_command
    from ddtree_runtime.acceptance.plan import serving_specs
    from sglang.srt.utils.hf_transformers.processor import get_processor

    baselines = {spec.name: spec for spec in serving_specs(models) if spec.algorithm is None and spec.cuda_graphs}
    outcome: dict[str, Any] = {}
    for name, spec in baselines.items():
        pid = os.fork()  # each start publishes its own process-wide config
        if pid == 0:
            try:
                result = {"ok": True, **_tokenizer_start(server_command(spec, "python3", 30000)[3:])}
            except BaseException as error:
                result = {"ok": False, "error": f"{type(error).__name__}: {error}\n{traceback.format_exc()[-3000:]}"}
            (models / f"{name}.json").write_text(json.dumps(result))
            os._exit(0)
        os.waitpid(pid, 0)
        outcome[name] = json.loads((models / f"{name}.json").read_text())
    bare = models / "hybrid-target-without-processor"
    bare.mkdir()
    shutil.copy(target / "config.json", bare / "config.json")
    try:
        get_processor(str(bare), model_name=str(bare))
        without = None
    except OSError as error:
        without = str(error)
    return {"servers": outcome, "hybrid_without_processor": without}


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


def cmd_algorithm_interface(_unused: list[str]) -> dict[str, Any]:
    """Which of SpeculativeAlgorithm's methods DDTREE lacks, and how its argument-free answers compare with DFLASH's."""
    algorithm_class = _loaded()
    ddtree, dflash = algorithm_class.from_string("DDTREE"), algorithm_class.DFLASH
    methods = sorted(name for name, value in vars(algorithm_class).items()
                     if inspect.isfunction(value) and not name.startswith("_"))
    predicates = [name for name in methods if len(inspect.signature(getattr(algorithm_class, name)).parameters) == 1]
    return {"methods": methods, "missing": [name for name in methods if not hasattr(ddtree, name)],
            "answers": {name: [getattr(ddtree, name)(), getattr(dflash, name)()] for name in predicates}}


def cmd_verify_mask(argv: list[str]) -> dict[str, Any]:
    """Elements of the target's tree-mask buffer as the triton backend allocates it, under ``argv[0]``'s algorithm
    (D = 16, context 100, 2 requests)."""
    import types

    import torch

    _loaded()
    from sglang.srt import runtime_context
    from sglang.srt.layers.attention import triton_backend

    runtime_context.get_spec = lambda: types.SimpleNamespace(speculative_num_draft_tokens=16,
                                                             speculative_algorithm=argv[0])
    sizes = {}
    for role, is_draft_runner in (("target", False), ("drafter", True)):
        mask = triton_backend.maybe_create_verify_mask(
            is_draft_runner=is_draft_runner, skip_prefill=False, max_bs=2, max_context_len=100, num_draft_tokens=16,
            device="cpu", is_read=True, dtype=torch.uint8)
        sizes[role] = None if mask is None else int(mask.buffer.numel())
    return sizes


def cmd_commit_features(_unused: list[str]) -> dict[str, Any]:
    """What DDTreeWorker hands SGLang's draft-KV writer after a round (D = 4, W = 9, two requests), with the writer
    replaced by a recorder: the worker's own commit step, not a copy of it."""
    import torch

    _loaded()
    from ddtree_runtime.sglang.tree_inputs import accepted_first_order, accepted_paths
    from ddtree_runtime.sglang.worker import DDTreeWorker

    worker = object.__new__(DDTreeWorker)  # only block_size and the writer are read
    worker.block_size = 4
    recorded: dict[str, Any] = {}
    worker._append_target_hidden_to_draft_kv_by_loc = lambda **kwargs: recorded.update(kwargs)
    width = 9
    # request 0 accepts nodes 0 -> 3 -> 7 (tau 3), request 1 only its root (tau 1); rows are flat b * W + node
    accept_index = torch.tensor([[0, 3, 7, -1], [9, -1, -1, -1]], dtype=torch.int32)
    paths = accepted_paths(accept_index, torch.tensor([2, 0]), width)
    write_ids = torch.arange(100, 100 + 2 * width).view(2, width)
    hidden = torch.arange(2 * width, dtype=torch.float32)[:, None].expand(-1, 3).contiguous()
    order = accepted_first_order(paths, width)  # as the round computes it once for the target's and drafter's KV
    worker._append_committed_features(hidden, paths, order, write_ids, torch.tensor([10, 20]))
    return {"hidden_rows": recorded["target_hidden"][:, 0].to(torch.long).tolist(),
            "cache_loc_2d": recorded["cache_loc_2d"].tolist(), "positions": recorded["positions"].tolist(),
            "commit_lens": recorded["commit_lens"].tolist()}


def cmd_smoke_request(_unused: list[str]) -> dict[str, Any]:
    """The release smoke request as SGLang's OpenAI layer parses it."""
    import importlib.util

    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    path = Path(__file__).resolve().parents[2] / "roles" / "sglang_release" / "files" / "smoke.py"
    spec = importlib.util.spec_from_file_location("release_smoke", path)
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    request = ChatCompletionRequest(**smoke.request_body("qwen", 48, "Write fizzbuzz."))
    return {"chat_template_kwargs": request.chat_template_kwargs, "temperature": request.temperature,
            "max_tokens": request.max_tokens}


def cmd_greedy_verify(argv: list[str]) -> dict[str, Any]:
    import torch
    from ddtree_runtime.sglang.tree_inputs import accepted_paths, sglang_verify_inputs
    from ddtree_runtime.tree import build_tree_batch
    from ddtree_runtime.verify import follow_greedy
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    seed = int(argv[0])
    generator = torch.Generator().manual_seed(seed)
    batch, depth, vocab, width = 3, 5, 10, 12
    logits = torch.randn(batch, depth, vocab, generator=generator) * 2
    trees = build_tree_batch(logits, [11, 6, 3], max_topk=3)
    roots = torch.randint(0, vocab, (batch,), generator=generator)
    tensors = sglang_verify_inputs(trees, roots, torch.tensor([4, 7, 2]), width=width)
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
            "resolve-spec": cmd_resolve_spec, "handle-changes": cmd_handle_changes, "hooks": cmd_hooks,
            "algorithm-interface": cmd_algorithm_interface, "verify-mask": cmd_verify_mask,
            "commit-features": cmd_commit_features, "smoke-request": cmd_smoke_request,
            "greedy-verify": cmd_greedy_verify, "acceptance-commands": cmd_acceptance_commands,
            "acceptance-tokenizers": cmd_acceptance_tokenizers}


def run_command(command: str, rest: list[str]) -> int:
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # SGLang and plugins may print; keep stdout for the one JSON line
    try:
        result = COMMANDS[command](rest)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    print(json.dumps(result))
    return 0


def exit_code(exc: SystemExit) -> int:
    """What the interpreter would exit with for ``exc`` (argparse exits 2; ``sys.exit("text")`` prints and exits 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def run_in_child(request: dict[str, Any], stdout: BinaryIO, stderr: BinaryIO) -> None:
    """The forked child's whole life: the request's environment and output files, the command, then ``_exit``."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(stdout.fileno(), 1)
    os.dup2(stderr.fileno(), 2)
    try:
        code = run_command(request["command"], list(request["args"]))
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException:  # a child reports every failure as a traceback and exit 1, as python would
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def answer(request: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        pid = os.fork()
        if pid == 0:
            run_in_child(request, stdout, stderr)
        status = os.waitpid(pid, 0)[1]
        stdout.seek(0)
        stderr.seek(0)
        return {"rc": os.waitstatus_to_exitcode(status), "stdout": stdout.read().decode(errors="replace"),
                "stderr": stderr.read().decode(errors="replace")}


def serve() -> int:
    import importlib

    for module in PRELOADED_MODULES:
        importlib.import_module(module)
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # only replies go to the real stdout
    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line))), file=replies, flush=True)
    return 0


def main() -> int:
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "serve":
        return serve()
    if rest[:1] == ["--"]:
        rest = rest[1:]
    return run_command(command, rest)


if __name__ == "__main__":
    sys.exit(main())
