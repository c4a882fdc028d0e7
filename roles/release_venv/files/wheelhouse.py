"""The release's wheelhouse on the controller: build it from a lock file, or inspect one that is there.

    wheelhouse.py inspect DIR
    wheelhouse.py build LOCK DIR --python-version 3.12 [--glibc 2.34 | --platform TAG ...]

A wheelhouse is a directory of wheels plus ``requirements.txt``, the complete list (``name==version``, one per line)
a release venv installs with ``pip --no-index``, and the pip wheel that bootstraps that venv's pip. ``inspect`` prints
one JSON object: its ``id`` (a hash of the list and of every file's name and size, so a changed wheelhouse is a new
one), the SGLang version it pins, the CUDA version its torch was built with (``cpu`` for a CPU build; the host's
nvcc must share its major version to build the extension), the CPython tags that can install every pinned wheel,
the newest glibc any wheel needs, its pip wheel, file count and bytes; it exits 1 with a message naming what is
missing when a pinned requirement has no wheel, or when no one CPython can install them all.
``build`` downloads the lock's wheels with pip for the serving host's Python and platform (the controller needs PyPI;
the serving host does not), then inspects the result. The platform is x86-64 Linux with glibc up to ``--glibc``: pip
accepts a wheel only for a platform tag it is given, so every manylinux tag up to that glibc is given (a wheel tagged
only ``manylinux_2_25``, as NVIDIA's CUDA 13 wheels are, is missed by a list that skips 2.25).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

REQUIREMENTS = "requirements.txt"
DEFAULT_GLIBC = "2.34"
"""The oldest glibc SGLang 0.5.23 itself runs on (its wheels are ``manylinux_2_34``)."""

LEGACY_MANYLINUX = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
"""The older manylinux names and the glibc 2.N each stands for (PEP 600)."""


class WheelhouseError(Exception):
    """The wheelhouse cannot be used; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    python_tag: str
    abi_tag: str
    platform_tag: str
    path: Path


def glibc_minor(version: str) -> int:
    match = re.fullmatch(r"2\.(\d+)", version.strip())
    if match is None:
        raise WheelhouseError(f"glibc version {version!r} must look like 2.34 (the serving host's `ldd --version`)")
    return int(match.group(1))


def linux_platforms(glibc: str) -> list[str]:
    """Every x86-64 platform tag pip must be given to accept the wheels a host with this glibc can run."""
    newest = glibc_minor(glibc)
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(5, newest + 1)]
    tags += [f"{name}_x86_64" for name, minor in LEGACY_MANYLINUX.items() if minor <= newest]
    return [*tags, "any"]


def needed_glibc(platform_tags: str) -> int:
    """The glibc minor version a wheel's platform tags need at least (0: no manylinux tag, e.g. ``any``); of a
    compressed tag set such as ``manylinux2014_x86_64.manylinux_2_17_x86_64`` any one suffices, so the lowest."""
    minors = []
    for tag in platform_tags.split("."):
        match = re.fullmatch(r"manylinux_2_(\d+)_\w+", tag)
        if match is not None:
            minors.append(int(match.group(1)))
        elif tag.split("_", 1)[0] in LEGACY_MANYLINUX:
            minors.append(LEGACY_MANYLINUX[tag.split("_", 1)[0]])
    return min(minors, default=0)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel(path: Path) -> Wheel:
    parts = path.name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise WheelhouseError(f"{path.name} is not a wheel file name (name-version[-build]-python-abi-platform.whl)")
    return Wheel(normalize(parts[0]), parts[1], parts[-3], parts[-2], parts[-1], path)


def interpreter_minors(wheel: Wheel) -> set[int]:
    """The CPython 3.N this wheel was built for alone (``cp312-cp312``); empty for ``abi3``, ``py3`` and ``none``
    wheels, which any newer CPython installs too."""
    if "abi3" in wheel.abi_tag.split("."):
        return set()
    return {int(match.group(1)) for tag in wheel.python_tag.split(".")
            if (match := re.fullmatch(r"cp3(\d+)", tag)) is not None}


def runs_on(wheel: Wheel, minor: int) -> bool:
    """Whether CPython 3.minor accepts the wheel's Python and ABI tags, as pip does: ``cp3N`` built for one
    interpreter only; ``cp3N-abi3`` and ``py3N`` from 3.N on; ``py3`` (``py2.py3``) on any."""
    if interpreter_minors(wheel):
        return minor in interpreter_minors(wheel)
    for tag in wheel.python_tag.split("."):
        match = re.fullmatch(r"(?:cp|py)3(\d*)", tag)
        if match is not None and (not match.group(1) or int(match.group(1)) <= minor):
            return True
    return False


def installing_pythons(pins: dict[str, str], wheels: list[Wheel]) -> list[str]:
    """The CPython tags (``cp312``) that can install a wheel of every pin; empty when no pinned wheel is built for
    one interpreter (pure and ``abi3`` wheels only: any CPython new enough). An ``abi3`` wheel's tag is the oldest
    CPython it runs on, not one it is for: ``cp310-abi3`` beside ``cp312-cp312`` torch does not make 3.10 fit."""
    pinned = [wheel for wheel in wheels if pins.get(wheel.name) == wheel.version]
    candidates = sorted({minor for wheel in pinned for minor in interpreter_minors(wheel)})
    fitting = [minor for minor in candidates
               if all(any(runs_on(wheel, minor) for wheel in pinned if wheel.name == name) for name in pins)]
    if candidates and not fitting:
        built_for = {f"cp3{minor}": sorted({wheel.name for wheel in pinned if minor in interpreter_minors(wheel)})
                     for minor in candidates}
        raise WheelhouseError("no one CPython can install all of its wheels ("
                              + "; ".join(f"{tag} only: {', '.join(names)}" for tag, names in built_for.items())
                              + "); rebuild it from its lock for the serving host's --python-version")
    return [f"cp3{minor}" for minor in fitting]


def torch_cuda(wheels: list[Wheel], pins: dict[str, str]) -> str | None:
    """``torch.version.cuda`` of the pinned torch wheel (``13.0``), ``cpu`` for a CPU build, None without torch; read
    from the wheel's ``torch/version.py`` without unpacking the rest."""
    pinned = [wheel for wheel in wheels if wheel.name == "torch" and wheel.version == pins.get("torch")]
    if not pinned:
        return None
    try:
        with zipfile.ZipFile(pinned[0].path) as archive:
            source = archive.read("torch/version.py").decode()
    except (zipfile.BadZipFile, KeyError) as error:
        raise WheelhouseError(f"{pinned[0].path.name} is not a PyTorch wheel ({error}); "
                              "rebuild the wheelhouse") from None
    match = re.search(r"^cuda(?:\s*:[^=\n]*)?=\s*(?:None|'([^']*)'|\"([^\"]*)\")\s*$", source, re.MULTILINE)
    if match is None:
        raise WheelhouseError(f"{pinned[0].path.name}: torch/version.py does not say which CUDA torch was built with")
    return match.group(1) or match.group(2) or "cpu"


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
    try:
        cpython = installing_pythons(pins, wheels)
    except WheelhouseError as error:
        raise WheelhouseError(f"{directory}: {error}") from None
    glibc = max((needed_glibc(wheel.platform_tag) for wheel in wheels), default=0)
    return {
        "path": str(directory),
        "id": digest.hexdigest()[:16],
        "sglang_version": pins.get("sglang"),
        # what the host's nvcc must match to build the extension ("cpu": it cannot; None: no torch pinned)
        "torch_cuda": torch_cuda(wheels, pins),
        # the interpreters that can install it ([] when none is singled out: pure and abi3 wheels only)
        "python_tags": cpython,
        # the oldest glibc the serving host may have ("" when no wheel is manylinux)
        "glibc": f"2.{glibc}" if glibc else "",
        "pip_wheel": pip[-1].path.name,
        "requirements": [f"{name}=={version}" for name, version in pins.items()],
        "files": len(wheels),
        "bytes": sum(wheel.path.stat().st_size for wheel in wheels),
        # what a copy ships, one file at a time (a progress line for each)
        "shipped_files": [{"name": path.name, "bytes": path.stat().st_size}
                          for path in [lock, *(wheel.path for wheel in wheels)]],
    }


def build(lock: Path, directory: Path, python_version: str, platforms: list[str],
          glibc: str = DEFAULT_GLIBC) -> dict[str, object]:
    pins = read_requirements(lock)
    if "pip" not in pins:
        raise WheelhouseError(f"{lock} must pin pip too: it bootstraps the release venv's pip offline")
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--python-version", python_version, "--implementation", "cp",
               "-d", str(directory), "-r", str(lock)]
    for platform in platforms or linux_platforms(glibc):
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
    builder.add_argument("--glibc", default=DEFAULT_GLIBC,
                         help="the oldest glibc among the serving hosts (default %(default)s)")
    builder.add_argument("--platform", action="append", default=[], help="exact platform tags instead of --glibc")
    options = parser.parse_args(argv)
    try:
        if options.action == "inspect":
            result = inspect(options.directory)
        else:
            result = build(options.lock, options.directory, options.python_version, options.platform,
                           options.glibc)
    except (WheelhouseError, OSError) as error:
        print(f"wheelhouse: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
