"""The project's shell scripts: shellcheck clean, and no pipeline under pipefail that a reader stopping early
can fail.

`head` or `grep -q` exits after the first line or match; a writer that is still writing then dies of
SIGPIPE (or, for Python programs such as ansible, of BrokenPipeError), and pipefail turns that into a
failure of a pipeline whose answer was right. Whether the writer is still writing is a race, so such a
line passes here and fails on a slower or busier runner (CI once failed set-up on
`ansible --version | head -n1 | grep -q ...`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EARLY_EXIT_READER = re.compile(r"\|\s*(head\b|grep\s+(-\w*[qm]\w*\b|--quiet\b|--max-count\b))")


def shell_scripts() -> list[Path]:
    scripts = [p for p in (REPO / "lab").rglob("*") if p.is_file() and is_shell_script(p)]
    return sorted([*scripts, REPO / "tests" / "run", REPO / ".ci" / "run"])


def pipefail_sources() -> list[Path]:
    tasks = [p for folder in ("roles", "playbooks", "molecule") for pattern in ("*.yml", "*.j2")
             for p in (REPO / folder).rglob(pattern)]
    return sorted(p for p in {*shell_scripts(), *tasks} if "pipefail" in p.read_text())


def is_shell_script(path: Path) -> bool:
    try:
        first_line = path.read_text().split("\n", 1)[0]
    except UnicodeDecodeError:
        return False
    return first_line.startswith("#!") and ("bash" in first_line or first_line.endswith("/sh"))


def early_exit_pipes(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()
            if EARLY_EXIT_READER.search(line) and not line.lstrip().startswith("#")]


def test_the_check_finds_the_pipeline_that_once_failed_ci() -> None:
    assert early_exit_pipes(".venv/bin/ansible --version | head -n1 | grep -q 'core 2.21' || die x")
    assert early_exit_pipes("ip netns list | grep -q '^pvlab-'")
    assert not early_exit_pipes("version=$(.venv/bin/ansible --version)")
    assert not early_exit_pipes("pgrep -P 1 -x systemd | sed -n 1p")


def test_shell_scripts_are_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: lab/setup.sh debian installs it"
    scripts = shell_scripts()
    assert REPO / "lab" / "lab" in scripts and REPO / "lab" / "setup.sh" in scripts
    result = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr


@pytest.mark.parametrize("path", pipefail_sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_pipeline_ends_in_a_reader_that_stops_early(path: Path) -> None:
    offending = early_exit_pipes(path.read_text())
    assert not offending, f"{path.relative_to(REPO)}: read the whole output instead: {offending}"
