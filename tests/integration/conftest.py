from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import integration_lab
import labctl
import pytest


@pytest.fixture(scope="package")
def lab_up() -> Iterator[float]:
    """The lab, up for the integration tests; yields how long `lab up` took (seconds). Down at the end, and nothing of
    it may be left on this machine."""
    started = time.monotonic()
    labctl.lab("up")
    took = time.monotonic() - started
    try:
        integration_lab.install_jobctl()
        yield took
    finally:
        labctl.lab("down")
        labctl.assert_nothing_left()


@pytest.fixture
def start_job(lab_up: float, request: pytest.FixtureRequest) -> Iterator[Callable[..., integration_lab.TrainJob]]:
    """Starts training jobs in ct200 named after the test; whatever is left of them is killed and their files removed
    when the test ends, so every test starts from a quiet ct200."""
    names: list[str] = []
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]

    def start(*trainer_flags: str, nproc_per_node: int = 0, wait_steps: int = 3) -> integration_lab.TrainJob:
        name = f"{base}-{len(names)}"
        names.append(name)  # before the launch, so that a failed start is cleaned up too
        job = integration_lab.start_job(name, *trainer_flags, nproc_per_node=nproc_per_node)
        if wait_steps:
            job.wait_for_step(wait_steps)
        return job

    yield start
    for name in names:
        leftover = integration_lab.TrainJob(name=name, pid=0)
        leftover.kill()
        leftover.remove_files()
