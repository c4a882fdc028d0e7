"""`lab/lab` takes as a container's init only the nspawn child that runs systemd, never an earlier child.

While a container boots, its systemd-nspawn has short-lived children before the init (the launching subshell's
command substitution, nspawn's outer child). `lab up` once cached the first child it saw and, when that child
exited, waited 90 s for a state it could no longer read (CI failed so). No lab is needed here: a stand-in nspawn
with such children, and `lab/lab status` reading a state directory that points at it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import labctl
import pytest


def children_of(pid: int) -> list[int]:
    return [int(p) for p in labctl.run(["pgrep", "-P", str(pid)]).stdout.split()]


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def wait_for_children(pid: int, count: int) -> list[int]:
    """The stand-in's children once ``count`` of them exist and each has exec'd its program (no longer bash)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = children_of(pid)
        if len(found) >= count and all(command_name(child) not in ("", "bash") for child in found):
            return found
        time.sleep(0.02)
    raise AssertionError(f"the stand-in nspawn {pid} never had {count} children")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    (tmp_path / "state" / "hosts" / "pve").mkdir(parents=True)
    return tmp_path / "state"


@pytest.fixture
def fake_init(tmp_path: Path) -> Path:
    """A program whose process name is ``systemd``, as the container's init is once it has exec'd."""
    program = tmp_path / "systemd"
    shutil.copy("/bin/sleep", program)
    return program


def start_fake_nspawn(children: list[str]) -> subprocess.Popen[bytes]:
    """A process standing in for systemd-nspawn, with ``children`` started in that order (each sleeps 60 s)."""
    script = " ".join(f"{child} 60 &" for child in children) + " wait"
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


@pytest.fixture
def stand_ins() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def lab_status(state: Path) -> dict[str, str]:
    result = subprocess.run(
        [str(labctl.LAB), "status"], capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PIVOT_LAB_DIR": str(state)})
    return {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}


def test_the_init_is_the_child_running_systemd_not_an_earlier_child(
    state_dir: Path, fake_init: Path, stand_ins: list[subprocess.Popen[bytes]]
) -> None:
    nspawn = start_fake_nspawn(["/bin/sleep", str(fake_init)])
    stand_ins.append(nspawn)
    children = wait_for_children(nspawn.pid, 2)
    # By name, not by PID order (PIDs wrap around).
    [init] = [pid for pid in children if command_name(pid) == "systemd"]
    [earlier] = [pid for pid in children if pid != init]
    (state_dir / "hosts" / "pve" / "nspawn.pid").write_text(f"{nspawn.pid}\n")

    status = lab_status(state_dir)

    assert f"(leader pid {init})" in status["pve"], status["pve"]
    assert str(earlier) not in status["pve"]
    assert status["ct200"].split()[-1] == "down"


def test_a_container_whose_init_has_not_started_is_not_given_a_leader(
    state_dir: Path, stand_ins: list[subprocess.Popen[bytes]]
) -> None:
    nspawn = start_fake_nspawn(["/bin/sleep"])
    stand_ins.append(nspawn)
    wait_for_children(nspawn.pid, 1)
    (state_dir / "hosts" / "pve" / "nspawn.pid").write_text(f"{nspawn.pid}\n")

    assert lab_status(state_dir)["pve"].split()[-1] == "down"
