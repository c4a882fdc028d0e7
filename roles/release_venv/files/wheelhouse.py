"""The release's wheelhouse on the controller: build it from a lock file, or inspect one that is there.

    wheelhouse.py inspect DIR
    wheelhouse.py build LOCK DIR --python-version 3.12 [--platform TAG ...]

A wheelhouse is a directory of wheels plus ``requirements.txt``, the complete list (``name==version``, one per line)
a release venv installs with ``pip --no-index``, and the pip wheel that bootstraps that venv's pip. ``inspect`` prints
one JSON object: its ``id`` (a hash of the list and of every file's name and size, so a changed wheelhouse is a new
one), the SGLang version it pins, the CPython tags of its binary wheels, its pip wheel, file count and bytes; it exits
1 with a message naming what is missing when a pinned requirement has no wheel. ``build`` downloads the lock's wheels
with pip for the serving host's Python and platform (the controller needs PyPI; the serving host does not), then
inspects the result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REQUIREMENTS = "requirements.txt"
DEFAULT_PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in (5, 12, 17, 18, 24, 27, 28, 31, 34, 35, 39)),
                     "manylinux2014_x86_64", "linux_x86_64", "any")


class WheelhouseError(Exception):
    """The wheelhouse cannot be used; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    python_tag: str
    path: Path


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel(path: Path) -> Wheel:
    parts = path.name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise WheelhouseError(f"{path.name} is not a wheel file name (name-version[-build]-python-abi-platform.whl)")
    return Wheel(normalize(parts[0]), parts[1], parts[-3], path)


def read_requirements(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match is None:
            raise WheelhouseError(f"{path}: every line must pin one package as name==version, not {line!r}")
        pins[normalize(match.group(1))] = match.group(2)
    return pins


def inspect(directory: Path) -> dict[str, object]:
    lock = directory / REQUIREMENTS
    if not lock.is_file():
        raise WheelhouseError(f"{directory} has no {REQUIREMENTS}: it is not a release wheelhouse "
                              f"(build one with: wheelhouse.py build LOCK {directory} --python-version X.Y)")
    pins = read_requirements(lock)
    wheels = [parse_wheel(path) for path in sorted(directory.glob("*.whl"))]
    available = {(wheel.name, wheel.version) for wheel in wheels}
    missing = [f"{name}=={version}" for name, version in pins.items() if (name, version) not in available]
    if missing:
        raise WheelhouseError(f"{directory} lacks wheels for {', '.join(missing)}; rebuild it from its lock")
    pip = [wheel for wheel in wheels if wheel.name == "pip"]
    if not pip:
        raise WheelhouseError(f"{directory} has no pip wheel, which bootstraps the release venv's pip offline")
    digest = hashlib.sha256(lock.read_bytes())
    for wheel in wheels:
        digest.update(f"{wheel.path.name}:{wheel.path.stat().st_size}\n".encode())
    cpython = sorted({tag for wheel in wheels for tag in wheel.python_tag.split(".") if re.fullmatch(r"cp3\d+", tag)})
    return {
        "path": str(directory),
        "id": digest.hexdigest()[:16],
        "sglang_version": pins.get("sglang"),
        "python_tags": cpython,
        "pip_wheel": pip[-1].path.name,
        "requirements": [f"{name}=={version}" for name, version in pins.items()],
        "files": len(wheels),
        "bytes": sum(wheel.path.stat().st_size for wheel in wheels),
        # what a copy ships, one file at a time (a progress line for each)
        "shipped_files": [{"name": path.name, "bytes": path.stat().st_size}
                          for path in [lock, *(wheel.path for wheel in wheels)]],
    }


def build(lock: Path, directory: Path, python_version: str, platforms: list[str]) -> dict[str, object]:
    pins = read_requirements(lock)
    if "pip" not in pins:
        raise WheelhouseError(f"{lock} must pin pip too: it bootstraps the release venv's pip offline")
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--python-version", python_version, "--implementation", "cp",
               "-d", str(directory), "-r", str(lock)]
    for platform in platforms or DEFAULT_PLATFORMS:
        command += ["--platform", platform]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise WheelhouseError(f"pip download of {lock} failed (the controller needs PyPI for this step): "
                              f"{done.stderr.strip()[-2000:]}")
    (directory / REQUIREMENTS).write_text(lock.read_text())
    return inspect(directory)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="wheelhouse.py", description=(__doc__ or "").split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("inspect").add_argument("directory", type=Path)
    builder = sub.add_parser("build")
    builder.add_argument("lock", type=Path)
    builder.add_argument("directory", type=Path)
    builder.add_argument("--python-version", required=True)
    builder.add_argument("--platform", action="append", default=[])
    options = parser.parse_args(argv)
    try:
        if options.action == "inspect":
            result = inspect(options.directory)
        else:
            result = build(options.lock, options.directory, options.python_version, options.platform)
    except (WheelhouseError, OSError) as error:
        print(f"wheelhouse: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
