"""Smoke check and timing of the PyTorch paths on an accelerator (or any torch device).

Checks, on ``--device``: trees from device logits have the structure of trees from the same logits on the
CPU, and bit-identical scores when both searches get the same top-k arrays (heap and batched paths); the
batched greedy walk and compaction indices agree with the per-tree ones; greedy DDTree and DFlash decoding
equal autoregressive decoding with a small random float32 pair; and the target KV cache after DDTree
compaction equals a chain prefill. Then times ``build_tree`` per round from device-resident
``[15, 151936]`` logits (top-k/logsumexp on the device, heap on the host).

    python -m ddtree_runtime.bench.device_smoke --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ddtree_runtime.reference.tiny import tiny_decoder, tiny_pair
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tree import (
    build_tree,
    build_tree_batch,
    build_tree_batch_from_topk,
    build_tree_from_topk,
    depth_log_probs,
)
from ddtree_runtime.verify import follow_greedy, follow_greedy_batch, kv_compaction_indices, kv_compaction_indices_batch


def check_trees(device: torch.device) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 15, 5000, generator=generator) * 3
    logits[1, :, 2500:] = float("-inf")
    logits[2] = torch.round(logits[2])  # many exact ties
    budgets = [64, 0, 200, 17]
    on_device = build_tree_batch(logits.to(device), budgets)
    # Float32 logsumexp differs by ulps across backends, so scores are compared from identical top-k arrays;
    # tree structure is compared from the logits themselves.
    device_lp, device_ids = depth_log_probs(logits.to(device), max(budgets))
    from_topk = build_tree_batch_from_topk(device_lp, device_ids, budgets)
    structure = ("token_ids", "depths", "parents", "visibility", "ranks")
    for b, budget in enumerate(budgets):
        cpu = build_tree(logits[b], budget)
        for tree in (on_device.tree(b), build_tree(logits[b].to(device), budget)):
            for name in structure:
                assert torch.equal(getattr(tree, name).cpu(), getattr(cpu, name)), (b, name)
        same_input = build_tree_from_topk(device_lp[b].cpu(), device_ids[b].cpu(), budget)
        for tree in (from_topk.tree(b), on_device.tree(b), build_tree(logits[b].to(device), budget)):
            for name in (*structure, "log_probs"):
                assert torch.equal(getattr(tree, name).cpu(), getattr(same_input, name)), (b, name)
        score_gap = (on_device.tree(b).log_probs.cpu() - cpu.log_probs).abs().max() if budget else 0.0
        assert score_gap < 1e-5, (b, score_gap)
    lists = on_device.retrieve_lists()
    predict = torch.randint(0, 5000, (4, on_device.width), generator=generator)
    for b in range(4):  # make the walks go deep: predict each node's first child
        tree = on_device.tree(b)
        for node, children in enumerate(tree.child_maps):
            if children:
                predict[b, node] = min(children, key=children.get)
    accept, count, bonus = follow_greedy_batch(
        on_device.verify_input_ids(torch.zeros(4, dtype=torch.long, device=device)),
        lists.retrieve_next_token,
        lists.retrieve_next_sibling,
        predict.to(device),
        15,
    )
    starts = torch.tensor([5, 9, 0, 100], device=device)
    request, src, dst = kv_compaction_indices_batch(starts, accept, count)
    for b in range(4):
        accepted, expected_bonus = follow_greedy(on_device.tree(b), predict[b, : int(on_device.num_nodes[b]) + 1])
        assert accept[b, : len(accepted)].tolist() == accepted and int(bonus[b]) == expected_bonus
        ref_src, ref_dst = kv_compaction_indices(int(starts[b]), accepted)
        assert src[request == b].tolist() == ref_src.tolist() and dst[request == b].tolist() == ref_dst.tolist()
    print(f"trees: device == cpu for budgets {budgets}; walks reach depth {int(count.max()) - 1}")


def check_decoding(device: torch.device) -> None:
    target, drafter = tiny_pair(vocab=64, seed=1, sliding=True)
    decoder = tiny_decoder(target.to(device), drafter.to(device))
    params = SamplingParams(max_new_tokens=48)
    for prompt in ([3, 17, 5], [1] * 20, list(range(40))):
        expected = decoder.generate(prompt, params, "ar").tokens
        assert decoder.generate(prompt, params, "dflash", draft_tokens=16).tokens == expected
        for budget in (1, 16, 128):
            result = decoder.generate(prompt, params, "ddtree", draft_tokens=16, budget=budget, keep_cache=True)
            assert result.tokens == expected, budget
            cache = result.target_cache
            assert cache is not None
            committed = torch.tensor(prompt + result.tokens[:-1], device=device)
            fresh = target.new_cache()
            target(committed, torch.arange(len(committed), device=device), fresh)
            for layer in range(cache.num_layers):
                for ours, ref in zip(cache.live(layer), fresh.live(layer), strict=True):
                    assert torch.allclose(ours, ref, atol=1e-4), (budget, layer)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    assert len(decoder.generate([1, 2], sampled, "ddtree", budget=32).tokens) == 16
    print("decoding: greedy DDTree (budgets 1/16/128) == DFlash == AR; KV after compaction == chain prefill")


def time_tree_build(device: torch.device, rounds: int) -> None:
    generator = torch.Generator().manual_seed(0)
    print("| budget | build_tree from device logits, median ms | nodes |")
    print("|---|---|---|")
    for budget in (16, 32, 64, 128, 256, 512, 1024):
        samples = []
        for _unused in range(rounds):
            logits = torch.randn(15, 151936, generator=generator)
            logits[:, 7] += 14.0
            logits = logits.to(device)
            if device.type == "cuda":
                torch.cuda.synchronize()
            begin = time.perf_counter()
            tree = build_tree(logits, budget)
            samples.append((time.perf_counter() - begin) * 1e3)
        print(f"| {budget} | {statistics.median(samples):.2f} | {tree.num_nodes} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    check_trees(device)
    check_decoding(device)
    time_tree_build(device, args.rounds)


if __name__ == "__main__":
    main()
