"""The suite's prompts as token ids of the shipped tiny pair (its byte tokenizer), and the load mix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddtree_runtime.eval.tasks import CODING_TASKS, HELD_OUT_PROMPTS, load_prompt_file
from ddtree_runtime.tokenizer import ByteTokenizer

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
TARGET_DIR = MODELS_DIR / "pivot-coder-tiny"
DRAFTER_DIR = MODELS_DIR / "pivot-coder-tiny-dflash"
HYBRID_TARGET_DIR = MODELS_DIR / "pivot-coder-tiny-hybrid"
HYBRID_DRAFTER_DIR = MODELS_DIR / "pivot-coder-tiny-hybrid-dflash"
STOP_TOKEN_IDS = sorted(ByteTokenizer.eos_token_ids)


@dataclass(frozen=True)
class Prompt:
    name: str
    input_ids: list[int]


def suite_prompts() -> list[Prompt]:
    """The 12 coding tasks and the 12 held-out stdlib prompts (24), tokenized."""
    tokenizer = ByteTokenizer()
    texts = [*CODING_TASKS, *load_prompt_file(HELD_OUT_PROMPTS)]
    return [Prompt(p.name, tokenizer.encode(p.text)) for p in texts]


@dataclass(frozen=True)
class LoadRequest:
    name: str
    input_ids: list[int]
    max_new_tokens: int


def load_mix(prompts: list[Prompt], count: int = 16, longest: int = 256) -> list[LoadRequest]:
    """``count`` requests of mixed prompt and output lengths (outputs 16..``longest`` new tokens)."""
    lengths = [16 + (longest - 16) * i // max(count - 1, 1) for i in range(count)]
    ordered = sorted(prompts, key=lambda p: len(p.input_ids))
    requests = []
    for i in range(count):
        prompt = ordered[(i * 7) % len(ordered)]  # interleave short and long prompts
        requests.append(LoadRequest(f"{prompt.name}#{lengths[i]}", prompt.input_ids, lengths[(i * 5) % count]))
    return requests
