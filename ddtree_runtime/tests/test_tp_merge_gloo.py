"""Tensor parallelism on CPU: two processes over gloo, each with half the vocabulary, build the same trees.

The worker's cross-rank step (:func:`gather_merged_topk`, fed by ``torch.distributed`` the way SGLang's
``tp_group.all_gather(t, dim=0)`` concatenates) must give every rank the top-k of the whole vocabulary, so each rank
builds exactly the tree one process builds from the full logits, and the round digests agree across ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ddtree_runtime.sglang.tree_inputs import (
    gather_merged_topk,
    local_topk,
    round_digest,
    sglang_verify_inputs,
)
from ddtree_runtime.tree import build_tree_batch_from_topk, depth_log_probs

WORLD = 2
BATCH, DEPTH, VOCAB, K, BUDGET = 3, 15, 96, 8, 40


def round_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(BATCH * DEPTH, VOCAB, generator=generator) * 2
    logits[:, 10] = logits[:, 60]  # a tie across the two shards: the lower id must win on both ranks
    roots = torch.randint(0, VOCAB, (BATCH,), generator=generator)
    seq_lens = torch.randint(1, 40, (BATCH,), generator=generator)
    return logits, roots, seq_lens


def round_from_topk(log_probs: torch.Tensor, ids: torch.Tensor, roots: torch.Tensor,
                    seq_lens: torch.Tensor) -> dict[str, list]:
    shaped = (log_probs.view(BATCH, DEPTH, K), ids.view(BATCH, DEPTH, K))
    trees = build_tree_batch_from_topk(*shaped, torch.full((BATCH,), BUDGET))
    tensors = sglang_verify_inputs(trees, roots, seq_lens, width=BUDGET + 1)
    return {"ids": ids.tolist(), "log_probs": log_probs.tolist(), "candidates": tensors.candidates.tolist(),
            "next_token": tensors.retrieve_next_token.tolist(), "digest": round_digest(tensors).tolist()}


def rank_main(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        logits, roots, seq_lens = round_inputs()
        shard = VOCAB // WORLD
        values, ids, log_z = local_topk(logits[:, rank * shard:(rank + 1) * shard], K, rank * shard)

        def all_gather(tensor: torch.Tensor) -> torch.Tensor:
            parts = [torch.empty_like(tensor) for _unused in range(WORLD)]
            dist.all_gather(parts, tensor)
            return torch.cat(parts, dim=0)

        log_probs, top_ids = gather_merged_topk(values, ids, log_z, K, world=WORLD, all_gather=all_gather)
        result = round_from_topk(log_probs, top_ids, roots, seq_lens)
        digests = all_gather(torch.tensor(result["digest"])).view(WORLD, -1)
        result["digests_of_all_ranks"] = digests.tolist()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this torch build")
def test_two_gloo_ranks_build_the_single_process_trees(tmp_path: Path) -> None:
    mp.spawn(rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    logits, roots, seq_lens = round_inputs()
    expected_log_probs, expected_ids = depth_log_probs(logits, K)
    single = round_from_topk(expected_log_probs, expected_ids, roots, seq_lens)
    for rank in ranks:
        assert rank["ids"] == single["ids"]
        torch.testing.assert_close(torch.tensor(rank["log_probs"]), expected_log_probs, rtol=0, atol=1e-6)
        assert rank["candidates"] == single["candidates"] and rank["next_token"] == single["next_token"]
        assert rank["digest"] == single["digest"]
        assert rank["digests_of_all_ranks"] == [single["digest"]] * WORLD


def test_digest_tells_different_trees_apart() -> None:
    logits, roots, seq_lens = round_inputs()
    log_probs, ids = depth_log_probs(logits, K)
    first = round_from_topk(log_probs, ids, roots, seq_lens)["digest"]
    other_roots = roots.clone()
    other_roots[1] += 1
    second = round_from_topk(log_probs, ids, other_roots, seq_lens)["digest"]
    assert first[0] == second[0] and first[2] == second[2] and first[1] != second[1]
