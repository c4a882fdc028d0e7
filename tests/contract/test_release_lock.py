"""The release lock (requirements/release-sglang-0.5.23-cp312.txt) is a set pip can install offline: every requirement
of a locked package whose metadata the contract venv holds at the locked version (SGLang 0.5.23 itself, torch
2.14.1, ...) is pinned in the lock and satisfied by its pin, for the serving host's CPython 3.12 on x86-64 Linux.

The hand-made lock before it failed its first real install ("No matching distribution found for cuda-python>=12.0")
and pinned sentencepiece 0.2.3 where SGLang pins 0.2.1; nothing had installed it from scratch."""

from __future__ import annotations

import re
from email.parser import Parser

import pytest
from contract_support import REPO, SGLANG_VENV
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

LOCK = REPO / "requirements" / "release-sglang-0.5.23-cp312.txt"
SERVING_HOST = {"python_version": "3.12", "python_full_version": "3.12.1", "implementation_name": "cpython",
                "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
                "platform_machine": "x86_64", "os_name": "posix", "extra": ""}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock() -> dict[str, str]:
    pins = {}
    for raw in LOCK.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[normalize(name)] = version
    return pins


def installed_metadata() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, Requires-Dist lines) of every distribution in the contract venv."""
    found = {}
    for info in (SGLANG_VENV / "lib").glob("python3*/site-packages/*.dist-info/METADATA"):
        metadata = Parser().parsestr(info.read_text(errors="replace"), headersonly=True)
        found[normalize(metadata["Name"])] = (metadata["Version"], metadata.get_all("Requires-Dist") or [])
    return found


def unmet(requirement: Requirement, pins: dict[str, str]) -> str | None:
    if requirement.marker is not None and not requirement.marker.evaluate(SERVING_HOST):
        return None
    pinned = pins.get(normalize(requirement.name))
    if pinned is None:
        return f"{requirement} is not in the lock"
    if not SpecifierSet(str(requirement.specifier)).contains(pinned, prereleases=True):
        return f"{requirement} is not met by the lock's {requirement.name}=={pinned}"
    return None


def test_the_lock_holds_every_requirement_of_its_packages_at_a_version_that_meets_it() -> None:
    installed = installed_metadata()
    if "sglang" not in installed:
        pytest.skip(f"{SGLANG_VENV} is missing: run `lab/setup.sh sglang` to build the SGLang 0.5.23 contract venv")
    pins = read_lock()
    checked = {name for name, (version, _requires) in installed.items() if pins.get(name) == version}
    assert {"sglang", "torch"} <= checked, "the contract venv's SGLang and torch are the lock's"
    problems = sorted({f"{name}: {problem}" for name in checked for line in installed[name][1]
                       if (problem := unmet(Requirement(line), pins)) is not None})
    assert not problems, "the release lock would not install offline:\n" + "\n".join(problems)
