from __future__ import annotations

import pytest
import torch
from ddtree_runtime.reference import SpeculativeDecoder
from ddtree_runtime.reference.tiny import tiny_decoder, tiny_pair

# Tiny models: two threads make float64 GEMMs thousands of times slower on small shapes (OpenMP contention).
torch.set_num_threads(1)


def make_decoder(vocab: int = 32, seed: int = 0, std: float = 0.3, sliding: bool = False) -> SpeculativeDecoder:
    """A float64 random target + drafter pair (see ddtree_runtime.reference.tiny)."""
    target, drafter = tiny_pair(vocab, seed, std=std, sliding=sliding)
    return tiny_decoder(target.double(), drafter.double())


@pytest.fixture(scope="session")
def decoder() -> SpeculativeDecoder:
    return make_decoder()
