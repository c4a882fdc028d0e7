"""DDTree settings for SGLang: stock flags where they fit, ``DDTREE_*`` environment variables for the rest.

Pure Python (no SGLang import), so it is unit-tested without SGLang.

- draft length ``D``: ``--speculative-num-draft-tokens``, the DFlash block incl. the bonus token, 2..16; trees are
  at most ``D - 1`` deep;
- budget ``B``: ``DDTREE_BUDGET``, non-root tree nodes (default ``D - 1``); the target verifies ``B + 1`` tokens;
- top-k cap: ``DDTREE_TOPK``, per-depth top-k cap (default none: ``min(B, vocab)``, DDTree's exact rule);
- ``DDTREE_VERIFY_TOPK``: the ``topk`` SGLang's attention backends see (default 2; >= 2 selects their tree paths).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_DRAFT_TOKENS = 16
"""Largest DFlash block the published drafters are trained with (z-lab b16)."""

MAX_BUDGET = 1024
"""Largest node budget the tree kernels build (``ddtree_runtime.ops.MAX_BUDGET``); the verify width is ``B + 1``."""

ENV_BUDGET = "DDTREE_BUDGET"
ENV_TOPK = "DDTREE_TOPK"
ENV_VERIFY_TOPK = "DDTREE_VERIFY_TOPK"
ENV_DEBUG_TREE_DIGEST = "DDTREE_DEBUG_TREE_DIGEST"
"""``1``: each round, log a digest of the trees and compare it across TP ranks (a host read per round)."""
DEFAULT_VERIFY_TOPK = 2

DEFAULT_MAMBA_TRACK_INTERVAL = 256
"""SGLang 0.5.23's ``--mamba-track-interval`` default: every how many tokens a hybrid target's extra-buffer radix cache
keeps a copy of its linear-attention state."""
MAMBA_TRACKING_STRATEGIES = ("extra_buffer", "extra_buffer_lazy")
"""``--mamba-radix-cache-strategy`` values whose state copies follow ``--mamba-track-interval``."""

DEFAULT_ATTENTION_BACKEND = "triton"
"""The attention backend DDTREE takes when none is given (SGLang's default on Hopper, FA3, cannot verify trees)."""
DEFAULT_LINEAR_ATTN_VERIFY_BACKEND = "triton"
"""Hybrid (GDN) targets: SGLang's FlashInfer GDN verify refuses tree links (``retrieve_parent_token``)."""
DEFAULT_MAX_RUNNING_REQUESTS = 48
"""What SGLang's DFLASH handler defaults ``max_running_requests`` to; DDTREE verifies more tokens per request."""

REQUIRED_SERVER_ARG_FIELDS = (
    "speculative_num_draft_tokens", "speculative_num_steps", "speculative_eagle_topk", "max_running_requests",
    "page_size", "attention_backend", "speculative_draft_attention_backend", "linear_attn_verify_backend",
)
"""The SGLang ``ServerArgs`` fields :func:`required_server_args` decides."""


class DDTreeConfigError(ValueError):
    """A DDTree setting is missing, malformed or out of range."""


@dataclass(frozen=True)
class DDTreeSettings:
    """Resolved DDTree knobs for one server.

    ``draft_tokens`` is D (the drafter block incl. bonus), ``budget`` the non-root node count,
    ``max_topk`` the optional per-depth cap and ``verify_topk`` the ``topk`` handed to SGLang's backends.
    """

    draft_tokens: int
    budget: int
    max_topk: int | None
    verify_topk: int

    @property
    def max_depth(self) -> int:
        """Deepest tree level: the drafter proposes D - 1 positions after the bonus token."""
        return self.draft_tokens - 1

    @property
    def verify_width(self) -> int:
        """Tokens per request in the target verify forward: the root plus ``budget`` nodes."""
        return self.budget + 1

    @property
    def max_committed_per_round(self) -> int:
        """Most tokens one round commits: an accepted path (root included) is at most D deep and W wide."""
        return min(self.draft_tokens, self.verify_width)

    def decode_reservation(self, reserve: int) -> int:
        """KV slots a decode step reserves past the committed length, given DFLASH's ``reserve`` (2 x D).

        The drafter writes D slots and the verify W from the committed length. Under overlap scheduling the
        scheduler plans round t+1 while round t runs, from the committed length before round t, so round t's commit
        (at most :attr:`max_committed_per_round`) comes on top: ``min(D, W) + max(D, W) = D + W``. That is DFLASH's
        2 x D with the tree's width in place of one D, and safe without overlap too.
        """
        return max(reserve, self.max_committed_per_round + max(self.draft_tokens, self.verify_width))

    def req_to_token_headroom(self, headroom: int) -> int:
        """Slots past the context length each ``req_to_token`` row needs, given SGLang's ``headroom``.

        SGLang adds 4 + max(D, W); a request near its context limit reserves :meth:`decode_reservation` slots from
        a committed length that may already sit at the limit.
        """
        return max(headroom, 4 + self.decode_reservation(0))

    def topk_for_vocab(self, vocab_size: int) -> int:
        """Per-depth top-k DDTree uses for a vocabulary: ``min(budget, vocab, cap)``."""
        k = min(self.budget, vocab_size)
        return min(k, self.max_topk) if self.max_topk is not None else k


def _parse_positive_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise DDTreeConfigError(f"{name} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise DDTreeConfigError(f"{name} must be a positive integer, got {value}")
    return value


def resolve_settings(draft_tokens: int | None, environ: Mapping[str, str] | None = None) -> DDTreeSettings:
    """Validate ``--speculative-num-draft-tokens`` and read the ``DDTREE_*`` variables.

    ``draft_tokens=None`` (flag not given) means the full b16 block. The budget defaults to
    ``D - 1`` (the chain's node count, so the verify width equals DFlash's).
    """
    env = os.environ if environ is None else environ
    draft = MAX_DRAFT_TOKENS if draft_tokens is None else int(draft_tokens)
    if not 2 <= draft <= MAX_DRAFT_TOKENS:
        raise DDTreeConfigError(
            f"--speculative-num-draft-tokens is the DFlash draft length incl. the bonus token and must be in "
            f"2..{MAX_DRAFT_TOKENS} for DDTREE, got {draft}"
        )
    budget = _parse_positive_int(env, ENV_BUDGET)
    if budget is not None and budget > MAX_BUDGET:
        raise DDTreeConfigError(
            f"{ENV_BUDGET} must be at most {MAX_BUDGET} (the tree kernels' largest tree), got {budget}"
        )
    verify_topk = _parse_positive_int(env, ENV_VERIFY_TOPK)
    if verify_topk is not None and verify_topk < 2:
        raise DDTreeConfigError(f"{ENV_VERIFY_TOPK} must be >= 2 so attention backends take their tree path")
    return DDTreeSettings(
        draft_tokens=draft,
        budget=draft - 1 if budget is None else budget,
        max_topk=_parse_positive_int(env, ENV_TOPK),
        verify_topk=DEFAULT_VERIFY_TOPK if verify_topk is None else verify_topk,
    )


def mamba_track_interval_for(settings: DDTreeSettings) -> int:
    """The smallest multiple of SGLang's default track interval a verify window of these settings fits in."""
    intervals = -(-settings.verify_width // DEFAULT_MAMBA_TRACK_INTERVAL)
    return intervals * DEFAULT_MAMBA_TRACK_INTERVAL


def mamba_tracking_problem(settings: DDTreeSettings, strategy: str | None, interval: int | None) -> str | None:
    """Why a hybrid target's mamba radix cache cannot follow these settings' verify windows, with the fix; None when
    it can. One verify window must not span more than one track interval (SGLang 0.5.23 asserts the same for the
    draft length); ``interval=None`` is SGLang's default."""
    if strategy not in MAMBA_TRACKING_STRATEGIES:
        return None
    track = DEFAULT_MAMBA_TRACK_INTERVAL if interval is None else int(interval)
    if track >= settings.verify_width:
        return None
    return (f"mamba_track_interval {track} is below the verify width {settings.verify_width} ({ENV_BUDGET} + 1) of a "
            f"hybrid target's --mamba-radix-cache-strategy {strategy}: pass --mamba-track-interval "
            f"{mamba_track_interval_for(settings)} (a multiple of the page size, at least the verify width), or use a "
            f"budget of at most {track - 1}")


def required_server_args(given: Mapping[str, Any], settings: DDTreeSettings) -> dict[str, Any]:
    """The SGLang ``ServerArgs`` fields DDTREE sets, with their values, given the fields a server was started with
    (``given``: field -> value, None or absent when not set): those left unset get DDTREE's defaults, and the two it
    always decides (one draft step; the tree ``topk`` the attention backends see) get its values where they differ.

    The plugin's ``handle_server_args`` writes exactly these; the release's unit states them on its command line, so
    that what ``systemctl cat`` shows is what serves (then this returns nothing for it).
    """
    required: dict[str, Any] = {}

    def unset(field: str) -> bool:
        return given.get(field) is None

    if unset("speculative_num_draft_tokens"):
        required["speculative_num_draft_tokens"] = settings.draft_tokens
    if given.get("speculative_num_steps") != 1:
        required["speculative_num_steps"] = 1
    if given.get("speculative_eagle_topk") != settings.verify_topk:
        required["speculative_eagle_topk"] = settings.verify_topk
    if unset("max_running_requests"):
        required["max_running_requests"] = DEFAULT_MAX_RUNNING_REQUESTS
    if unset("page_size"):
        required["page_size"] = 1
    attention = DEFAULT_ATTENTION_BACKEND if unset("attention_backend") else given["attention_backend"]
    if unset("attention_backend"):
        required["attention_backend"] = attention
    # The drafter runs its block through the same tree-capable backend (DFLASH's resolver is not called for DDTREE).
    if unset("speculative_draft_attention_backend"):
        required["speculative_draft_attention_backend"] = attention
    if unset("linear_attn_verify_backend"):
        required["linear_attn_verify_backend"] = DEFAULT_LINEAR_ATTN_VERIFY_BACKEND
    return required
