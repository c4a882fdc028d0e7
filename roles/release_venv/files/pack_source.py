"""Packs a Python source tree into a reproducible .tar.gz (same bytes for the same files).

usage: pack_source.py SOURCE_DIR OUTPUT_DIR  -> prints the archive's path (named by its content hash)
Skips tests, caches, build outputs and compiled files; mtimes, owners and order are fixed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import sys
import tarfile
from collections.abc import Iterator

# tests and the shipped model pair are not needed to run the package on a serving host.
SKIP_DIRS = {"__pycache__", "build", "dist", ".pytest_cache", ".ruff_cache", ".hypothesis", "tests", "models"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".egg-info")


def members(source: str) -> Iterator[tuple[str, str]]:
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            if not name.endswith(SKIP_SUFFIXES):
                path = os.path.join(root, name)
                yield path, os.path.relpath(path, source)


def pack(source: str) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, rel in members(source):
            info = tar.gettarinfo(path, arcname="ddtree_runtime/" + rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            info.mode = 0o755 if info.mode & 0o111 else 0o644
            with open(path, "rb") as handle:
                tar.addfile(info, handle)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def main() -> None:
    source, output_dir = sys.argv[1], sys.argv[2]
    data = pack(source)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, f"ddtree_runtime-{hashlib.sha256(data).hexdigest()[:16]}.tar.gz")
    if not os.path.exists(path):
        with open(path + ".tmp", "wb") as handle:
            handle.write(data)
        os.replace(path + ".tmp", path)
    print(path)


if __name__ == "__main__":
    main()
