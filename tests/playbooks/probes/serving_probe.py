"""Runs on pro6000 (python3 3.11, stdlib only), fed on stdin over SSH.

Prints, as JSON, what a user cares about on the serving host: which release `current` points at, every file Pivot
writes (releases, installed package, the unit), the unit's state, what the server says it runs, and the run lock.

    python3 - state
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

RELEASE_ROOT = Path("/etc/sglang")
WATCHED = (RELEASE_ROOT, Path("/opt/pivot"), Path("/etc/systemd/system"))
SITE_PACKAGES = Path("/root/ml-env/lib/python3.11/site-packages")
UNIT = "sglang.service"
LOCK = Path("/run/pivot/pivot.lock")
SERVER = "http://127.0.0.1:30000"


def entry(path: Path) -> list:
    st = path.lstat()
    link = os.readlink(path) if path.is_symlink() else ""
    return [oct(st.st_mode), st.st_size, st.st_mtime_ns, link]


def files() -> dict[str, list]:
    found: dict[str, list] = {}
    for root in WATCHED:
        if not root.exists():
            continue
        for directory, dirs, names in os.walk(root):
            for name in dirs + names:
                path = Path(directory, name)
                found[str(path)] = entry(path)
    if SITE_PACKAGES.is_dir():
        for path in SITE_PACKAGES.iterdir():
            if path.name.startswith("ddtree"):
                found[str(path)] = entry(path)
    return found


def unit() -> dict[str, str]:
    properties = ["MainPID", "ActiveState", "SubState", "FragmentPath", "ExecMainStartTimestampMonotonic"]
    out = subprocess.run(["systemctl", "show", UNIT, "-p", ",".join(properties)], capture_output=True, text=True,
                         check=False).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def server_info() -> dict | None:
    try:
        with urllib.request.urlopen(f"{SERVER}/server_info", timeout=5) as answer:
            info = json.load(answer)
    except (OSError, ValueError):
        return None
    return {key: info.get(key) for key in ("speculative_algorithm", "speculative_num_draft_tokens")}


def lock() -> dict | None:
    try:
        return json.loads(LOCK.read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    if argv != ["state"]:
        print(f"usage: python3 - state (got {argv})", file=sys.stderr)
        return 2
    current = RELEASE_ROOT / "current"
    print(json.dumps({
        "current": os.readlink(current) if current.is_symlink() else None,
        "files": files(),
        "unit": unit(),
        "server": server_info(),
        "lock": lock(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
