"""Contract tests against a real SGLang 0.5.23 (CPU) in .venv-sglang, driven by subprocess from the controller venv.

``lab/setup.sh all`` (or ``lab/setup.sh sglang``) builds .venv-sglang; without it these tests skip, saying so.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from contract_support import PROBE, SGLANG_VENV, ProbeRunner, probe_env


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    python = SGLANG_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{SGLANG_VENV} is missing: run `lab/setup.sh sglang` to build the SGLang 0.5.23 contract venv")
    return python


@pytest.fixture(scope="session")
def run_probe(sglang_python: Path) -> ProbeRunner:
    def run(command: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
            expect_rc: int = 0) -> dict[str, Any]:
        completed = subprocess.run(
            [str(sglang_python), str(PROBE), command, "--", *args],
            capture_output=True, text=True, env=probe_env(env), timeout=300, check=False,
        )
        assert completed.returncode == expect_rc, (
            f"probe {command} exited {completed.returncode}:\n{completed.stderr[-4000:]}")
        if expect_rc != 0:
            return {"stderr": completed.stderr}
        return json.loads(completed.stdout.strip().splitlines()[-1])

    return run
