"""The lab hosts' cache of code compiled from zip archives (lab/files/pivotlab_zipimport_cache.py): each run imports
what a run without the cache would, tracebacks name this run's archive, and a changed, corrupt or unwritable cache
never serves stale code or stops an import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

LAB_FILES = Path(__file__).resolve().parents[2] / "lab" / "files"

MODULE = '''
VALUE = {value}


def fail():
    def inner():
        raise ValueError("from inside the zip")
    inner()
'''

# What an AnsiballZ run does: the archive first on sys.path, then import from it. The cache is imported first, as the
# .pth file does at interpreter start.
PROBE = '''
import json, sys, traceback
import pivotlab_zipimport_cache
sys.path.insert(0, sys.argv[1])
import payload.module as module
try:
    module.fail()
except ValueError as error:
    frames = [frame.filename for frame in traceback.extract_tb(error.__traceback__)][1:]
print(json.dumps({"value": module.VALUE, "frames": frames, "file": module.__file__}))
'''


# The same import, counting what the cache does: disk entries read and sources compiled.
COUNTING_PROBE = '''
import json, sys
import pivotlab_zipimport_cache as cache
counts = {"reads": 0, "compiles": 0}
load, compile_source = cache._load, cache._compile_source

def counted_load(*args):
    counts["reads"] += 1
    return load(*args)

def counted_compile(*args):
    counts["compiles"] += 1
    return compile_source(*args)

cache._load, cache._compile_source = counted_load, counted_compile
sys.path.insert(0, sys.argv[1])
import payload.module as module
print(json.dumps({"value": module.VALUE, **counts}))
'''


def write_archive(path: Path, value: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("payload/__init__.py", "")
        archive.writestr("payload/module.py", MODULE.format(value=value))
    return path


def import_from(archive: Path, cache: Path, probe: str = PROBE) -> dict:
    environment = {**os.environ, "PIVOT_LAB_PYC_CACHE": str(cache), "PYTHONPATH": str(LAB_FILES)}
    result = subprocess.run([sys.executable, "-c", probe, str(archive)], env=environment, capture_output=True,
                            text=True, check=True)
    return json.loads(result.stdout)


def entries(cache: Path) -> dict[str, float]:
    return {path.name: path.stat().st_mtime_ns for path in cache.iterdir()} if cache.is_dir() else {}


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def test_a_second_run_reuses_the_code_and_its_tracebacks_name_its_own_archive(tmp_path: Path, cache: Path) -> None:
    first_archive = write_archive(tmp_path / "run1" / "payload.zip", value=1)
    first = import_from(first_archive, cache)
    stored = entries(cache)
    second_archive = write_archive(tmp_path / "run2" / "payload.zip", value=1)
    second = import_from(second_archive, cache)

    assert len(stored) == 2  # payload/__init__.py and payload/module.py
    assert entries(cache) == stored  # read, not written again
    assert first["value"] == second["value"] == 1
    inside = f"{os.sep}payload{os.sep}module.py"
    assert first["frames"] == [f"{first_archive}{inside}"] * 2
    assert second["frames"] == [f"{second_archive}{inside}"] * 2  # the function and the one nested in it
    assert second["file"] == f"{second_archive}{inside}"


def test_one_import_reads_each_entry_once_and_compiles_nothing_the_cache_holds(tmp_path: Path, cache: Path) -> None:
    """zipimport compiles a module twice in one import (for its spec's filename, then to run it); the second is
    answered from memory, so a warm cache costs one read per module."""
    cold = import_from(write_archive(tmp_path / "run1" / "payload.zip", value=1), cache, COUNTING_PROBE)
    warm = import_from(write_archive(tmp_path / "run2" / "payload.zip", value=1), cache, COUNTING_PROBE)

    assert cold == {"value": 1, "reads": 2, "compiles": 2}  # nothing stored yet: each module compiled once
    assert warm == {"value": 1, "reads": 2, "compiles": 0}


def test_a_changed_source_is_compiled_anew(tmp_path: Path, cache: Path) -> None:
    import_from(write_archive(tmp_path / "run1" / "payload.zip", value=1), cache)
    changed = import_from(write_archive(tmp_path / "run2" / "payload.zip", value=2), cache)

    assert changed["value"] == 2
    assert len(entries(cache)) == 3


def test_a_corrupt_entry_is_compiled_anew_and_replaced(tmp_path: Path, cache: Path) -> None:
    import_from(write_archive(tmp_path / "run1" / "payload.zip", value=1), cache)
    for garbage, entry in zip((b"", b"\x00not marshal", b"i\x07\x00\x00\x00"), sorted(cache.iterdir()), strict=False):
        entry.write_bytes(garbage)  # empty, unreadable, and a marshalled int instead of code

    again = import_from(write_archive(tmp_path / "run2" / "payload.zip", value=1), cache)

    assert again["value"] == 1
    assert again["frames"] == [f"{tmp_path / 'run2' / 'payload.zip'}{os.sep}payload{os.sep}module.py"] * 2
    assert all(entry.stat().st_size > 16 for entry in cache.iterdir())


def test_an_unwritable_cache_costs_only_the_compilation(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")

    result = import_from(write_archive(tmp_path / "run1" / "payload.zip", value=3), blocked / "cache")

    assert result["value"] == 3
    assert blocked.read_text() == "not a directory"
