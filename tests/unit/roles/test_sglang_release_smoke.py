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
import yaml

SMOKE = Path(__file__).resolve().parents[3] / "roles" / "sglang_release" / "files" / "smoke.py"


class ReasoningServer(ThreadingHTTPServer):
    """Answers every chat request with ``message``; keeps the request bodies."""

    def __init__(self, message: dict) -> None:
        self.message = message
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    server: ReasoningServer

    def do_POST(self) -> None:
        self.server.headers.append(dict(self.headers))
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


def test_the_content_after_the_think_block_is_kept_apart_for_the_quality_gate(serve) -> None:
    """Two answers that share a long think block and then differ are different answers: the gate compares these."""
    server = serve({"role": "assistant", "content": "def f(): ...", "reasoning_content": "think. " * 30})
    assert smoke(server)["contents"] == ["def f(): ..."] * 2
    unfinished = serve({"role": "assistant", "content": None, "reasoning_content": "Okay, the user"})
    assert smoke(unfinished)["contents"] == ["", ""]


def test_a_server_that_answers_nothing_gives_empty_answers(serve) -> None:
    server = serve({"role": "assistant", "content": None})
    assert smoke(server)["answers"] == ["", ""]


def keyed_smoke(server: ReasoningServer, secrets: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SMOKE), "--secrets-file", str(secrets), str(server.server_address[1]), "qwen", "48", "1",
         "Write fizzbuzz."], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("key", ["lab-secret-key-0123", "it's: a #key", 'quo"te\\d', "  padded ", "0123", "yes",
                                 " ".join(["a long key with spaces"] * 8)])
def test_the_api_key_comes_from_the_servers_secrets_file_as_a_yaml_dumper_writes_it(
        serve, tmp_path: Path, key: str) -> None:
    server = serve({"role": "assistant", "content": "ok"})
    secrets = tmp_path / "secrets.yaml"
    # what the role's to_nice_yaml writes, whatever quoting the key needs
    secrets.write_text(yaml.safe_dump({"api-key": key}, default_flow_style=False, width=100000))
    completed = keyed_smoke(server, secrets)
    assert completed.returncode == 0, completed.stderr
    assert server.headers[-1]["Authorization"] == f"Bearer {key}"
    # the key is in no argument: only the file's path is
    assert key not in " ".join(completed.args)


def test_an_unreadable_or_keyless_secrets_file_fails_by_name(serve, tmp_path: Path) -> None:
    server = serve({"role": "assistant", "content": "ok"})
    missing = keyed_smoke(server, tmp_path / "absent.yaml")
    assert missing.returncode == 1 and "cannot read the API key from" in missing.stderr
    keyless = tmp_path / "keyless.yaml"
    keyless.write_text("host: 127.0.0.1\n")
    refused = keyed_smoke(server, keyless)
    assert refused.returncode == 1 and "has no api-key line" in refused.stderr
    assert server.bodies == []


def test_without_a_secrets_file_no_authorization_is_sent(serve) -> None:
    server = serve({"role": "assistant", "content": "ok"})
    smoke(server)
    assert "Authorization" not in server.headers[-1]


def test_no_task_hands_the_api_key_to_a_command_through_its_environment() -> None:
    # Ansible puts a task's environment into the remote `sh -c` command line (and the controller's ssh argv)
    roles = Path(__file__).resolve().parents[3] / "roles"
    for tasks_file in roles.glob("*/tasks/*.yml"):
        for task in yaml.safe_load(tasks_file.read_text()) or []:
            for inner in [task, *task.get("block", []), *task.get("rescue", []), *task.get("always", [])]:
                environment = json.dumps(inner.get("environment", {}))
                assert "api_key" not in environment, f"{tasks_file}: {inner.get('name')}"
