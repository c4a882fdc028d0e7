"""The playbook tests share one lab for the package. Each test asks for the state it starts from (training running
with given trainer flags, the NEXTN baseline serving); the fixtures reach it cheaply from whatever the previous test
left, instead of recreating the lab. Modules are named so that pytest's order needs the fewest full pivots."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import labctl
import pivotlab
import pytest


@pytest.fixture(scope="package")
def lab_up() -> Iterator[None]:
    """A fresh lab for the package (the NEXTN unit serving, no training job yet); down at the end, and nothing of it
    may be left on this machine."""
    labctl.lab("up")
    try:
        yield
    finally:
        labctl.lab("down")
        labctl.assert_nothing_left()


@pytest.fixture
def baseline(lab_up: None) -> pivotlab.Serving:
    """The NEXTN baseline serves on pro6000 (rolled back to if something else does)."""
    return pivotlab.ensure_baseline()


@pytest.fixture
def training(lab_up: None) -> Callable[..., pivotlab.Training]:
    """Call with trainer flags: that job runs on ct200 with all its processes (started with `lab/lab train`)."""
    return pivotlab.ensure_training


@pytest.fixture
def no_training(lab_up: None) -> pivotlab.Training:
    """No training job on ct200 (stopped by an earlier pivot): the stop phase finds it already gone."""
    return pivotlab.ensure_no_training()
