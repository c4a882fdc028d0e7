"""Stock ``python -m sglang.launch_server`` as a subprocess: its command line, start, health wait, HTTP, stop by PID.

Every server the suite starts is described by a :class:`ServerSpec`; :func:`server_command` and
:func:`server_environment` are the one place its command line and environment are made. The plugin is selected the
way the production unit selects it: ``SGLANG_PLUGINS=ddtree`` in the environment, ``DDTREE_BUDGET`` for the budget.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_runtime.sglang.config import ENV_BUDGET, ENV_DEBUG_TREE_DIGEST

COMMON_FLAGS: tuple[str, ...] = (
    # No --skip-tokenizer-init: the models ship their tokenizer (the byte vocabulary as a Hugging Face tokenizer), so
    # SGLang loads it, and with it the processor of a multimodal target, stop strings and the xgrammar grammar
    # backend (SGLang's default). Requests still carry input_ids; answers still carry output_ids.
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--mem-fraction-static", "0.25",
    "--max-running-requests", "16",
    "--cuda-graph-max-bs-decode", "16",
    # Prefill graphs (58 shapes up to 8192 tokens) took 35 s of a 116 s start on the H200; no case needs them.
    "--disable-prefill-cuda-graph",
    "--random-seed", "0",
    "--log-level", "info",
)
"""Flags every server of the suite gets (baseline and speculative alike), so outputs are comparable."""

DEFAULT_DTYPE = "bfloat16"
"""``--dtype`` of every server: what production serves. SGLang 0.5.23 on an H200, measured: in bfloat16 its DFlash
drafter runs a Triton qk-norm + rope kernel that needs ``head_dim / 2`` to be a power of two (the pair was retrained
with head_dim 64 for it; float16 skips that kernel and served DFLASH with the earlier pair's head_dim 48); float32
has no sgl_kernel rmsnorm."""

STRICT_MEMORY_CHECK = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
"""SGLang's own idle-time KV/req pool leak check raises instead of warning."""

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast off in NCCL, PyTorch and NVSHMEM for every server, whatever environment it is started from: on
the shared multi-GPU test machines a program that uses it can put the host's GPUs out of service."""

TREE_DIGEST = {ENV_DEBUG_TREE_DIGEST: "1"}
"""At ``--tp-size`` above 1: every round each rank logs a digest of the tree it built and the ranks compare them; a
mismatch raises in the worker, so a server whose ranks would decode different trees fails its case."""


@dataclass(frozen=True)
class ServerSpec:
    """One server configuration: ``algorithm`` None is the non-speculative baseline."""

    name: str
    model_path: Path
    algorithm: str | None = None
    draft_model_path: Path | None = None
    draft_tokens: int | None = None
    budget: int | None = None
    cuda_graphs: bool = True
    extra_flags: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "algorithm": self.algorithm or "none",
            "draft_tokens": self.draft_tokens,
            "budget": self.budget,
            "cuda_graphs": self.cuda_graphs,
            "extra_flags": list(self.extra_flags),
            "extra_env": dict(self.extra_env),
        }


def server_command(spec: ServerSpec, python: str, port: int, dtype: str = DEFAULT_DTYPE,
                   tp_size: int = 1) -> list[str]:
    """The exact argv of ``spec``'s server, on ``tp_size`` GPUs."""
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(spec.model_path),
            "--host", "127.0.0.1", "--port", str(port), *COMMON_FLAGS, "--dtype", dtype]
    if tp_size > 1:
        argv += ["--tp-size", str(tp_size)]
    if spec.algorithm is not None:
        argv += ["--speculative-algorithm", spec.algorithm]
        if spec.draft_model_path is not None:
            argv += ["--speculative-draft-model-path", str(spec.draft_model_path)]
        if spec.draft_tokens is not None:
            argv += ["--speculative-num-draft-tokens", str(spec.draft_tokens)]
    if not spec.cuda_graphs:
        argv.append("--disable-cuda-graph")
    return argv + list(spec.extra_flags)


def server_environment(spec: ServerSpec, base: Mapping[str, str], tp_size: int = 1) -> dict[str, str]:
    """``base`` plus what the unit sets for the plugin; other plugins are never loaded (``SGLANG_PLUGINS``)."""
    env = {key: value for key, value in base.items() if not key.startswith("DDTREE_")}
    env.update(STRICT_MEMORY_CHECK)
    env.update(MULTICAST_OFF)
    if tp_size > 1:
        env.update(TREE_DIGEST)
    env["SGLANG_PLUGINS"] = "ddtree"
    env["PYTHONUNBUFFERED"] = "1"
    if spec.budget is not None:
        env[ENV_BUDGET] = str(spec.budget)
    env.update(dict(spec.extra_env))
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServerError(RuntimeError):
    """A server did not start, died, or answered with an error; the message carries its last log lines."""


@dataclass
class HttpAnswer:
    status: int
    body: Any


def http_call(url: str, body: Any = None, timeout: float = 300.0) -> HttpAnswer:
    """GET (``body`` None) or POST JSON; HTTP errors are answers, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        parsed: Any = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        parsed = raw.decode(errors="replace")
    return HttpAnswer(status, parsed)


@dataclass
class Server:
    """A started server process (its own session, so its children can be found and stopped with it)."""

    spec: ServerSpec
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    command: list[str]
    started_at: float = field(default_factory=time.monotonic)
    ready_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until ``/health_generate`` answered 200; raises when the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerError(f"{self.spec.name}: the server exited with {self.process.returncode} before it "
                                  f"was healthy; last log lines:\n{self.log_tail()}")
            try:
                if http_call(self.url + "/health_generate", timeout=20).status == 200:
                    self.ready_seconds = time.monotonic() - self.started_at
                    return self.ready_seconds
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise ServerError(f"{self.spec.name}: not healthy within {timeout:g} s; last log lines:\n{self.log_tail()}")

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code if the process ends within ``timeout`` (for servers that must refuse to start)."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def call(self, path: str, body: Any = None, timeout: float = 300.0) -> HttpAnswer:
        if not self.alive():
            raise ServerError(f"{self.spec.name}: the server died (exit {self.process.returncode}); last log "
                              f"lines:\n{self.log_tail()}")
        return http_call(self.url + path, body, timeout)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the launcher by PID, then SIGKILL what is left of its session (only what this suite started)."""
        pid = self.process.pid
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            self.wait_exit(grace)
        deadline = time.monotonic() + grace
        while _group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _group_alive(pid):
            os.killpg(pid, signal.SIGKILL)
        if self.alive():
            self.process.kill()
        self.process.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_server(spec: ServerSpec, python: str, log_dir: Path, dtype: str = DEFAULT_DTYPE, *,
                 base_env: Mapping[str, str] | None = None, tp_size: int = 1) -> Server:
    """Start ``spec``'s server in its own session, its output in ``log_dir/<name>.log``."""
    port = free_port()
    command = server_command(spec, python, port, dtype, tp_size)
    log_path = log_dir / f"{spec.name}.log"
    env = server_environment(spec, os.environ if base_env is None else base_env, tp_size)
    with log_path.open("wb") as log:
        log.write((" ".join(command) + "\n").encode())
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Server(spec=spec, port=port, process=process, log_path=log_path, command=command)


def generate(server: Server, input_ids: Sequence[Sequence[int]], sampling: Mapping[str, Any],
             extra: Mapping[str, Any] | None = None, timeout: float = 600.0) -> list[dict[str, Any]]:
    """One ``/generate`` call for a batch of prompts; returns SGLang's per-prompt answers (``output_ids``,
    ``meta_info``). An HTTP error raises :class:`ServerError` with the server's answer."""
    body: dict[str, Any] = {"input_ids": [list(ids) for ids in input_ids], "sampling_params": dict(sampling)}
    body.update(extra or {})
    answer = server.call("/generate", body, timeout=timeout)
    if answer.status != 200:
        raise ServerError(f"{server.spec.name}: /generate answered {answer.status}: {str(answer.body)[:500]}")
    if not isinstance(answer.body, list) or len(answer.body) != len(input_ids):
        raise ServerError(f"{server.spec.name}: /generate returned {type(answer.body).__name__}, expected a list of "
                          f"{len(input_ids)} answers")
    return answer.body
