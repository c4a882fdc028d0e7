"""sglang_release's check_server_args.py against small SGLang packages made here: what it reports when SGLang itself
cannot be imported, and how it tells a release with a plugin system from one without. Real SGLang 0.5.23 is in
tests/contract, the lab's stand-in releases in tests/lab_doubles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parents[3] / "roles" / "sglang_release" / "files" / "check_server_args.py"

SERVER_ARGS = '''
class ServerArgs:
    def __init__(self, args):
        self.model_path = args[args.index("--model-path") + 1]
        self.speculative_algorithm = None


def prepare_server_args(args):
    return ServerArgs(args)
'''


def fake_sglang(root: Path, init: str = "", plugins: str | None = None) -> Path:
    package = root / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    (package / "srt" / "__init__.py").write_text("")
    (package / "srt" / "server_args.py").write_text(SERVER_ARGS)
    if plugins is not None:
        (package / "srt" / "plugins.py").write_text(plugins)
    dist_info = root / "sglang-0.5.11.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.11\n")
    return root


def check(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(path)}
    return subprocess.run([sys.executable, str(CHECK), "sglang.launch_server", *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def test_sglang_that_cannot_import_is_reported_with_its_own_error(tmp_path: Path) -> None:
    # A baseline venv missing one of SGLang's dependencies: the message must name it, not "KeyError: 'sglang'",
    # which a swallowed ImportError used to leave behind (seen with real SGLang 0.5.11 missing numpy)
    # (as SGLang's own __init__ does, it imports a submodule before the import that fails)
    path = fake_sglang(tmp_path, init="import sglang.srt.server_args\nimport pivot_missing_dependency\n")
    completed = check(path, "--model-path", "/m")
    assert completed.returncode == 2
    assert "No module named 'pivot_missing_dependency'" in completed.stderr
    assert "KeyError" not in completed.stderr


def test_a_release_without_a_plugin_system_reports_no_plugins(tmp_path: Path) -> None:
    completed = check(fake_sglang(tmp_path), "--model-path", "/m")
    assert completed.returncode == 0, completed.stderr
    assert '"plugins": null' in completed.stdout
    assert '"sglang_version": "0.5.11"' in completed.stdout


def test_a_failing_plugin_system_is_reported_not_taken_for_an_absent_one(tmp_path: Path) -> None:
    path = fake_sglang(tmp_path, plugins="raise ImportError('cannot import name X from sglang.srt.plugins')\n")
    completed = check(path, "--model-path", "/m")
    assert completed.returncode == 2
    assert "cannot import name X" in completed.stderr
