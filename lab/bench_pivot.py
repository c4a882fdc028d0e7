"""Times a playbook run on the lab and splits it into waiting (for the job, the GPUs, the server, pip)
and everything else (Ansible's own overhead: connections, module transfer, templating).

usage: .venv/bin/python lab/bench_pivot.py playbooks/pivot.yml [ansible-playbook args...]
Prints a JSON summary; per-task durations come from the ansible.posix.json callback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Tasks whose duration is time spent waiting on the world rather than on Ansible.
WAITING_TASKS = {
    "Checkpoint and stop the training job": "training job (checkpoint, SIGTERM, exit)",
    "Wait until the GPUs are released": "GPU release",
    "Stop the running server": "server stop (drain)",
    "Start the release": "server start",
    "Wait for /health_generate": "server load until healthy",
    "Send the same greedy chat request twice": "smoke requests",
    "Install ddtree_runtime into the venv, offline": "pip install",
    "Run the package's self-check": "self-check (decode on the host)",
    "Validate the command line with the server's own argument parser": "argument parser (imports torch)",
}


def seconds(interval: dict[str, str]) -> float:
    start = datetime.fromisoformat(interval["start"].replace("Z", "+00:00"))
    end = datetime.fromisoformat(interval["end"].replace("Z", "+00:00"))
    return (end - start).total_seconds()


def main(argv: list[str]) -> int:
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    started = time.monotonic()
    proc = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    report = json.loads(proc.stdout)
    waiting: dict[str, float] = {}
    task_count = 0
    for play in report["plays"]:
        for task in play["tasks"]:
            task_count += 1
            label = WAITING_TASKS.get(task["task"]["name"].split(" : ")[-1])
            if label:
                waiting[label] = waiting.get(label, 0.0) + seconds(task["task"]["duration"])
    total_wait = sum(waiting.values())
    print(json.dumps({"playbook": argv[0], "rc": proc.returncode, "wall_s": round(wall, 1),
                      "waiting_s": round(total_wait, 1), "ansible_overhead_s": round(wall - total_wait, 1),
                      "tasks": task_count, "waiting": {k: round(v, 1) for k, v in waiting.items()}}, indent=2))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
