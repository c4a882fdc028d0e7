"""Fixtures for the tests of the lab's test doubles (run on the host, no lab needed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_doubles_support import TEST_TOKEN_VARIABLE, ProcessTracker, SmiEnvironment, Trainsim, processes_with_token


@pytest.fixture
def smi(tmp_path: Path) -> SmiEnvironment:
    return SmiEnvironment(tmp_path)


@pytest.fixture
def processes(smi: SmiEnvironment) -> Iterator[ProcessTracker]:
    tracker = ProcessTracker()
    yield tracker
    leftovers = processes_with_token(smi.env[TEST_TOKEN_VARIABLE])
    tracker.track(*leftovers)
    tracker.cleanup(smi.env[TEST_TOKEN_VARIABLE])


@pytest.fixture
def trainsim(smi: SmiEnvironment, processes: ProcessTracker) -> Trainsim:
    return Trainsim(smi, processes)
