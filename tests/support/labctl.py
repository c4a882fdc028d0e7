"""Test-side handle on the lab: bring it up and down, run commands on its hosts, find leftovers."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "lab" / "lab"
# Which of the labs this machine can run side by side `lab/lab` brings up here (PIVOT_LAB_INSTANCE, see lab/lab):
# every name, address and directory below is that lab's own, so that another lab running meanwhile is none of ours.
INSTANCE = int(os.environ.get("PIVOT_LAB_INSTANCE", "0"))
_TAG = str(INSTANCE) if INSTANCE else ""
STATE_ROOT = Path(os.environ.get("PIVOT_LAB_DIR", "/var/lib/pivot-lab"))
STATE = STATE_ROOT / f"lab{INSTANCE}" if INSTANCE else STATE_ROOT
BRIDGE = f"pvlab{INSTANCE}"
NETNS_PREFIX = f"pvlab{_TAG}-"
VETH_PREFIX = f"pvl{_TAG}-"
HOSTS = ("pve", "ct200", "pro6000")


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


def run(cmd: list[str], *, stdin: str | None = None, timeout: float = 120, check: bool = False,
        env: dict[str, str] | None = None) -> Result:
    """env: variables added to this process's environment for the command."""
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **env} if env else None)
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return result


def lab(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> Result:
    return run([str(LAB), *args], timeout=timeout, check=True, env=env)


def ssh(host: str, command: str, *, stdin: str | None = None, timeout: float = 60) -> Result:
    """Runs a shell command on a lab host over SSH, as the controller does."""
    return run(["ssh", "-F", str(STATE / "ssh" / "config"), host, command], stdin=stdin, timeout=timeout)


def pct_exec(argv: list[str], *, stdin: str | None = None, timeout: float = 60) -> Result:
    """Runs argv inside ct200 the production way: on the Proxmox node, `pct exec 200 -- argv`."""
    quoted = " ".join(_shell_quote(a) for a in ["pct", "exec", "200", "--", *argv])
    return ssh("pve", quoted, stdin=stdin, timeout=timeout)


def sshd_outage(seconds: int) -> str:
    """A shell command for a lab host: a second later its sshd stops and every SSH session to it ends (what a network
    partition, or a stopped container, looks like from outside), and ``seconds`` later sshd starts again. The timers
    fire within 100 ms (a transient timer's default accuracy is a minute)."""
    timer = "systemd-run --quiet --timer-property=AccuracySec=100ms"
    return (f"{timer} --on-active=1 sh -c 'systemctl stop ssh.service; pkill -f \"^sshd: \"' && "
            f"{timer} --on-active={seconds} systemctl start ssh.service")


def _shell_quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def ansible_adhoc(host: str, module: str, module_args: str = "", *, timeout: float = 120) -> dict:
    """Runs one ad-hoc module on a host through the project's ansible.cfg; returns its result."""
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    cmd = ["ansible", host, "-m", module, *(["-a", module_args] if module_args else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    try:
        report = json.loads(proc.stdout)
        return report["plays"][0]["tasks"][0]["hosts"][host]
    except (ValueError, KeyError, IndexError) as exc:
        raise AssertionError(f"{cmd} gave no result ({exc}):\n{proc.stdout}\n{proc.stderr}") from exc


CGROUP_DIRS = tuple(Path(root) / f"pivot-lab{_TAG}"
                    for root in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"))


def lab_processes() -> list[int]:
    """PIDs in the lab's cgroups: everything the containers run, orphaned or not."""
    pids: set[int] = set()
    for root in CGROUP_DIRS:
        for procs in root.rglob("cgroup.procs") if root.exists() else ():
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except OSError:
                continue
    return sorted(pids)


def is_zombie(pid: int) -> bool:
    """An exited process its parent has not reaped yet: it holds nothing but its PID.

    After a `lab up` is killed, its systemd-nspawn children belong to this machine's init; where
    that init does not reap (some CI runners), they stay zombies after `lab down` ends them.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def other_labs_up() -> bool:
    """Whether another lab instance has hosts on this machine (it shares the tmpfs on /run/systemd/nspawn)."""
    others = [STATE_ROOT / "hosts", *STATE_ROOT.glob("lab[0-9]/hosts")]
    return any(path.exists() for path in others if path != STATE / "hosts")


def leftovers() -> dict[str, list[str]]:
    """Everything this lab could leave on this machine; all lists are empty when it is fully down."""
    found: dict[str, list[str]] = {}
    netns = run(["ip", "netns", "list"]).stdout.split()
    found["netns"] = [n for n in netns if n.startswith(NETNS_PREFIX)]
    links = run(["ip", "-o", "link", "show"]).stdout.splitlines()
    found["links"] = [ln.split(": ")[1] for ln in links
                      if ln.split(": ")[1].split("@")[0] == BRIDGE or f": {VETH_PREFIX}" in ln]
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    found["mounts"] = [" ".join(m) for m in mounts if m[1].startswith(f"{STATE}/hosts/")
                       or (m[0] == "pvlab-nspawn" and not other_labs_up())]
    nspawn = [line for line in run(["pgrep", "-a", "-x", "systemd-nspawn"]).stdout.splitlines()
              if f" {STATE}/hosts/" in line and not is_zombie(int(line.split()[0]))]
    found["processes"] = [f"pid {pid} (in a lab cgroup)" for pid in lab_processes()] + nspawn
    found["cgroups"] = [str(p) for p in CGROUP_DIRS if p.exists()]
    found["host_dirs"] = [str(p) for p in (STATE / "hosts", STATE / "ssh") if p.exists()]
    # another instance's state directory, left empty (instance 0's is the root that keeps the base image)
    found["state_dir"] = [str(STATE)] if INSTANCE and STATE.is_dir() and not any(STATE.iterdir()) else []
    return found


def assert_nothing_left() -> None:
    left = {kind: items for kind, items in leftovers().items() if items}
    assert not left, f"the lab left things behind: {left}"
