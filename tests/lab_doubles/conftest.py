"""Fixtures for the tests of the lab's test doubles (run on the host, no lab needed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_doubles_support import ProcessTracker, SmiEnvironment


@pytest.fixture
def processes() -> Iterator[ProcessTracker]:
    tracker = ProcessTracker()
    yield tracker
    tracker.cleanup()


@pytest.fixture
def smi(tmp_path: Path) -> SmiEnvironment:
    return SmiEnvironment(tmp_path)
