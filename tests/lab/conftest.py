from __future__ import annotations

import time
from collections.abc import Iterator

import labctl
import pytest


@pytest.fixture(scope="package")
def lab_up() -> Iterator[float]:
    """The lab, up for the tests of this package; yields how long `lab up` took (seconds)."""
    started = time.monotonic()
    labctl.lab("up")
    took = time.monotonic() - started
    yield took
    labctl.lab("down")
    labctl.assert_nothing_left()
