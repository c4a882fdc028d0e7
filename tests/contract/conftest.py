"""Contract tests against a real SGLang 0.5.23 (CPU) in .venv-sglang, driven by subprocess from the controller venv.

``lab/setup.sh all`` (or ``lab/setup.sh sglang``) builds .venv-sglang; without it these tests skip, saying so.
"""

from __future__ import annotations

import json
import selectors
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from contract_support import PROBE, SGLANG_VENV, ProbeRunner, probe_env

PROBE_TIMEOUT_S = 300


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    python = SGLANG_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{SGLANG_VENV} is missing: run `lab/setup.sh sglang` to build the SGLang 0.5.23 contract venv")
    return python


def read_reply(stream: IO[str], what: str, server_log: Path) -> dict[str, Any]:
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(PROBE_TIMEOUT_S):
            raise AssertionError(f"the SGLang probe gave no answer to {what} in {PROBE_TIMEOUT_S} s; "
                                 f"its log:\n{server_log.read_text()[-4000:]}")
    line = stream.readline()
    if not line:
        raise AssertionError(f"the SGLang probe ended before answering {what}; its log:\n"
                             f"{server_log.read_text()[-4000:]}")
    return json.loads(line)


@dataclass(frozen=True)
class ProbeServer:
    process: subprocess.Popen[str]
    log: Path

    def ask(self, request: dict[str, Any], what: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return read_reply(self.process.stdout, what, self.log)


@pytest.fixture(scope="session")
def probe_server(sglang_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProbeServer]:
    """One ``sglang_probe.py serve``: SGLang imported once, every probe a fresh fork with its own environment."""
    server_log = tmp_path_factory.mktemp("sglang-probe") / "serve.log"
    with server_log.open("w") as log:
        server = subprocess.Popen([str(sglang_python), str(PROBE), "serve"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log, text=True,
                                  env=probe_env({"TRITON_INTERPRET": "1"}))
    assert server.stdout is not None
    try:
        assert read_reply(server.stdout, "start-up", server_log) == {"ready": True}
        yield ProbeServer(server, server_log)
    finally:
        if server.stdin:
            server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="session")
def run_probe(probe_server: ProbeServer) -> ProbeRunner:
    def run(command: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
            expect_rc: int = 0) -> dict[str, Any]:
        request = {"command": command, "args": list(args), "env": probe_env(env)}
        reply = probe_server.ask(request, f"{command} {list(args)}")
        assert reply["rc"] == expect_rc, f"probe {command} exited {reply['rc']}:\n{reply['stderr'][-4000:]}"
        if expect_rc != 0:
            return {"stderr": reply["stderr"]}
        return json.loads(reply["stdout"].strip().splitlines()[-1])

    return run
