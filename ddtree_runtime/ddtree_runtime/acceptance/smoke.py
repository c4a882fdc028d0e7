"""A short real DDTREE start for ``python -m ddtree_runtime.check`` on a serving host with SGLang and a free GPU.

A small random dense pair (Qwen3 target with head_dim 64 and the byte tokenizer's Hugging Face files, DFlash drafter)
is written to a temporary directory (the installed package does not carry the shipped pair), stock
``sglang.launch_server`` serves it with ``--speculative-algorithm DDTREE`` the way the suite does, and the check passes
when ``/health_generate`` answers, ``/server_info`` reports DDTREE and a greedy request returns tokens. The server is
stopped by PID either way.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddtree_runtime.acceptance.launch import ServerError, ServerSpec, generate, start_server
from ddtree_runtime.acceptance.prompts import STOP_TOKEN_IDS
from ddtree_runtime.eval.tasks import CODING_TASKS
from ddtree_runtime.reference.dflash import DFlashConfig, random_dflash, save_dflash
from ddtree_runtime.reference.qwen3 import Qwen3Config, random_qwen3, save_qwen3
from ddtree_runtime.sglang.config import MAX_DRAFT_TOKENS
from ddtree_runtime.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE, ByteTokenizer, write_hf_tokenizer

SMOKE_BUDGET = 16


def write_random_dense_pair(root: Path) -> tuple[Path, Path]:
    """A random Qwen3 target and DFlash drafter under ``root`` (head_dim 64: SGLang's bf16 drafter kernels need
    head_dim / 2 to be a power of two; three target layers: SGLang cannot capture the last one for the drafter). The
    target carries the byte tokenizer's Hugging Face files, which SGLang loads (the suite's servers run with their
    tokenizer)."""
    target = Qwen3Config(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
                         eos_token_id=sorted(ByteTokenizer.eos_token_ids))
    drafter = DFlashConfig(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=64, block_size=MAX_DRAFT_TOKENS,
                           target_layer_ids=[0, 1], mask_token_id=SPECIAL_TOKENS["<|mask|>"],
                           max_position_embeddings=4096)
    target_dir, drafter_dir = root / "target", root / "dflash"
    save_qwen3(random_qwen3(target, seed=0), target_dir)
    write_hf_tokenizer(target_dir)
    save_dflash(random_dflash(drafter, seed=1), drafter_dir)
    return target_dir, drafter_dir


@dataclass(frozen=True)
class StartResult:
    ok: bool
    detail: str


def ddtree_start(python: str, timeout: float = 600.0) -> StartResult:
    """Start DDTREE on a random pair, ask it once, stop it; what happened, in one line."""
    with tempfile.TemporaryDirectory(prefix="ddtree-check-") as scratch:
        root = Path(scratch)
        target, drafter = write_random_dense_pair(root / "models")
        spec = ServerSpec("check-ddtree", target, algorithm="DDTREE", draft_model_path=drafter,
                          draft_tokens=MAX_DRAFT_TOKENS, budget=SMOKE_BUDGET)
        server = start_server(spec, python, root)
        try:
            ready = server.wait_healthy(timeout)
            info = server.call("/server_info").body
            algorithm = info.get("speculative_algorithm") if isinstance(info, dict) else None
            if algorithm != "DDTREE":
                return StartResult(False, f"the server reports speculative_algorithm {algorithm!r}, not DDTREE")
            prompt = ByteTokenizer().encode(CODING_TASKS[0].text)
            answer = generate(server, [prompt], {"temperature": 0.0, "max_new_tokens": 32,
                                                 "stop_token_ids": STOP_TOKEN_IDS})[0]
            tokens = len(answer.get("output_ids") or [])
            if tokens == 0:
                return StartResult(False, "DDTREE answered a greedy request with no tokens")
            return StartResult(True, f"stock sglang.launch_server served DDTREE (budget {SMOKE_BUDGET}) on a random "
                                     f"pair: healthy after {ready:.0f} s, {tokens} greedy tokens")
        except ServerError as error:
            return StartResult(False, str(error)[-1500:])
        finally:
            server.stop()
