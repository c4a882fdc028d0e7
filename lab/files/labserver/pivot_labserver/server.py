"""HTTP front end of the lab server (stdlib ``ThreadingHTTPServer``), modelled on SGLang's endpoints.

Endpoints: ``/health`` (200 when ready, 503 while loading or draining), ``/health_generate`` (also runs a
1-token generation), ``/server_info`` and the deprecated ``/get_server_info``, ``/model_info``,
``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/generate`` and ``/metrics`` (with
``--enable-metrics``). ``--api-key`` requires ``Authorization: Bearer <key>`` everywhere except the health
endpoints and ``/metrics``, as in SGLang.

Lab-only environment: ``DDTREE_LAB_LOAD_DELAY_S`` (sleep before loading, to observe the 503 phase;
``/etc/pivot-lab/load-delay-s.<ALGORITHM>`` does the same for the servers of one speculative algorithm on a host),
``DDTREE_LAB_DRAIN_TIMEOUT_S`` (how long SIGTERM waits for in-flight requests, default 30),
``DDTREE_LAB_DEFAULT_MAX_TOKENS`` (chat/completions default when ``max_tokens`` is absent, default 256),
``DDTREE_LAB_FORCED_THINKING`` (with a reasoning parser: text every chat answer thinks first, inside ``<think>``, even
when the request turns thinking off, its tokens taken from ``max_tokens``: a model that ignores the template's switch),
``DDTREE_LAB_TORCH_THREADS`` (default 1), and the GPU registry of the lab's nvidia-smi double
(``FAKE_NVIDIA_STATE_DIR``, ``FAKE_NVIDIA_GPU_TOTAL_MIB``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from ddtree_runtime.reference import GenerationResult
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tokenizer import chat_prompt, thinking_suffix

from ddtree_runtime import __version__
from pivot_labserver.cli import parse_args, tree_knobs_from_env
from pivot_labserver.engine import LabEngine

log = logging.getLogger("pivot_labserver")

SGLANG_SURFACE_VERSION = "0.5.23"
"""The SGLang release whose HTTP surface and flags this server mimics (reported as ``version``)."""


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def proc_starttime(pid: int) -> int:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


class GpuRegistration:
    """This process's entry in the lab nvidia-smi double's registry (only when FAKE_NVIDIA_STATE_DIR is set)."""

    def __init__(self, tp_size: int, mem_fraction: float) -> None:
        state = os.environ.get("FAKE_NVIDIA_STATE_DIR")
        self.path = Path(state) / "procs" / f"{os.getpid()}.json" if state else None
        total = int(os.environ.get("FAKE_NVIDIA_GPU_TOTAL_MIB", "97887"))
        self.record = {
            "pid": os.getpid(),
            "starttime": proc_starttime(os.getpid()),
            "name": "python3",
            "gpus": {str(i): int(mem_fraction * total) for i in range(tp_size)},
        }

    def take(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_name(f".{self.path.name}.tmp")
        staging.write_text(json.dumps(self.record) + "\n")
        staging.replace(self.path)

    def release(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _sampling_from(raw: dict[str, Any], eos: frozenset[int], default_max: int) -> SamplingParams:
    try:
        stop_ids = {int(t) for t in raw.get("stop_token_ids") or []}
        if not raw.get("ignore_eos"):
            stop_ids |= eos
        top_k = int(raw.get("top_k") or 0)
        seed = raw.get("sampling_seed", raw.get("seed"))
        temperature = raw.get("temperature")
        return SamplingParams(
            temperature=1.0 if temperature is None else float(temperature),
            top_p=float(raw.get("top_p") or 1.0),
            top_k=max(top_k, 0),
            max_new_tokens=int(raw["max_new_tokens"]) if raw.get("max_new_tokens") is not None else default_max,
            stop_token_ids=frozenset(stop_ids),
            seed=None if seed is None else int(seed),
        )
    except (TypeError, ValueError) as error:
        raise RequestError(400, f"invalid sampling parameters: {error}") from None


def _stop_strings(raw: Any) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        return [s for s in raw if s]
    raise RequestError(400, "stop must be a string or a list of strings")


def split_reasoning(text: str, think_open: bool = False) -> tuple[str | None, str]:
    """Qwen3 reasoning parser: text up to ``</think>`` is reasoning (an opening ``<think>`` is optional). When the
    template opened the think block in the prompt, an unfinished one is all reasoning and the content is empty, as
    SGLang's parser returns it for a thinking model cut off by ``max_tokens``."""
    if "</think>" not in text:
        if think_open:
            return text.replace("<think>", "").strip(), ""
        return None, text.replace("<think>", "")
    reasoning, content = text.split("</think>", 1)
    return reasoning.replace("<think>", "").strip(), content.strip()


LOAD_DELAY_DIR = Path("/etc/pivot-lab")


def load_delay(algorithm: str | None, directory: Path = LOAD_DELAY_DIR) -> float:
    """Seconds to sleep before loading: ``DDTREE_LAB_LOAD_DELAY_S``, or the host's ``load-delay-s.<ALGORITHM>`` file
    (lab-only: a test makes one kind of server as slow to start as a large model, without touching its unit)."""
    from_env = float(os.environ.get("DDTREE_LAB_LOAD_DELAY_S", "0") or 0)
    try:
        from_file = float((directory / f"load-delay-s.{(algorithm or 'NONE').upper()}").read_text().strip() or 0)
    except (OSError, ValueError):
        from_file = 0.0
    return max(from_env, from_file)


class LabServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.engine = LabEngine(args, tree_knobs_from_env())
        self.ready = threading.Event()
        self.draining = threading.Event()
        self.stop = threading.Event()
        self.exit_code = 0
        self.in_flight = 0
        self.in_flight_lock = threading.Lock()
        self.gpu = GpuRegistration(args.tp_size, args.mem_fraction_static)
        self.default_max_tokens = int(os.environ.get("DDTREE_LAB_DEFAULT_MAX_TOKENS", "256"))
        self.served_model_name = args.served_model_name or args.model_path
        self.httpd = ThreadingHTTPServer((args.host, args.port), make_handler(self))
        self.httpd.daemon_threads = True

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    # -- lifecycle ------------------------------------------------------------------------------------

    def load_in_background(self) -> None:
        try:
            log.info("loading model %s", self.args.model_path)
            self.gpu.take()
            delay = load_delay(self.args.speculative_algorithm)
            if delay > 0:
                self.stop.wait(delay)
            self.engine.load()
            self.ready.set()
            log.info("The server is fired up and ready to roll! (listening on %s:%d)", self.args.host, self.port)
        except Exception:
            log.exception("loading failed")
            self.exit_code = 1
            self.stop.set()

    def request_stop(self, signum: int, frame: object) -> None:
        del frame
        log.info("received signal %d: draining", signum)
        self.draining.set()
        self.stop.set()

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        server_thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)
        server_thread.start()
        log.info("HTTP server listening on %s:%d", self.args.host, self.port)
        threading.Thread(target=self.load_in_background, name="load", daemon=True).start()
        try:
            while not self.stop.wait(0.2):
                pass
            self.draining.set()
            self._drain(float(os.environ.get("DDTREE_LAB_DRAIN_TIMEOUT_S", "30")))
        finally:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.gpu.release()
        log.info("exited with code %d", self.exit_code)
        return self.exit_code

    def _drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.in_flight_lock:
                if self.in_flight == 0:
                    return
            time.sleep(0.05)
        log.warning("drain timeout: exiting with requests in flight")

    def track(self, delta: int) -> None:
        with self.in_flight_lock:
            self.in_flight += delta

    # -- responses ------------------------------------------------------------------------------------

    def server_info(self) -> dict[str, Any]:
        plan = self.engine.plan
        info: dict[str, Any] = {k: v for k, v in vars(self.args).items() if k != "api_key"}
        assert plan is not None
        info.update(
            {
                "version": os.environ.get("DDTREE_LAB_SGLANG_VERSION", SGLANG_SURFACE_VERSION),
                "ddtree_runtime_version": __version__,
                "lab_mode": True,
                "served_model_name": self.served_model_name,
                "speculative_algorithm": plan.reported_algorithm,
                "speculative_num_draft_tokens": plan.reported_num_draft_tokens,
                "ddtree_budget": plan.budget if plan.method == "ddtree" else None,
                "ddtree_topk": plan.topk if plan.method == "ddtree" else None,
                "decoder": plan.method,
                "resolved_model_dir": str(self.engine.target_dir),
                "resolved_draft_model_dir": str(self.engine.drafter_dir) if self.engine.drafter_dir else None,
                "internal_states": [self.internal_state()],
            }
        )
        return info

    def internal_state(self) -> dict[str, Any]:
        counters = self.engine.counters
        state: dict[str, Any] = {
            "last_gen_throughput": counters.last_throughput,
            "num_running_reqs": counters.running,
        }
        if self.engine.plan is not None and self.engine.plan.speculative:
            state["avg_spec_accept_length"] = counters.avg_accept_length
        return state

    def metrics(self) -> str:
        c = self.engine.counters
        plan = self.engine.plan
        label = json.dumps(self.served_model_name)
        rows = [
            ("sglang:num_running_reqs", "gauge", "Running requests.", c.running),
            ("sglang:gen_throughput", "gauge", "Last generation throughput (token/s).", c.last_throughput),
            ("sglang:num_requests_total", "counter", "Finished requests.", c.requests),
            ("sglang:prompt_tokens_total", "counter", "Prompt tokens.", c.prompt_tokens),
            ("sglang:generation_tokens_total", "counter", "Generated tokens.", c.generation_tokens),
        ]
        if plan is not None and plan.speculative:
            draft = plan.reported_num_draft_tokens or 1
            rate = (c.avg_accept_length - 1) / (draft - 1) if draft > 1 and c.verify_rounds else 0.0
            rows += [
                ("sglang:spec_accept_length", "gauge", "Accepted tokens incl. bonus per verify.", c.avg_accept_length),
                ("sglang:spec_accept_rate", "gauge", "Accepted drafts / (num_draft_tokens - 1).", rate),
                ("sglang:spec_verify_calls_total", "counter", "Verify forward passes.", c.verify_rounds),
                ("sglang:spec_num_draft_tokens", "gauge", "Configured draft tokens.", draft),
            ]
        lines = []
        for name, kind, help_text, value in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{model_name={label}}} {value}"]
        return "\n".join(lines) + "\n"

    def run_generation(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        if not prompt_ids:
            raise RequestError(400, "the prompt is empty")
        if any(not 0 <= t < self.engine.vocab_size for t in prompt_ids):
            raise RequestError(400, f"input_ids must be in [0, {self.engine.vocab_size})")
        limit = self.args.context_length
        if limit is not None and len(prompt_ids) + params.max_new_tokens > limit:
            raise RequestError(400, f"prompt ({len(prompt_ids)}) + max_new_tokens exceeds context length {limit}")
        return self.engine.generate(prompt_ids, params)

    def finish_text(self, result: GenerationResult, stops: list[str]) -> tuple[str, dict[str, Any]]:
        """Decoded text (stop strings applied) and SGLang's ``finish_reason`` object."""
        text = self.engine.tokenizer.decode(result.tokens)
        for stop in stops:
            index = text.find(stop)
            if index >= 0:
                return text[:index], {"type": "stop", "matched": stop}
        if result.finish_reason == "stop":
            return text, {"type": "stop", "matched": result.matched_stop}
        return text, {"type": "length", "length": len(result.tokens)}

    def spec_meta(self, result: GenerationResult) -> dict[str, Any]:
        if self.engine.plan is None or not self.engine.plan.speculative:
            return {}
        stats = result.stats
        return {
            "spec_verify_ct": stats.rounds,
            "spec_accept_length": stats.tau,
            "spec_num_correct_drafts": stats.num_correct_drafts,
            "spec_acceptance_lengths": list(stats.acceptance_lengths),
        }

    def generate_native(self, body: dict[str, Any]) -> Any:
        raw_params = body.get("sampling_params") or {}
        if not isinstance(raw_params, dict):
            raise RequestError(400, "sampling_params must be an object")
        if "input_ids" in body and body["input_ids"] is not None:
            prompts = body["input_ids"]
            batched = bool(prompts) and isinstance(prompts[0], list)
            id_lists = prompts if batched else [prompts]
        elif isinstance(body.get("text"), (str, list)):
            texts = body["text"]
            batched = isinstance(texts, list)
            id_lists = [self.engine.tokenizer.encode(t) for t in (texts if batched else [texts])]
        else:
            raise RequestError(400, "need text or input_ids")
        outputs = [self._generate_one(ids, raw_params) for ids in id_lists]
        return outputs if batched else outputs[0]

    def _generate_one(self, prompt_ids: Any, raw_params: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(prompt_ids, list) or not all(isinstance(t, int) for t in prompt_ids):
            raise RequestError(400, "input_ids must be a list of integers")
        params = _sampling_from(raw_params, self.engine.eos_token_ids, 128)
        begin = time.perf_counter()
        result = self.run_generation(prompt_ids, params)
        text, finish = self.finish_text(result, _stop_strings(raw_params.get("stop")))
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(result.tokens),
            "cached_tokens": 0,
            "e2e_latency": time.perf_counter() - begin,
            **self.spec_meta(result),
        }
        return {"text": text, "output_ids": result.tokens, "meta_info": meta}

    def _openai_sampling(self, body: dict[str, Any]) -> SamplingParams:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        raw = {
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "top_k": body.get("top_k"),
            "max_new_tokens": max_tokens,
            "stop_token_ids": body.get("stop_token_ids"),
            "ignore_eos": body.get("ignore_eos"),
            "seed": body.get("seed"),
        }
        return _sampling_from(raw, self.engine.eos_token_ids, self.default_max_tokens)

    def _openai_common(self, result: GenerationResult, prompt_len: int, kind: str) -> dict[str, Any]:
        response: dict[str, Any] = {
            "id": f"{kind}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self.served_model_name,
            "usage": {
                "prompt_tokens": prompt_len,
                "completion_tokens": len(result.tokens),
                "total_tokens": prompt_len + len(result.tokens),
            },
        }
        spec = self.spec_meta(result)
        if spec:
            response["meta_info"] = spec
        return response

    def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError(400, "messages must be a non-empty list of objects")
        thinking = self._thinking(body)
        prompt = chat_prompt(messages) + (thinking_suffix(thinking) if self.args.reasoning_parser else "")
        prompt_ids = self.engine.tokenizer.encode(prompt)
        forced = os.environ.get("DDTREE_LAB_FORCED_THINKING", "") if self.args.reasoning_parser else ""
        params = self._openai_sampling(body)
        if forced:
            spent = len(self.engine.tokenizer.encode(forced))
            params = dataclasses.replace(params, max_new_tokens=max(1, params.max_new_tokens - spent))
        result = self.run_generation(prompt_ids, params)
        text, finish = self.finish_text(result, _stop_strings(body.get("stop")))
        if forced:
            text = f"<think>{forced}</think>{text}"
        reasoning = None
        if self.args.reasoning_parser:
            reasoning, text = split_reasoning(text, think_open=thinking)
        response = self._openai_common(result, len(prompt_ids), "chatcmpl")
        response["object"] = "chat.completion"
        message = {"role": "assistant", "content": text, "reasoning_content": reasoning, "tool_calls": None}
        response["choices"] = [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish["type"],
                "matched_stop": finish.get("matched"),
            }
        ]
        if body.get("return_spec_tokens_details"):
            response["sglext"] = {"spec_tokens_details": self.spec_meta(result)}
        return response

    @staticmethod
    def _thinking(body: dict[str, Any]) -> bool:
        """Served with a reasoning parser, the lab model's template thinks unless the request turns it off."""
        kwargs = body.get("chat_template_kwargs")
        return not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = self.engine.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = prompt
        else:
            raise RequestError(400, "prompt must be a string or a list of token ids")
        result = self.run_generation(prompt_ids, self._openai_sampling(body))
        text, finish = self.finish_text(result, _stop_strings(body.get("stop")))
        response = self._openai_common(result, len(prompt_ids), "cmpl")
        response["object"] = "text_completion"
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish["type"]}
        response["choices"] = [{**choice, "matched_stop": finish.get("matched")}]
        return response

    def models(self) -> dict[str, Any]:
        entry = {
            "id": self.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.args.model_path,
            "max_model_len": self.args.context_length,
        }
        return {"object": "list", "data": [entry]}

    def health_generate(self) -> bool:
        params = SamplingParams(temperature=0.0, max_new_tokens=1)
        return len(self.engine.generate([0], params).tokens) == 1


OPEN_PATHS = frozenset({"/health", "/health_generate", "/metrics"})


def make_handler(server: LabServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def send_body(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def send_json(self, status: int, payload: Any) -> None:
            self.send_body(status, json.dumps(payload).encode(), "application/json")

        def send_error_json(self, status: int, message: str) -> None:
            self.send_json(status, {"object": "error", "message": message, "type": "BadRequestError", "code": status})

        def authorized(self, path: str) -> bool:
            key = server.args.api_key
            if not key or path in OPEN_PATHS or self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self.send_json(401, {"error": "Unauthorized"})
            return False

        def path_only(self) -> str:
            return self.path.split("?", 1)[0]

        def do_GET(self) -> None:
            path = self.path_only()
            if not self.authorized(path):
                return
            routes: dict[str, Callable[[], None]] = {
                "/health": self.health,
                "/health_generate": self.health_generate,
                "/metrics": self.metrics,
                "/server_info": lambda: self.when_ready(server.server_info),
                "/get_server_info": lambda: self.when_ready(server.server_info),
                "/v1/models": lambda: self.when_ready(server.models),
                "/model_info": lambda: self.when_ready(self.model_info),
                "/get_model_info": lambda: self.when_ready(self.model_info),
            }
            route = routes.get(path)
            if route is None:
                self.send_error_json(404, f"no route {path}")
            else:
                route()

        def model_info(self) -> dict[str, Any]:
            path = server.args.model_path
            return {"model_path": path, "is_generation": True, "tokenizer_path": server.args.tokenizer_path or path}

        def serving(self) -> bool:
            return server.ready.is_set() and not server.draining.is_set()

        def health(self) -> None:
            self.send_body(200 if self.serving() else 503, b"", "text/plain")

        def health_generate(self) -> None:
            if not self.serving():
                self.send_body(503, b"", "text/plain")
                return
            ok = server.health_generate()
            self.send_body(200 if ok else 503, b"", "text/plain")

        def metrics(self) -> None:
            if not server.args.enable_metrics:
                self.send_error_json(404, "metrics are disabled (start with --enable-metrics)")
            elif not server.ready.is_set():
                self.send_error_json(503, "the server is loading")
            else:
                self.send_body(200, server.metrics().encode(), "text/plain; version=0.0.4")

        def when_ready(self, build: Callable[[], Any]) -> None:
            if not server.ready.is_set():
                self.send_error_json(503, "the server is loading")
            else:
                self.send_json(200, build())

        def do_POST(self) -> None:
            path = self.path_only()
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self.authorized(path):
                return
            routes: dict[str, Callable[[dict[str, Any]], Any]] = {
                "/v1/chat/completions": server.chat_completion,
                "/v1/completions": server.completion,
                "/generate": server.generate_native,
            }
            route = routes.get(path)
            if route is None:
                self.send_error_json(404, f"no route {path}")
                return
            if not self.serving():
                self.send_error_json(503, "the server is not ready")
                return
            server.track(+1)
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise RequestError(400, "the request body must be a JSON object")
                if body.get("stream"):
                    self.stream(route(body))
                else:
                    self.send_json(200, route(body))
            except json.JSONDecodeError as error:
                self.send_error_json(400, f"invalid JSON: {error}")
            except RequestError as error:
                self.send_error_json(error.status, str(error))
            except Exception as error:
                log.exception("request failed")
                self.send_error_json(500, f"internal error: {error}")
            finally:
                server.track(-1)

        def stream(self, response: dict[str, Any]) -> None:
            """Server-sent events: the whole completion as one chunk (the lab engine is not incremental)."""
            chunk = dict(response)
            choices = []
            for choice in response.get("choices", []):
                if "message" in choice:
                    delta = {k: v for k, v in choice["message"].items() if v is not None}
                    finish = choice["finish_reason"]
                    choices.append({"index": choice["index"], "delta": delta, "finish_reason": finish})
                else:
                    choices.append(choice)
            chunk["choices"] = choices
            if chunk.get("object") == "chat.completion":
                chunk["object"] = "chat.completion.chunk"
            body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            self.send_body(200, body, "text/event-stream")

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s"
    )
    torch.set_num_threads(int(os.environ.get("DDTREE_LAB_TORCH_THREADS", "1")))
    server = LabServer(args)
    return server.serve()
