"""`lab up` and `lab down` leave this machine as they found it, also after a run killed half way."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import labctl
import pytest


@pytest.fixture(autouse=True)
def lab_down_afterwards() -> Iterator[None]:
    yield
    labctl.lab("down")


def nspawn_pids() -> list[int]:
    """This lab's live systemd-nspawn processes (not those of another instance, see lab/lab). Those an earlier
    `lab down` ended linger as zombies until this machine's init reaps them, which some inits do late (CI's did: 6
    found where 3 run)."""
    lines = labctl.run(["pgrep", "-a", "-x", "systemd-nspawn"]).stdout.splitlines()
    found = (line.partition(" ") for line in lines)
    return [int(pid) for pid, _space, args in found
            if f"{labctl.STATE}/hosts/" in args and not labctl.is_zombie(int(pid))]


def test_down_leaves_nothing_after_a_normal_run() -> None:
    labctl.lab("up")
    assert len(nspawn_pids()) == 3
    labctl.lab("down")
    labctl.assert_nothing_left()


def test_down_is_idempotent() -> None:
    labctl.lab("down")
    labctl.lab("down")
    labctl.assert_nothing_left()


def test_up_replaces_a_lab_whose_nspawn_processes_were_killed() -> None:
    labctl.lab("up")
    for pid in nspawn_pids():
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    # The containers' systemd survives its nspawn: orphaned inits keep the hosts half alive.
    orphans = labctl.lab_processes()
    assert orphans, "expected orphaned container processes after SIGKILL of systemd-nspawn"

    labctl.lab("up")
    assert len(nspawn_pids()) == 3
    assert not set(orphans) & set(labctl.lab_processes()), "orphans of the killed lab are still running"
    for host in labctl.HOSTS:
        assert labctl.ssh(host, "systemctl is-system-running").stdout.strip() == "running"
    labctl.lab("down")
    labctl.assert_nothing_left()


def test_down_cleans_up_after_a_bring_up_killed_half_way() -> None:
    proc = subprocess.Popen([str(labctl.LAB), "up"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    # Kill it once containers are booting: namespaces, mounts, cgroups and processes exist.
    while time.monotonic() < deadline and not any((labctl.STATE / "hosts").glob("*/nspawn.pid")):
        time.sleep(0.02)
    assert proc.poll() is None, "lab up finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert any(labctl.leftovers().values()), "the interrupted bring-up should have left something"

    labctl.lab("down")
    labctl.assert_nothing_left()


def test_ssh_refuses_a_host_whose_key_changed() -> None:
    """The generated known_hosts pins each host's key: a different host on that address is refused."""
    labctl.lab("up")
    known = labctl.STATE / "ssh" / "known_hosts"
    lines = known.read_text().splitlines()
    pro6000 = next(ln for ln in lines if ln.startswith("pro6000,"))
    pve_key = next(ln for ln in lines if ln.startswith("pve,")).split(" ", 1)[1]
    known.write_text("\n".join([*(ln for ln in lines if ln != pro6000),
                                f"{pro6000.split(' ')[0]} {pve_key}"]) + "\n")
    result = labctl.ssh("pro6000", "true")
    assert result.rc == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr or "Host key verification failed" in result.stderr
