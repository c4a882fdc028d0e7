"""Prune old release venvs and wheelhouses on the serving host (Pivot's own directories only).

    prune.py ROOT KEEP --protect VENV [--protect VENV ...] [--dry-run]

Policy: under ROOT/venvs, keep the KEEP most recently completed venvs (by their pivot-release.json) and, besides
them, every protected one (the venv this run installs, the venv the current release runs from); remove the rest,
including half-built venvs without a completion record that are not protected. Under ROOT/wheelhouse, keep the
wheelhouses a kept venv was built from; remove the rest. Nothing outside ROOT/venvs and ROOT/wheelhouse is touched, so
the user's own venv can never be pruned. Prints one JSON object: {"removed": [...], "kept": [...]}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

MARKER = "pivot-release.json"


def completed_at(venv: Path) -> float | None:
    marker = venv / MARKER
    return marker.stat().st_mtime if marker.is_file() else None


def wheelhouse_of(venv: Path) -> str | None:
    try:
        return str(json.loads((venv / MARKER).read_text()).get("wheelhouse_id"))
    except (OSError, ValueError):
        return None


def plan(root: Path, keep: int, protected: set[Path]) -> tuple[list[Path], list[Path]]:
    venvs = sorted(p for p in (root / "venvs").glob("*") if p.is_dir()) if (root / "venvs").is_dir() else []
    complete = sorted((v for v in venvs if completed_at(v) is not None), key=completed_at, reverse=True)
    kept = [v for v in venvs if v.resolve() in protected]
    kept += [v for v in complete[:keep] if v not in kept]
    removed = [v for v in venvs if v not in kept]
    wheelhouses = {wheelhouse_of(v) for v in kept}
    if (root / "wheelhouse").is_dir():
        removed += sorted(w for w in (root / "wheelhouse").glob("*") if w.is_dir() and w.name not in wheelhouses)
    return kept, removed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="prune.py")
    parser.add_argument("root", type=Path)
    parser.add_argument("keep", type=int)
    parser.add_argument("--protect", action="append", default=[], type=Path)
    parser.add_argument("--dry-run", action="store_true")
    options = parser.parse_args(argv)
    protected = {p.resolve() for p in options.protect}
    kept, removed = plan(options.root, options.keep, protected)
    if not options.dry_run:
        for path in removed:
            shutil.rmtree(path)
    print(json.dumps({"removed": [str(p) for p in removed], "kept": [str(p) for p in kept]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
