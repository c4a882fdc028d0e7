"""The release smoke request against a loopback server answering the way SGLang does with --reasoning-parser."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SMOKE = Path(__file__).resolve().parents[3] / "roles" / "sglang_release" / "files" / "smoke.py"


class ReasoningServer(ThreadingHTTPServer):
    """Answers every chat request with ``message``; keeps the request bodies."""

    def __init__(self, message: dict) -> None:
        self.message = message
        self.bodies: list[dict] = []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    server: ReasoningServer

    def do_POST(self) -> None:
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        reply = json.dumps({"choices": [{"index": 0, "message": self.server.message}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def serve() -> Iterator:
    servers: list[ReasoningServer] = []

    def start(message: dict) -> ReasoningServer:
        server = ReasoningServer(message)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def smoke(server: ReasoningServer) -> dict:
    completed = subprocess.run(
        [sys.executable, str(SMOKE), str(server.server_address[1]), "qwen", "48", "2", "Write fizzbuzz."],
        capture_output=True, text=True, timeout=60, check=True)
    return json.loads(completed.stdout)


def test_an_unfinished_think_block_counts_as_an_answer(serve) -> None:
    """SGLang's qwen3 parser puts a think block cut off by max_tokens in reasoning_content and leaves content
    empty; the gate used to read that as an empty answer and fail pivot and rollback alike."""
    server = serve({"role": "assistant", "content": "", "reasoning_content": "Okay, the user wants fizzbuzz"})
    assert smoke(server)["answers"] == ["Okay, the user wants fizzbuzz"] * 2


def test_the_request_asks_the_template_not_to_think_and_is_greedy(serve) -> None:
    server = serve({"role": "assistant", "content": "def fizzbuzz(n):", "reasoning_content": None})
    assert smoke(server)["answers"] == ["def fizzbuzz(n):"] * 2
    body = server.bodies[0]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert (body["temperature"], body["max_tokens"]) == (0, 48)


def test_reasoning_and_content_together_make_the_answer(serve) -> None:
    server = serve({"role": "assistant", "content": "def f(): ...", "reasoning_content": "think. "})
    assert smoke(server)["answers"][0] == "think. def f(): ..."


def test_a_server_that_answers_nothing_gives_empty_answers(serve) -> None:
    server = serve({"role": "assistant", "content": None})
    assert smoke(server)["answers"] == ["", ""]
