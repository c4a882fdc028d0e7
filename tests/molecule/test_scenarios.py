"""Every molecule scenario under molecule/ runs end to end (create, converge, idempotence, verify, destroy)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import labctl
import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))
# Each scenario's whole output, every line with the seconds since the start: where a scenario spends its time.
LOGS = REPO / "artifacts" / "molecule"
TIMEOUT_S = 1800


def test_there_are_scenarios() -> None:
    assert "check_hosts" in SCENARIOS


def molecule_test(scenario: str) -> tuple[int, str]:
    """`molecule test -s SCENARIO`: its exit status and output; the output also goes to artifacts/molecule/."""
    env = {**os.environ, "NO_COLOR": "1", "MOLECULE_NO_LOG": "false", "ANSIBLE_NOCOLOR": "1"}
    LOGS.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    started = time.monotonic()
    with (LOGS / f"{scenario}.log").open("w") as log, subprocess.Popen(
        ["molecule", "test", "-s", scenario], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        watchdog = threading.Timer(TIMEOUT_S, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                log.write(f"{time.monotonic() - started:8.2f} {line}")
                log.flush()
            returncode = proc.wait()
        finally:
            watchdog.cancel()
    if time.monotonic() - started >= TIMEOUT_S:
        lines.append(f"\n(killed after {TIMEOUT_S} s)\n")
    return returncode, "".join(lines)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario: str) -> None:
    returncode, log = molecule_test(scenario)
    assert returncode == 0, log[-12000:]
    assert "failed=0" in log.rsplit("SCENARIO RECAP", maxsplit=1)[-1]
    # molecule skips a step whose playbook it cannot find and still exits 0; only cleanup is optional here.
    missing = set(re.findall(r"> (\w+): Executed: Missing playbook", log)) - {"cleanup"}
    assert not missing, f"steps of {scenario} ran no playbook: {sorted(missing)}"
    labctl.assert_nothing_left()
