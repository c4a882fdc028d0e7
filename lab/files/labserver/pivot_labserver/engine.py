"""The lab server's engine: loads the models named on the command line (the target's architecture, dense Qwen3 or
the Qwen3.5/3.6 hybrid, read from its config.json) and serialises generations."""

from __future__ import annotations

import argparse
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from ddtree_runtime.reference import DFlashDrafter, GenerationResult, SpeculativeDecoder, load_dflash, load_target
from ddtree_runtime.reference.decoding import Method
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tokenizer import load_tokenizer

from pivot_labserver.cli import TreeKnobs, reported_algorithm
from pivot_labserver.models import resolve_drafter_dir, resolve_target_dir

log = logging.getLogger("pivot_labserver")

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DecodePlan:
    """How the engine decodes, resolved from the command line and the drafter."""

    method: Method
    draft_tokens: int
    budget: int
    topk: int | None
    reported_algorithm: str | None
    reported_num_draft_tokens: int | None

    @property
    def speculative(self) -> bool:
        return self.reported_algorithm is not None


def plan_decoding(args: argparse.Namespace, knobs: TreeKnobs, block_size: int | None) -> DecodePlan:
    """Map SGLang's speculative flags onto the reference decoders.

    DDTREE/DFLASH: ``draft_tokens = --speculative-num-draft-tokens`` (default: the drafter's block size).
    NEXTN/EAGLE/EAGLE3: the lab has no MTP head, so they decode autoregressively, or with the DFlash chain
    when a DFlash drafter is given; with top-k 1 SGLang forces ``num_draft_tokens = num_steps + 1``.
    """
    algorithm = args.speculative_algorithm
    requested = args.speculative_num_draft_tokens
    if algorithm in ("DDTREE", "DFLASH"):
        assert block_size is not None
        draft_tokens = requested if requested is not None else block_size
        if draft_tokens > block_size:
            raise ValueError(
                f"--speculative-num-draft-tokens {draft_tokens} exceeds the drafter's block_size {block_size}"
            )
        budget = knobs.budget if knobs.budget is not None else draft_tokens - 1
        method: Method = "ddtree" if algorithm == "DDTREE" else "dflash"
        return DecodePlan(method, draft_tokens, budget, knobs.topk, algorithm, draft_tokens)
    if algorithm in ("NEXTN", "EAGLE", "EAGLE3"):
        topk = args.speculative_eagle_topk or 1
        steps = args.speculative_num_steps
        reported = steps + 1 if (topk == 1 and steps is not None) else requested
        if block_size is not None and reported is not None and reported <= block_size:
            return DecodePlan("dflash", reported, 0, None, reported_algorithm(algorithm), reported)
        return DecodePlan("ar", 1, 0, None, reported_algorithm(algorithm), reported)
    return DecodePlan("ar", 1, 0, None, None, None)


@dataclass
class EngineCounters:
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    verify_rounds: int = 0
    accepted_tokens: int = 0
    running: int = 0
    last_throughput: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def avg_accept_length(self) -> float:
        return self.accepted_tokens / self.verify_rounds if self.verify_rounds else 0.0


class LabEngine:
    def __init__(self, args: argparse.Namespace, knobs: TreeKnobs) -> None:
        self.args = args
        self.knobs = knobs
        self.counters = EngineCounters()
        self._generate_lock = threading.Lock()
        self.decoder: SpeculativeDecoder | None = None
        self.plan: DecodePlan | None = None
        self.target_dir: Path | None = None
        self.drafter_dir: Path | None = None
        self.tokenizer: Any = None

    def load(self) -> None:
        args = self.args
        device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = DTYPES.get(args.dtype, torch.float32)
        if args.random_seed is not None:
            torch.manual_seed(args.random_seed)
        self.target_dir = resolve_target_dir(args.model_path)
        target = load_target(self.target_dir, dtype=dtype, device=device)
        log.info("loaded target %s from %s", type(target).__name__, self.target_dir)
        drafter = None
        if args.speculative_draft_model_path:
            self.drafter_dir = resolve_drafter_dir(args.speculative_draft_model_path, target.config)
            log.info("loading drafter from %s", self.drafter_dir)
            drafter = DFlashDrafter(load_dflash(self.drafter_dir, dtype=dtype, device=device), target)
        block_size = drafter.block_size if drafter is not None else None
        self.plan = plan_decoding(args, self.knobs, block_size)
        self.decoder = SpeculativeDecoder(target, drafter)
        self.tokenizer = load_tokenizer(Path(args.tokenizer_path) if args.tokenizer_path else self.target_dir)
        log.info("decoding plan: %s", self.plan)

    @property
    def vocab_size(self) -> int:
        assert self.decoder is not None
        return self.decoder.target.config.vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        assert self.decoder is not None
        return frozenset(self.decoder.target.config.eos_token_id) | self.tokenizer.eos_token_ids

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        assert self.decoder is not None and self.plan is not None
        with self.counters.lock:
            self.counters.running += 1
        try:
            with self._generate_lock:
                result = self.decoder.generate(
                    prompt_ids,
                    params,
                    self.plan.method,
                    draft_tokens=self.plan.draft_tokens,
                    budget=self.plan.budget,
                    max_topk=self.plan.topk,
                )
        finally:
            with self.counters.lock:
                self.counters.running -= 1
        self._count(result)
        return result

    def _count(self, result: GenerationResult) -> None:
        stats = result.stats
        elapsed = sum(stats.stage_seconds.values())
        with self.counters.lock:
            c = self.counters
            c.requests += 1
            c.prompt_tokens += stats.prompt_tokens
            c.generation_tokens += len(result.tokens)
            if self.plan is not None and self.plan.speculative:
                c.verify_rounds += stats.rounds
                c.accepted_tokens += sum(stats.acceptance_lengths)
            if elapsed > 0:
                c.last_throughput = len(result.tokens) / elapsed
