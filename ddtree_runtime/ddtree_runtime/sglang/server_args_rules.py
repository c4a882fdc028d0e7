"""The server arguments DDTREE refuses, with the plugin's own messages: plain Python, no SGLang.

SGLang runs :func:`validate_server_args` through the plugin's registration (``ddtree_runtime.sglang.plugin``) before
it resolves a server's arguments; the lab's stand-in SGLang and anything else that must judge a DDTREE command line
the way the plugin does call the same function, so the rules exist once.
"""

from __future__ import annotations

from typing import Any

from ddtree_runtime.model_layout import pair_problem
from ddtree_runtime.sglang import compat
from ddtree_runtime.sglang.config import (
    DEFAULT_ATTENTION_BACKEND,
    DEFAULT_LINEAR_ATTN_VERIFY_BACKEND,
    DDTreeConfigError,
    DDTreeSettings,
    mamba_tracking_problem,
    resolve_settings,
)

SUPPORTED_ATTENTION_BACKENDS = (DEFAULT_ATTENTION_BACKEND, "flashinfer")
"""Backends whose TARGET_VERIFY path applies a custom tree mask sized by the verify width, read in 0.5.23's source
(only triton has served DDTREE on a GPU so far). FA3 (SGLang's default on Hopper) and FA4 size their verify buffers
with the draft length and index a missing mask in the drafter (read in the source, not run); trtllm_mha rejects
``topk > 1``. Without ``--attention-backend`` DDTREE takes the first of these."""

ATTENTION_BACKEND_FLAGS = (
    "attention_backend", "prefill_attention_backend", "decode_attention_backend", "speculative_draft_attention_backend",
)


def settings_from_args(server_args: Any) -> DDTreeSettings:
    """DDTree settings from a server-args record (or SGLang's resolving view / recorder) and the environment."""
    return resolve_settings(getattr(server_args, "speculative_num_draft_tokens", None))


def _refuse(message: str) -> None:
    raise ValueError(f"--speculative-algorithm {compat.ALGORITHM_NAME}: {message}")


def validate_server_args(server_args: Any) -> None:
    """Constraints DDTREE adds to DFlash's (runs before :func:`handle_server_args`)."""
    try:
        settings = settings_from_args(server_args)
    except DDTreeConfigError as error:
        _refuse(str(error))
    if getattr(server_args, "speculative_draft_model_path", None) is None:
        _refuse("needs --speculative-draft-model-path (the DFlash drafter)")
    layout_problem = pair_problem(getattr(server_args, "model_path", ""), server_args.speculative_draft_model_path)
    if layout_problem is not None:
        _refuse(layout_problem)
    device = getattr(server_args, "device", None)
    if device is not None and not str(device).startswith("cuda"):
        _refuse(f"runs on CUDA only, not on device {device!r}")
    page_size = getattr(server_args, "page_size", None)
    if page_size not in (None, 1):
        _refuse(f"needs --page-size 1 (accepted tree paths are compacted slot by slot), got {page_size}")
    if getattr(server_args, "speculative_draft_window_size", None) is not None:
        _refuse("does not support --speculative-draft-window-size (compact draft KV cache) yet")
    block_size = getattr(server_args, "speculative_dflash_block_size", None)
    if block_size is not None and int(block_size) != settings.draft_tokens:
        _refuse("--speculative-dflash-block-size must equal --speculative-num-draft-tokens")
    for flag in ("speculative_use_rejection_sampling", "speculative_use_block_verification"):
        if getattr(server_args, flag, False):
            _refuse(f"--{flag.replace('_', '-')} is chain-only; DDTree verifies by sample-and-match on the tree")
    _refuse_unsupported_backends(server_args)
    _refuse_unsupported_parallelism(server_args)
    refuse_mamba_tracking(server_args, settings)


def refuse_mamba_tracking(server_args: Any, settings: DDTreeSettings) -> None:
    """A hybrid target's extra-buffer mamba cache checkpoints its state every ``mamba_track_interval`` tokens; one
    verify window must not span more than one such interval. Checked on the arguments as given (here) and again at
    worker start on the resolved ones: SGLang resolves ``--mamba-radix-cache-strategy auto`` to ``extra_buffer`` when
    overlap scheduling is on, after this validator has run."""
    problem = mamba_tracking_problem(settings, getattr(server_args, "mamba_radix_cache_strategy", None),
                                     getattr(server_args, "mamba_track_interval", None))
    if problem is not None:
        _refuse(problem)


def _refuse_unsupported_backends(server_args: Any) -> None:
    for flag in ATTENTION_BACKEND_FLAGS:
        backend = getattr(server_args, flag, None)
        if backend is not None and backend not in SUPPORTED_ATTENTION_BACKENDS:
            _refuse(f"--{flag.replace('_', '-')} {backend} cannot verify DDTree trees in SGLang "
                    f"{compat.SUPPORTED_VERSIONS_TEXT}; use one of {', '.join(SUPPORTED_ATTENTION_BACKENDS)}")
    verify_backend = getattr(server_args, "linear_attn_verify_backend", None)
    if verify_backend not in (None, DEFAULT_LINEAR_ATTN_VERIFY_BACKEND):
        _refuse(f"--linear-attn-verify-backend {verify_backend} does not verify trees (topk > 1); "
                f"use {DEFAULT_LINEAR_ATTN_VERIFY_BACKEND}")


def _refuse_unsupported_parallelism(server_args: Any) -> None:
    if int(getattr(server_args, "pp_size", 1) or 1) != 1:
        _refuse("supports only --pp-size 1 (as DFLASH)")
    if int(getattr(server_args, "attn_dp_size", 1) or 1) > 1 or getattr(server_args, "enable_dp_attention", False):
        _refuse("does not support data-parallel attention yet (the drafter and the top-k gather assume one DP group)")
    if int(getattr(server_args, "attn_cp_size", 1) or 1) != 1:
        _refuse("does not support context parallelism (--attn-cp-size 1)")
