# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A trainer for the resume_training unit tests: it resumes from ``--resume`` (the step in the checkpoint's
``trainer_state.json``) and appends ``step=N`` lines to ``--log`` every 20 ms.

``--scratch`` ignores the checkpoint and starts at step 0 (a resume flag the trainer does not understand);
``--die`` prints an error and exits 3 before training; ``--silent`` runs without logging; ``--workers N`` starts N
child processes that stay in its session, as a launcher's trainer does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--resume", default="")
    parser.add_argument("--scratch", action="store_true")
    parser.add_argument("--die", action="store_true")
    parser.add_argument("--silent", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def first_step(args: argparse.Namespace) -> int:
    if args.scratch or not args.resume:
        return 0
    with open(os.path.join(args.resume, "trainer_state.json")) as handle:
        return int(json.load(handle)["global_step"])


def main(argv: list) -> int:
    args = parse_args(argv)
    if args.worker:
        while True:
            time.sleep(1)
    if args.die:
        print("error: cannot load the checkpoint (simulated)", flush=True)
        return 3
    for _unused in range(args.workers):
        subprocess.Popen([sys.executable, __file__, "--log", args.log, "--worker"])
    step = first_step(args)
    print(f"resuming at step {step}", flush=True)
    while True:
        time.sleep(0.02)
        step += 1
        if not args.silent:
            with open(args.log, "a") as handle:
                handle.write(f"[1m] step={step} loss=--- | ETA=1d\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
