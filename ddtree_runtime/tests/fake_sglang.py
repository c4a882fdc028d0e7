"""A stand-in for ``python -m sglang.launch_server`` that tests the acceptance suite's own harness on CPU.

The tests install it as the module ``sglang.launch_server`` of a package directory on ``PYTHONPATH``, so the suite
runs its real command line ``python -m sglang.launch_server ARGS`` against it. It says nothing about SGLang: it
answers the few HTTP endpoints the suite uses, deterministically, so the suite's process handling, comparisons,
verdicts and reports can be tested without a GPU. Behaviour (environment):

- ``FAKE_SGLANG_MODE``: ``serve`` (default), ``crash`` (exits 3 before serving), ``refuse`` (prints
  ``FAKE_SGLANG_MESSAGE`` and exits 1);
- ``FAKE_SGLANG_DIVERGE``: an algorithm name whose greedy output differs from the baseline's on the first prompt
  (``logprobs``: the baseline's own answer there differs when logprobs are asked for, as SGLang's did in bf16);
- ``FAKE_SGLANG_CHILD_PID_FILE``: serve mode starts a child in its session and writes its PID there (the suite
  must stop it with the server);
- ``FAKE_SGLANG_EOS_AFTER``: greedy requests without ``ignore_eos`` end after this many tokens, as if the model had
  emitted its EOS there (``ignore_eos`` decodes to ``max_new_tokens``, as in SGLang);
- ``FAKE_SGLANG_FAIL_BATCH`` / ``FAKE_SGLANG_FAIL_MAX_NEW_TOKENS``: a ``/generate`` call with this many prompts / this
  ``max_new_tokens`` is answered with HTTP 500;
- ``FAKE_SGLANG_NO_TRACE``: ``/start_profile`` is accepted but no trace is ever written.

``/start_profile`` writes, half a second later, ``<output_dir>/<profile_id>-TP-0.trace.json.gz``: ``num_steps`` rounds
of a draft CUDA graph, an eager kernel and a verify graph (a DDTREE server inside its ``ddtree.<stage>`` ranges), with
idle gaps, the layout :mod:`ddtree_runtime.acceptance.round_trace` reads.

The tokenizer, as SGLang 0.5.23 handles it: without ``--skip-tokenizer-init`` the server loads the model's tokenizer
at start and exits 1 when the model directory has none (no ``tokenizer.json``; for a multimodal config, one with
``vision_config``, no ``preprocessor_config.json``: the first GPU run's hybrid failure), and answers carry ``text``;
it then honours stop strings (a one-character string stops after that byte) and the regex ``[a-z ]+`` (greedy tokens
mapped into it). With ``--skip-tokenizer-init`` it loads none and answers a request with a stop string or a grammar
with HTTP 400 and SGLang's messages.

Every ``/generate`` call takes time like a server decoding: :func:`round_seconds` per decode round of its longest
answer (a token for the baseline, a verify round of ``ceil(tokens / ACCEPT)`` for the speculative algorithms, whose
rounds cost more with a larger DDTREE budget). ``meta_info`` carries ``completion_tokens`` and, on speculative
servers, ``spec_verify_ct``, as SGLang's does.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ACCEPT = {None: 1, "DFLASH": 2, "DDTREE": 3}
GRAMMAR = "[a-z ]+"
"""The one regex the stand-in honours (the suite's grammar request)."""


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return None if value is None else int(value)


def round_seconds(algorithm: str | None, budget: int) -> float:
    """Seconds one decode round takes: 1 ms a baseline token, 2 ms a DFLASH round, more with a DDTREE budget."""
    if algorithm is None:
        return 0.001
    return 0.002 + (0.00002 * budget if algorithm == "DDTREE" else 0.0)


def decode_rounds(tokens: int, algorithm: str | None) -> int:
    return -(-tokens // ACCEPT[algorithm])


def tokenizer_problem(argv: list[str]) -> str | None:
    """What SGLang's start fails with when it must load the model's tokenizer (and processor) and cannot."""
    if "--skip-tokenizer-init" in argv:
        return None
    model = Path(flag(argv, "--model-path") or ".")
    config = json.loads((model / "config.json").read_text()) if (model / "config.json").is_file() else {}
    if "vision_config" in config and not (model / "preprocessor_config.json").is_file():
        return (f"OSError: Can't load image processor for '{model}'. ... make sure '{model}' is the correct path to a "
                "directory containing a preprocessor_config.json file")
    if not (model / "tokenizer.json").is_file():
        return f"OSError: Can't load tokenizer for '{model}': no tokenizer.json"
    return None


def request_problem(params: dict[str, Any], tokenizer: bool) -> str | None:
    """SGLang's per-request refusals without a tokenizer (HTTP 400), and what the stand-in cannot do."""
    if params.get("stop") and not tokenizer:
        return (f"stop={params['stop']!r} is unavailable when skip_tokenizer_init=True (requires tokenizer to decode "
                "tokens to text for matching).")
    if params.get("regex") is not None:
        if not tokenizer:
            return ("Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported when the "
                    "server is launched with --grammar-backend none")
        if params["regex"] != GRAMMAR:
            return f"the stand-in honours only the regex {GRAMMAR!r}"
    return None


def greedy(ids: list[int], count: int, stop: set[int], diverge: bool, grammar: bool = False) -> list[int]:
    out = []
    for i in range(count):
        token = (sum(ids) * 7 + i * 13) % 256
        if grammar:
            token = ord(" ") if token % 27 == 26 else ord("a") + token % 27
        out.append(token)
        if token in stop:
            break
    if diverge and out:
        out[-1] = (out[-1] + 1) % 256
    return out


def answer(body: dict[str, Any], algorithm: str | None, rng: random.Random, tokenizer: bool) -> list[dict[str, Any]]:
    params = body.get("sampling_params", {})
    count = int(params.get("max_new_tokens", 16))
    ignore_eos = bool(params.get("ignore_eos", False))
    stop = set() if ignore_eos else set(params.get("stop_token_ids") or [])
    stop |= {ord(text) for text in params.get("stop") or [] if len(text) == 1 and ord(text) < 128}
    grammar = params.get("regex") == GRAMMAR
    eos_after = None if ignore_eos else env_int("FAKE_SGLANG_EOS_AFTER")
    answers = []
    for index, ids in enumerate(body["input_ids"]):
        if float(params.get("temperature", 0.0)) > 0:
            tokens = [rng.choices(range(10), weights=range(1, 11))[0] for _unused in range(count)]
        else:
            chosen = os.environ.get("FAKE_SGLANG_DIVERGE")
            diverge = index == 0 and ((algorithm is not None and chosen == algorithm)
                                      or (chosen == "logprobs" and algorithm is None and body.get("return_logprob")))
            tokens = greedy(ids, count if eos_after is None else min(count, eos_after), stop, diverge, grammar)
        meta: dict[str, Any] = {"completion_tokens": len(tokens)}
        if algorithm is not None:
            meta["spec_verify_ct"] = decode_rounds(len(tokens), algorithm)
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[-0.25, token, None] for token in tokens]
            if body.get("top_logprobs_num"):
                gap = float(os.environ.get("FAKE_SGLANG_TOP2_GAP", "0.2"))  # default: every position a near-tie
                meta["output_top_logprobs"] = [[[-0.25, token, None], [-0.25 - gap, (token + 1) % 256, None]]
                                               for token in tokens]
        one: dict[str, Any] = {"output_ids": tokens, "meta_info": meta}
        if tokenizer:
            one["text"] = bytes(t for t in tokens if t < 256).decode(errors="replace")
        answers.append(one)
    return answers


def refusal(body: dict[str, Any]) -> str | None:
    """Why ``FAKE_SGLANG_FAIL_*`` makes this ``/generate`` call fail, or None."""
    prompts = len(body["input_ids"])
    new_tokens = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
    if prompts == env_int("FAKE_SGLANG_FAIL_BATCH"):
        return f"a batch of {prompts} prompts failed"
    if new_tokens == env_int("FAKE_SGLANG_FAIL_MAX_NEW_TOKENS"):
        return f"a request for {new_tokens} new tokens failed"
    return None


def write_trace(path: Path, algorithm: str | None, rounds: int) -> None:
    """A torch-profiler trace of ``rounds`` decode rounds: 1000 us each, 850 us of GPU work (see the module doc)."""
    events: list[dict[str, Any]] = []
    for r in range(rounds):
        base, c = 1000.0 * r, 10 * r
        parts = (("draft", 5, 10, 300, "cudaGraphLaunch"), ("topk", 45, 310, 100, "cudaLaunchKernel"),
                 ("verify", 65, 450, 400, "cudaGraphLaunch"), ("commit", 95, 900, 50, "cudaLaunchKernel"))
        for index, (stage, launch_at, start, duration, call) in enumerate(parts):
            if algorithm == "DDTREE":
                events.append({"ph": "X", "cat": "user_annotation", "name": f"ddtree.{stage}",
                               "ts": base + launch_at - 2, "dur": 5, "tid": 1})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": call, "ts": base + launch_at, "dur": 2, "tid": 1,
                           "args": {"correlation": c + index}})
            events.append({"ph": "X", "cat": "kernel", "name": f"{stage}_kernel", "ts": base + start,
                           "dur": duration, "tid": 7, "args": {"correlation": c + index}})
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)


def serve(argv: list[str]) -> None:
    algorithm = flag(argv, "--speculative-algorithm")
    tokenizer = "--skip-tokenizer-init" not in argv
    rng = random.Random(0)
    width = 1
    budget = int(os.environ.get("DDTREE_BUDGET", "15")) if algorithm == "DDTREE" else 0
    if algorithm == "DDTREE":
        width = budget + 1
        print(f"DDTree worker: draft length 16, budget {width - 1}, top-k cap None, verify width {width}, tree "
              "builder ddtree_runtime.ops (compiled CUDA kernels)")
    elif algorithm == "DFLASH":
        width = 16
    if "--disable-cuda-graph" not in argv:
        print(f"Capture target decode CUDA graph begin. backend=full, num_tokens_per_req={width}, avail mem=1 GB")
        print("Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16], elapsed=0.1 s")
    sys.stdout.flush()
    pid_file = os.environ.get("FAKE_SGLANG_CHILD_PID_FILE")
    if pid_file:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(pid_file, "w") as handle:
            handle.write(str(child.pid))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health_generate":
                self.reply(200, {})
            elif self.path == "/server_info":
                self.reply(200, {"speculative_algorithm": algorithm, "attention_backend": "triton",
                                 "speculative_num_draft_tokens": 16 if algorithm else None})
            else:
                self.reply(404, {"error": self.path})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/start_profile":
                if not os.environ.get("FAKE_SGLANG_NO_TRACE"):
                    path = Path(body["output_dir"]) / f"{body.get('profile_id', 'trace')}-TP-0.trace.json.gz"
                    threading.Timer(0.5, write_trace, (path, algorithm, int(body["num_steps"]))).start()
                self.reply(200, "Start profiling.")
                return
            problem = refusal(body)
            if problem is not None:
                self.reply(500, {"error": {"message": problem}})
                return
            problem = request_problem(body.get("sampling_params", {}), tokenizer)
            if problem is not None:
                self.reply(400, {"error": {"message": problem}})
                return
            answers = answer(body, algorithm, rng, tokenizer)
            rounds = max(decode_rounds(a["meta_info"]["completion_tokens"], algorithm) for a in answers)
            time.sleep(rounds * round_seconds(algorithm, budget))
            self.reply(200, answers)

    class Server(ThreadingHTTPServer):
        request_queue_size = 64  # the load case opens 16 connections at once (socketserver's default backlog is 5)

    server = Server(("127.0.0.1", int(flag(argv, "--port") or 0)), Handler)
    server.serve_forever()


def main() -> None:
    argv = sys.argv[1:]
    mode = os.environ.get("FAKE_SGLANG_MODE", "serve")
    if mode == "crash":
        print("Scheduler hit an exception: boom")
        sys.exit(3)
    if mode == "refuse":
        time.sleep(0.2)
        print(os.environ.get("FAKE_SGLANG_MESSAGE", "refused"))
        sys.exit(1)
    problem = tokenizer_problem(argv)
    if problem is not None:
        print(problem)
        sys.exit(1)
    serve(argv)


if __name__ == "__main__":
    main()
