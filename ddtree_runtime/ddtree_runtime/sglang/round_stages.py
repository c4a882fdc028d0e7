"""Profiler ranges over a DDTree decode round's stages, so a trace of a real server says where a round's time goes.

Pure PyTorch (no SGLang import). The worker opens them only while a torch profiler runs in its process (SGLang's
``/start_profile``); :mod:`ddtree_runtime.acceptance.round_trace` attributes the GPU's work to them.
"""

from __future__ import annotations

from typing import Any

import torch

RANGE_PREFIX = "ddtree."

ROUND_STAGES = ("draft", "topk", "tree", "verify", "accept", "commit")
"""A decode round's stages, as the profiler ranges ``ddtree.<stage>`` name them: the drafter's forward, its
positions' top-k over the target's LM head, the tree and verify inputs, the target's verify forward, the tree walk
(grammar, sampling, logprobs) and the KV, mamba and drafter commits."""


class RoundStages:
    """Profiler ranges over one round's consecutive stages (``ddtree.<stage>``), opened only while a torch profiler
    runs in this process (SGLang's ``/start_profile``): otherwise :meth:`enter` costs one attribute read."""

    def __init__(self) -> None:
        self._profiling = bool(torch.autograd.profiler._is_profiler_enabled)
        self._open: Any = None

    def enter(self, stage: str) -> None:
        """Close the current stage's range and open ``stage``'s (one of :data:`ROUND_STAGES`)."""
        if stage not in ROUND_STAGES:
            raise ValueError(f"unknown round stage {stage!r}; the stages are {', '.join(ROUND_STAGES)}")
        self.close()
        if self._profiling:
            self._open = torch.profiler.record_function(RANGE_PREFIX + stage)
            self._open.__enter__()

    def close(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
