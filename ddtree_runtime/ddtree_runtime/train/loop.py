"""Time-boxed training of the target LM and of its DFlash drafter.

Target: next-byte cross-entropy on random windows of the corpus stream, AdamW, linear warm-up then cosine
decay over the *time* budget (so a run ends on schedule on any hardware).

Drafter (the DFlash recipe, self-distilled): the frozen target first writes greedy continuations of
corpus prompts (half random windows, half chat prompts ending at ``<|im_start|>assistant\\n``). The drafter
then trains on those sequences: random anchors per sequence, each anchor opening a block
``[anchor token, mask x 15]`` that attends to the target's fused features of every position before the
anchor and bidirectionally to its own slots; slot k is trained to predict the token at ``anchor + k`` with
cross-entropy weighted ``exp(-(k - 1) / gamma)``. The target's embeddings and LM head are shared and frozen.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from ddtree_runtime.reference import DFlashDraftModel, TargetModel
from ddtree_runtime.train.corpus import TokenStream, random_windows, windows_ending_at
from ddtree_runtime.train.forward import PairRopes, RopeTable, drafter_block_logits, greedy_continue, target_forward


@dataclass(frozen=True)
class Schedule:
    seconds: float
    max_steps: int
    batch: int
    lr: float
    warmup_steps: int = 100
    min_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    log_every: int = 50

    def lr_at(self, step: int, elapsed_fraction: float) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = min(max(elapsed_fraction, step / self.max_steps), 1.0)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_fraction + (1 - self.min_lr_fraction) * cosine)


@dataclass(frozen=True)
class DraftSettings:
    prompt_tokens: int = 128
    new_tokens: int = 256
    distill_batch: int = 512
    distill_seconds: float = 20.0
    distill_max_batches: int = 64
    anchors_per_sequence: int = 32
    gamma: float = 7.0


def autocast(device: torch.device) -> Any:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def make_optimizer(model: torch.nn.Module, schedule: Schedule) -> torch.optim.Optimizer:
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2]
    no_decay = [p for p in trainable if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": schedule.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=schedule.lr, betas=(0.9, 0.95), fused=trainable[0].is_cuda)


class Clock:
    def __init__(self, seconds: float) -> None:
        self.begin = time.monotonic()
        self.seconds = seconds

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.begin

    @property
    def fraction(self) -> float:
        return self.elapsed / self.seconds if self.seconds > 0 else 1.0

    def expired(self) -> bool:
        return self.elapsed >= self.seconds


def _record(log: list[dict[str, Any]], entry: dict[str, Any]) -> None:
    log.append(entry)
    print(json.dumps(entry), file=sys.stderr, flush=True)


def _step(optimizer: torch.optim.Optimizer, model: torch.nn.Module, loss: torch.Tensor, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()


def lm_loss(model: TargetModel, windows: torch.Tensor, rope: RopeTable) -> torch.Tensor:
    logits, _unused = target_forward(model, windows[:, :-1], rope)
    assert logits is not None
    return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())


def train_target(
    model: TargetModel,
    stream: TokenStream,
    schedule: Schedule,
    *,
    seq_len: int,
    generator: torch.Generator,
    log: list[dict[str, Any]],
) -> int:
    """Train in place until the time or step budget runs out; returns the number of steps."""
    device = model.device
    rope = RopeTable(model.rotary.inv_freq, seq_len + 1, device)
    optimizer = make_optimizer(model, schedule)
    model.train()
    clock = Clock(schedule.seconds)
    step = 0
    while step < schedule.max_steps and not clock.expired():
        windows = random_windows(stream, schedule.batch, seq_len + 1, generator).to(device, non_blocking=True)
        with autocast(device):
            loss = lm_loss(model, windows, rope)
        _step(optimizer, model, loss, schedule.lr_at(step, clock.fraction))
        step += 1
        if step % schedule.log_every == 0 or step == 1:
            _record(log, {"phase": "target", "step": step, "seconds": round(clock.elapsed, 2), "loss": loss.item()})
    model.eval()
    return step


@torch.no_grad()
def mean_loss(model: TargetModel, stream: TokenStream, seq_len: int, batches: int, batch: int) -> float:
    """Mean next-token loss (nats per byte) over ``batches`` fixed-seed windows of ``stream``."""
    generator = torch.Generator().manual_seed(1234)
    rope = RopeTable(model.rotary.inv_freq, seq_len + 1, model.device)
    total = 0.0
    for _unused in range(batches):
        windows = random_windows(stream, batch, seq_len + 1, generator).to(model.device)
        with autocast(model.device):
            total += lm_loss(model, windows, rope).item()
    return total / batches


def distill_prompts(stream: TokenStream, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """Half random corpus windows, half windows ending where a chat answer starts."""
    chat = count // 2 if stream.chat_starts.numel() else 0
    pieces = [random_windows(stream, count - chat, length, generator)]
    if chat:
        picks = torch.randint(0, stream.chat_starts.numel(), (chat,), generator=generator)
        ends = stream.chat_starts[picks].clamp(min=length)
        pieces.append(windows_ending_at(stream, ends, length))
    return torch.cat(pieces)


@torch.no_grad()
def distill_sequences(
    target: TargetModel, stream: TokenStream, settings: DraftSettings, generator: torch.Generator
) -> torch.Tensor:
    """Prompts plus the target's own greedy continuations, ``[N, prompt_tokens + new_tokens]`` on its device."""
    device = target.device
    rope = RopeTable(target.rotary.inv_freq, settings.prompt_tokens + settings.new_tokens + 1, device)
    dtype = torch.bfloat16 if device.type == "cuda" else target.dtype
    clock = Clock(settings.distill_seconds)
    batches = []
    while len(batches) < settings.distill_max_batches and (not batches or not clock.expired()):
        prompts = distill_prompts(stream, settings.distill_batch, settings.prompt_tokens, generator).to(device)
        with autocast(device):
            batches.append(greedy_continue(target, prompts, settings.new_tokens, rope, dtype))
    return torch.cat(batches)


def slot_weights(block_size: int, gamma: float, device: torch.device) -> torch.Tensor:
    return torch.exp(-torch.arange(block_size - 1, device=device, dtype=torch.float32) / gamma)


@dataclass
class DraftBatchResult:
    loss: torch.Tensor
    chain_tau: torch.Tensor
    """Mean DFlash-chain acceptance length (1 + accepted argmax drafts) over the batch's blocks."""


def drafter_batch(
    drafter: DFlashDraftModel,
    target: TargetModel,
    sequences: torch.Tensor,
    settings: DraftSettings,
    *,
    ropes: PairRopes,
    generator: torch.Generator,
) -> DraftBatchResult:
    size = drafter.config.block_size
    batch, length = sequences.shape
    anchors = torch.randint(1, length - size + 1, (batch, settings.anchors_per_sequence), generator=generator)
    anchors = anchors.to(sequences.device)
    with torch.no_grad():
        _unused, features = target_forward(
            target, sequences, ropes.target, capture_layers=drafter.config.target_layer_ids, with_logits=False
        )
    assert features is not None
    logits = drafter_block_logits(drafter, target, features, sequences, anchors, rope=ropes.drafter).float()
    offsets = torch.arange(1, size, device=sequences.device)
    labels = sequences.gather(1, (anchors[:, :, None] + offsets).flatten(1)).view(batch, -1, size - 1)
    per_token = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(labels)
    weights = slot_weights(size, settings.gamma, sequences.device)
    loss = (per_token * weights).sum(-1).mean() / weights.sum()
    correct = (logits.argmax(-1) == labels).long()
    chain_tau = 1 + torch.cumprod(correct, dim=-1).sum(-1).float().mean()
    return DraftBatchResult(loss, chain_tau.detach())


def train_drafter(
    drafter: DFlashDraftModel,
    target: TargetModel,
    sequences: torch.Tensor,
    *,
    schedule: Schedule,
    settings: DraftSettings,
    generator: torch.Generator,
    log: list[dict[str, Any]],
) -> int:
    device = target.device
    target.requires_grad_(False)
    ropes = PairRopes.of(target, drafter, sequences.shape[1] + drafter.config.block_size, device)
    optimizer = make_optimizer(drafter, schedule)
    drafter.train()
    clock = Clock(schedule.seconds)
    step = 0
    while step < schedule.max_steps and not clock.expired():
        rows = torch.randint(0, sequences.shape[0], (schedule.batch,), generator=generator).to(device)
        with autocast(device):
            result = drafter_batch(drafter, target, sequences[rows], settings, ropes=ropes, generator=generator)
        _step(optimizer, drafter, result.loss, schedule.lr_at(step, clock.fraction))
        step += 1
        if step % schedule.log_every == 0 or step == 1:
            _record(
                log,
                {
                    "phase": "drafter",
                    "step": step,
                    "seconds": round(clock.elapsed, 2),
                    "loss": result.loss.item(),
                    "chain_tau": result.chain_tau.item(),
                },
            )
    drafter.eval()
    return step


@torch.no_grad()
def drafter_chain_tau(
    drafter: DFlashDraftModel,
    target: TargetModel,
    sequences: torch.Tensor,
    settings: DraftSettings,
    batch: int,
) -> float:
    """Mean teacher-forced DFlash-chain acceptance on ``sequences`` (fixed-seed anchors)."""
    generator = torch.Generator().manual_seed(4321)
    ropes = PairRopes.of(target, drafter, sequences.shape[1] + drafter.config.block_size, target.device)
    taus = []
    for begin in range(0, sequences.shape[0], batch):
        with autocast(target.device):
            result = drafter_batch(
                drafter, target, sequences[begin : begin + batch], settings, ropes=ropes, generator=generator
            )
        taus.append(result.chain_tau.item())
    return sum(taus) / len(taus)
