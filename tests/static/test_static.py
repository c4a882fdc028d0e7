"""Static gates: ruff, ansible-lint (production profile), ansible-test sanity with no ignores."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
COPY_EXCLUDES = [".venv", ".venv-rt", ".venv-sglang", ".cache", ".git", "artifacts", "inventory/lab", "*.egg-info",
                 "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "build"]


def run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def test_python_is_ruff_clean() -> None:
    result = run([str(VENV_BIN / "ruff"), "check", "--output-format", "concise", "."], REPO, 300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile_passes() -> None:
    result = run([str(VENV_BIN / "ansible-lint"), "--offline", "--nocolor"], REPO, 600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert "Profile 'production' was required, and it passed" in result.stdout + result.stderr


def test_sanity_ignore_file_is_empty() -> None:
    for ignore in (REPO / "tests" / "sanity").glob("ignore-*.txt"):
        assert ignore.read_text().strip() == "", f"{ignore} must stay empty: fix the finding instead"


@pytest.fixture(scope="module")
def collection_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ansible-test needs the collection in a real .../ansible_collections/pivot/ops directory."""
    dest = tmp_path_factory.mktemp("sanity") / "ansible_collections" / "pivot" / "ops"
    shutil.copytree(REPO, dest, symlinks=True, ignore=shutil.ignore_patterns(*COPY_EXCLUDES))
    # ansible-test only looks at files git knows about.
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(cmd, cwd=dest, check=True)
    return dest


def test_ansible_test_sanity_passes(collection_copy: Path) -> None:
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    cmd = [str(VENV_BIN / "ansible-test"), "sanity", "--venv", "--python", python, "--color", "no"]
    result = run(cmd, collection_copy, 1200)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-8000:]
    assert "Running sanity test" in result.stdout + result.stderr
