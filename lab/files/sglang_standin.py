"""Stand-in for the SGLang server a user runs today (lab only, test double).

The lab's serving host has no GPU and no SGLang, yet its pre-existing NEXTN unit must behave
like one: accept SGLang's command line, take GPU memory on the fake `nvidia-smi` while it runs,
answer the HTTP endpoints operators and Pivot poll, and free the memory when it stops. It does no
decoding; `/v1/chat/completions` answers with a fixed text. The real reference engine
(`ddtree_runtime.labserver`) replaces it for the releases Pivot renders.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = "0.5.11"


def parse_args(argv: list[str]) -> argparse.Namespace:
    # SGLang uses argparse with prefix abbreviations allowed (`--speculative-algo` works).
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=0.88)
    p.add_argument("--context-length", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--mamba-full-memory-ratio", type=float)
    p.add_argument("--mamba-scheduler-strategy")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--served-model-name")
    p.add_argument("--api-key")
    p.add_argument("--load-seconds", type=float, default=1.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def proc_starttime(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


class GpuHold:
    """Registers this process with the lab's nvidia-smi double (see lab/files/fake_gpu.py)."""

    def __init__(self, tp_size: int, fraction: float) -> None:
        state = Path(os.environ.get("FAKE_NVIDIA_STATE_DIR", "/run/fake-nvidia"))
        total = int(os.environ.get("FAKE_NVIDIA_GPU_TOTAL_MIB", "97887"))
        self.path = state / "procs" / f"{os.getpid()}.json"
        self.record = {
            "pid": os.getpid(),
            "starttime": proc_starttime(os.getpid()),
            "name": "python3",
            "gpus": {str(i): int(total * fraction) for i in range(tp_size)},
        }

    def take(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.record))

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def make_handler(args: argparse.Namespace, ready: threading.Event) -> type[BaseHTTPRequestHandler]:
    algorithm = args.speculative_algorithm
    if algorithm == "NEXTN":
        algorithm = "EAGLE"  # SGLang rewrites NEXTN to EAGLE in its server args
    served = args.served_model_name or args.model_path
    info = {
        "version": VERSION,
        "model_path": args.model_path,
        "served_model_name": served,
        "tp_size": args.tp_size,
        "speculative_algorithm": algorithm,
        "speculative_num_steps": args.speculative_num_steps,
        "speculative_eagle_topk": args.speculative_eagle_topk,
        "speculative_num_draft_tokens": args.speculative_num_draft_tokens,
        "internal_states": [{"avg_spec_accept_length": 1.0}],
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            sys.stderr.write(f"{self.address_string()} - {fmt % a}\n")

        def reply(self, code: int, body: object) -> None:
            data = json.dumps(body).encode() if not isinstance(body, bytes) else body
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            if not args.api_key or self.headers.get("Authorization") == f"Bearer {args.api_key}":
                return True
            self.reply(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                self.reply(200 if ready.is_set() else 503, b"")
            elif not self.authorized():
                return
            elif self.path in ("/server_info", "/get_server_info"):
                self.reply(200, info)
            elif self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": served, "object": "model"}]})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            if not self.authorized():
                return
            length = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(length)
            if self.path == "/v1/chat/completions":
                self.reply(200, {
                    "object": "chat.completion",
                    "model": served,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "lab stand-in"}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
                })
            else:
                self.reply(404, {"detail": "Not Found"})

    return Handler


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    ready = threading.Event()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args, ready))
    hold = GpuHold(args.tp_size, args.mem_fraction_static)

    def stop(signum: int, _frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    hold.take()
    try:
        threading.Thread(target=lambda: (time.sleep(args.load_seconds), ready.set()), daemon=True).start()
        print(f"stand-in SGLang {VERSION} serving {args.model_path} on {args.host}:{args.port}", flush=True)
        server.serve_forever()
    finally:
        hold.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
