"""Self-check of an installed ddtree_runtime: ``python -m ddtree_runtime.check [--json] [--require-sglang-plugin]
[--require-gpu] [--require-cuda-extension]``.

Run on the serving host before the service is switched (the Ansible role does). Each check reports
``{name, ok, detail}``; the command exits 0 when all are ok and 1 otherwise:

- ``torch``: the torch the package runs on;
- ``gpu``: the GPU torch sees, with its compute capability (a host without one passes, saying so, unless
  ``--require-gpu``: then torch's own reason for seeing none, e.g. a driver older than its CUDA, fails the check);
- ``cuda_extension``: whether the compiled kernels are present (else the PyTorch path is used) and, on a GPU,
  that they equal the PyTorch reference on a random case (`ops.compare_with_reference`); with
  ``--require-cuda-extension`` kernels that did not load, or have no GPU to run on, fail it;
- ``tree``: a best-first tree from random drafter logits has the structure DDTree guarantees;
- ``ddtree_decode``: a short greedy DDTree decode with small random models equals autoregressive decoding, on
  the GPU when there is one;
- ``sglang_plugin``: SGLang in this environment resolves ``DDTREE`` through the plugin entry point and its worker
  class imports (required with
  ``--require-sglang-plugin``; otherwise reported when SGLang is installed);
- ``sglang_server``: with SGLang and a GPU at least half free, a short real start of stock ``sglang.launch_server``
  with ``--speculative-algorithm DDTREE`` on a small random pair, one greedy request, stopped by PID
  (:mod:`ddtree_runtime.acceptance.smoke`; ``--no-server-start`` skips it; a GPU a server holds, or no GPU at all, is
  reported as skipped).

A check that did not run here (nothing to run it on, and not required) is printed as ``skipped <name>: <why>``
(``"skipped": true`` in the JSON), never as ``ok``.

The release venv's role passes ``--require-gpu`` on a host where ``nvidia-smi`` lists GPUs and
``--require-cuda-extension`` when it built the extension: a venv whose torch cannot reach the host's GPUs would
otherwise pass every check on the CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ddtree_runtime import __version__


@dataclass
class Check:
    """One check's outcome. ``skipped``: it did not run here (what it needs is missing and not required); it does not
    fail the self-check, and it is printed as ``skipped``, never as ``ok``."""

    name: str
    ok: bool
    detail: str
    skipped: bool = False


def skipped(name: str, why: str) -> Check:
    return Check(name, True, why, skipped=True)


def check_torch() -> Check:
    return Check("torch", True, f"torch {torch.__version__}, ddtree_runtime {__version__}")


def best_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def why_no_gpu() -> str:
    """torch's own reason for seeing no GPU (``is_available`` only says False): a CPU build, no driver, a driver
    older than torch's CUDA, ``CUDA_VISIBLE_DEVICES`` hiding them."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    try:
        torch.cuda.init()
    except Exception as error:  # torch raises RuntimeError or AssertionError, with the driver's reason
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}): {str(error).strip().splitlines()[0]}"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no device"


def check_gpu(required: bool = False) -> Check:
    if not torch.cuda.is_available():
        if required:
            return Check("gpu", False, f"no GPU visible to torch, but one is required here: {why_no_gpu()}")
        return Check("gpu", True, "no GPU visible to torch: CPU only")
    names = []
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        names.append(f"{index}: {torch.cuda.get_device_name(index)} (sm_{major}{minor})")
    return Check("gpu", True, "; ".join(names))


def check_cuda_extension(required: bool = False) -> Check:
    if importlib.util.find_spec("ddtree_runtime.ops") is None:
        why = "not part of this build: the PyTorch path is used"
        return Check("cuda_extension", False, why) if required else skipped("cuda_extension", why)
    from ddtree_runtime import ops  # noqa: PLC0415 - optional module

    if not ops.extension_available():
        why = f"not built: PyTorch path ({ops.extension_error()})"
        return Check("cuda_extension", False, why) if required else skipped("cuda_extension", why)
    if not torch.cuda.is_available():
        why = "compiled kernels loaded; no GPU to run them on"
        return Check("cuda_extension", False, why) if required else skipped("cuda_extension", why)
    problems = ops.compare_with_reference(torch.device("cuda"))
    if problems:
        return Check("cuda_extension", False, "kernels differ from the PyTorch reference: " + "; ".join(problems))
    major, minor = torch.cuda.get_device_capability()
    return Check("cuda_extension", True, f"compiled kernels equal the reference on a random case on "
                 f"{torch.cuda.get_device_name()} (sm_{major}{minor})")


def check_tree() -> Check:
    from ddtree_runtime.tree import build_tree  # noqa: PLC0415

    generator = torch.Generator().manual_seed(0)
    depth, vocab, budget = 15, 1000, 64
    tree = build_tree(torch.randn(depth, vocab, generator=generator), budget)
    parents = tree.parents.tolist()
    depths = tree.depths.tolist()
    problems = []
    if len(depths) != budget:
        problems.append(f"{len(depths)} nodes instead of {budget}")
    if parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents[1:], start=1)):
        problems.append("a parent does not precede its child")
    rows = tree.visibility.sum(dim=1).tolist()
    if rows != [1] + [d + 1 for d in depths]:
        problems.append("visibility rows do not match depths")
    if problems:
        return Check("tree", False, "; ".join(problems))
    return Check("tree", True, f"budget {budget} over {depth}x{vocab} logits: valid tree, max depth {max(depths)}")


def check_ddtree_decode() -> Check:
    from ddtree_runtime.reference.tiny import tiny_decoder, tiny_pair  # noqa: PLC0415
    from ddtree_runtime.sampling import SamplingParams  # noqa: PLC0415

    device = best_device()
    target, drafter = tiny_pair(vocab=64, seed=1)
    decoder = tiny_decoder(target.to(device), drafter.to(device))
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    prompt = [3, 17, 5, 9, 30, 2]
    reference = decoder.generate(prompt, params, "ar").tokens
    tree = decoder.generate(prompt, params, "ddtree", draft_tokens=16, budget=32).tokens
    if tree != reference:
        return Check("ddtree_decode", False, f"on {device}: DDTree {tree} != autoregressive {reference}")
    return Check("ddtree_decode", True, f"on {device}: greedy DDTree == autoregressive over {len(tree)} tokens")


def check_sglang_plugin(required: bool) -> Check | None:
    if importlib.util.find_spec("sglang") is None:
        if required:
            return Check("sglang_plugin", False, "SGLang is not installed in this environment")
        return None
    from importlib.metadata import version  # noqa: PLC0415

    from ddtree_runtime.sglang import registration_error  # noqa: PLC0415

    try:
        from sglang.srt.plugins import load_plugins  # noqa: PLC0415
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: PLC0415

        load_plugins()
        algorithm = SpeculativeAlgorithm.from_string("DDTREE")
        # The worker class is imported only in scheduler processes; import it here so a broken one shows now.
        worker = algorithm.factory(None)
    except Exception as error:
        refusal = registration_error()
        why = f" (plugin refused: {refusal})" if refusal is not None and str(refusal) not in str(error) else ""
        return Check("sglang_plugin", False,
                     f"SGLang does not resolve DDTREE: {type(error).__name__}: {error}{why}")
    return Check("sglang_plugin", True,
                 f"SGLang {version('sglang')} resolves DDTREE to {algorithm!r}, worker {worker.__qualname__}")


SERVER_START_MIN_FREE = 0.5
"""Share of the GPU's memory that must be free for the real server start (it takes a quarter: the suite's
``--mem-fraction-static``); a GPU a running server holds is left alone."""


def check_sglang_server(python: str = sys.executable) -> Check | None:
    """A short real ``--speculative-algorithm DDTREE`` start, when SGLang and a free GPU are here."""
    if importlib.util.find_spec("sglang") is None:
        return None
    if not torch.cuda.is_available():
        return skipped("sglang_server", "no GPU visible to torch")
    free, total = torch.cuda.mem_get_info()
    if free < SERVER_START_MIN_FREE * total:
        return skipped("sglang_server", f"the GPU has {free / 2**30:.1f} of {total / 2**30:.1f} GiB free (a server "
                       "holds it); run the check again once the GPU is free")
    from ddtree_runtime.acceptance.smoke import ddtree_start  # noqa: PLC0415 - starts SGLang

    result = ddtree_start(python)
    return Check("sglang_server", result.ok, result.detail)


def run_checks(require_sglang_plugin: bool, server_start: bool = True, require_gpu: bool = False,
               require_cuda_extension: bool = False) -> list[Check]:
    checks: list[tuple[str, Callable[[], Check | None]]] = [
        ("torch", check_torch),
        ("gpu", lambda: check_gpu(require_gpu)),
        ("cuda_extension", lambda: check_cuda_extension(require_cuda_extension)),
        ("tree", check_tree),
        ("ddtree_decode", check_ddtree_decode),
        ("sglang_plugin", lambda: check_sglang_plugin(require_sglang_plugin)),
    ]
    if server_start:
        checks.append(("sglang_server", check_sglang_server))
    results = []
    for name, run in checks:
        try:
            result = run()
        except Exception as error:
            result = Check(name, False, f"{type(error).__name__}: {error}")
        if result is not None:
            results.append(result)
    return results


def status_word(result: Check) -> str:
    if result.skipped:
        return "skipped"
    return "ok" if result.ok else "FAIL"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree_runtime.check", description="Self-check of ddtree_runtime.")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    parser.add_argument("--require-sglang-plugin", action="store_true", help="fail unless SGLang resolves DDTREE")
    parser.add_argument("--require-gpu", action="store_true",
                        help="fail unless torch sees a GPU (on a host whose nvidia-smi lists GPUs)")
    parser.add_argument("--require-cuda-extension", action="store_true",
                        help="fail unless the compiled kernels load and equal the reference on a GPU")
    parser.add_argument("--no-server-start", action="store_true",
                        help="skip the short real DDTREE server start (run when SGLang and a free GPU are here)")
    options = parser.parse_args(argv)
    results = run_checks(options.require_sglang_plugin, server_start=not options.no_server_start,
                         require_gpu=options.require_gpu, require_cuda_extension=options.require_cuda_extension)
    ok = all(result.ok for result in results)
    if options.json:
        print(json.dumps({"ok": ok, "checks": [asdict(result) for result in results]}))
    else:
        for result in results:
            print(f"{status_word(result)} {result.name}: {result.detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
