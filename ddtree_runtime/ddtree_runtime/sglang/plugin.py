"""Registration of ``DDTREE`` with SGLang 0.5.23: the algorithm class, server-args handling and hooks.

Imports SGLang; imported only by :func:`ddtree_runtime.sglang.register` (and tests in an SGLang venv).

DDTREE is DFlash with a tree verify, so :class:`DDTreeSpecAlgo` answers True to ``is_dflash`` /
``is_dflash_family`` / ``supports_target_verify_for_draft`` / ``has_draft_kv``: SGLang's ~35 DFlash call sites then
size the draft KV pool, capture the target's aux hidden states and build TARGET_VERIFY graphs as for DFLASH.
Two widths differ from DFlash and are declared through the registry's own hooks: the drafter block stays
``--speculative-num-draft-tokens`` (D), the target verifies ``DDTREE_BUDGET + 1`` tokens per request
(``get_num_tokens_per_req_for_target_verify``, ``resolve_max_speculative_num_draft_tokens``, which sizes the
per-decode KV allocation and the mamba intermediate-state buffers).
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo
from sglang.srt.speculative.spec_registry import get_spec as registered_algorithm

from ddtree_runtime.sglang import compat
from ddtree_runtime.sglang.config import (
    REQUIRED_SERVER_ARG_FIELDS,
    DDTreeSettings,
    required_server_args,
    resolve_settings,
)
from ddtree_runtime.sglang.server_args_rules import settings_from_args, validate_server_args

logger = logging.getLogger(__name__)


def published_settings() -> DDTreeSettings:
    """The settings of this server, from SGLang's published speculative config and the environment."""
    from sglang.srt.runtime_context import get_spec  # noqa: PLC0415 - published only after args resolve

    return resolve_settings(get_spec().speculative_num_draft_tokens)


def ddtree_is_active() -> bool:
    """Whether this process serves DDTREE (read from SGLang's published speculative config)."""
    from sglang.srt.runtime_context import get_spec  # noqa: PLC0415 - published only after args resolve

    try:
        algorithm = get_spec().speculative_algorithm
    except Exception:  # not published yet (e.g. argument parsing): nothing runs under DDTREE then
        return False
    return (algorithm or "").upper() == compat.ALGORITHM_NAME


def handle_server_args(server_args: Any) -> None:
    """What DDTREE needs set (runs on SGLang's recorder; every write is declared as a resolution):
    :func:`ddtree_runtime.sglang.config.required_server_args`, the rule the release's unit is rendered with."""
    given = {field: getattr(server_args, field, None) for field in REQUIRED_SERVER_ARG_FIELDS}
    for field, value in required_server_args(given, settings_from_args(server_args)).items():
        setattr(server_args, field, value)


class DDTreeSpecAlgo(CustomSpecAlgo):
    """``DDTREE``: a DFlash-family algorithm whose verify is a best-first draft tree."""

    def is_dflash(self) -> bool:
        return True

    def is_dflash_family(self) -> bool:
        return True

    def supports_target_verify_for_draft(self) -> bool:
        return True

    def has_draft_kv(self) -> bool:
        return True

    # SpeculativeAlgorithm methods that 0.5.23's CustomSpecAlgo lacks (its conformity check covers only is_* and
    # supports_*), called by the scheduler at start and by its FutureMap: without them a plugin algorithm dies before
    # its first request (found on the H200). The enum's bodies are written in terms of the is_*() answers above, so
    # borrowing them gives DDTREE what they give DFLASH.
    carries_draft_hidden_states = SpeculativeAlgorithm.carries_draft_hidden_states
    create_future_map = SpeculativeAlgorithm.create_future_map
    need_topk = SpeculativeAlgorithm.need_topk
    get_platform_worker_cls = SpeculativeAlgorithm.get_platform_worker_cls

    def handle_server_args(self, server_args: Any) -> None:
        handle_server_args(server_args)

    def resolve_max_speculative_num_draft_tokens(self, server_args: Any) -> int | None:
        from sglang.srt.arg_groups.overrides import resolving_view  # noqa: PLC0415

        settings = settings_from_args(resolving_view(server_args))
        return max(settings.draft_tokens, settings.verify_width)

    def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
        """Rows per request: D for the drafter's block, W for the target's verify.

        SGLang passes either D or ``max_speculative_num_draft_tokens()`` (= max(D, W)) here depending on the
        caller, so the answer comes from the published settings, not from the argument.
        """
        settings = published_settings()
        return settings.draft_tokens if is_draft_worker else settings.verify_width


def worker_class(server_args: Any) -> type:
    """The worker factory SGLang calls in each scheduler process."""
    from ddtree_runtime.sglang.worker import DDTreeWorker  # noqa: PLC0415 - imports the DFlash worker

    return DDTreeWorker


def _mask_policy_hook(original: Callable[..., tuple[str, bool]], attn_backend: Any) -> tuple[str, bool]:
    """Under DDTREE every target-verify CUDA graph is captured with a custom-mask buffer (trees need it)."""
    name, build_custom_mask = original(attn_backend)
    return (name, True) if ddtree_is_active() else (name, build_custom_mask)


def _dummy_verify_input_hook(
    original: Callable[..., Any], spec_algorithm: Any, custom_mask: Any, num_tokens_per_req: int, is_draft_worker: bool
) -> Any:
    """Capture-time dummy for the target: the tree's width, its custom mask and the tree ``topk``."""
    spec_info = original(spec_algorithm, custom_mask, num_tokens_per_req, is_draft_worker)
    if is_draft_worker or getattr(spec_algorithm, "name", None) != compat.ALGORITHM_NAME:
        return spec_info
    from ddtree_runtime.sglang.worker import DDTreeVerifyInput  # noqa: PLC0415

    return DDTreeVerifyInput.for_graph_capture(custom_mask=custom_mask, width=num_tokens_per_req)


def _decode_reservation_hook(original: Callable[..., Any], reqs: Any, *, reserve: int, page_size: int) -> Any:
    """DFLASH reserves 2 x D slots per decode step, DDTREE D + W (:meth:`DDTreeSettings.decode_reservation`)."""
    if ddtree_is_active():
        reserve = published_settings().decode_reservation(reserve)
    return original(reqs, reserve=reserve, page_size=page_size)


def _row_headroom_hook(original: Callable[..., int]) -> int:
    """``req_to_token`` rows must hold a decode reservation made at the context limit (D + W past it, not D)."""
    headroom = original()
    return published_settings().req_to_token_headroom(headroom) if ddtree_is_active() else headroom


def _verify_mask_size_hook(original: Callable[..., Any], **kwargs: Any) -> Any:
    """The target's graph-replay tree-mask buffer: SGLang sizes it with D; a DDTree verify writes W x (len + W)."""
    if ddtree_is_active() and not kwargs.get("is_draft_runner") and kwargs.get("num_draft_tokens"):
        kwargs["num_draft_tokens"] = max(int(kwargs["num_draft_tokens"]), published_settings().verify_width)
    return original(**kwargs)


HOOKS: dict[str, Callable[..., Any]] = {
    "sglang.srt.speculative.dflash_utils.resolve_dflash_verify_mask_policy": _mask_policy_hook,
    "sglang.srt.speculative.spec_info.create_dummy_verify_input": _dummy_verify_input_hook,
    "sglang.srt.speculative.dflash_info_v2.page_aligned_decode_alloc_lens": _decode_reservation_hook,
    "sglang.srt.layers.attention.verify_mask.maybe_create_verify_mask": _verify_mask_size_hook,
    "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len": _row_headroom_hook,
}


def register_ddtree() -> None:
    """Check this SGLang, then register ``DDTREE`` and its hooks (idempotent within a process)."""
    compat.check_version(importlib.metadata.version("sglang"))
    compat.check_no_builtin(SpeculativeAlgorithm.__members__)
    if set(HOOKS) != set(compat.HOOK_TARGETS):
        raise compat.UnsupportedSGLang("internal: hook table and compat.HOOK_TARGETS disagree")
    compat.check_targets((*compat.HOOK_TARGETS, *compat.REQUIRED_ATTRIBUTES))
    if registered_algorithm(compat.ALGORITHM_NAME) is not None:
        return
    SpeculativeAlgorithm.register(
        compat.ALGORITHM_NAME,
        supports_overlap=True,
        validate_server_args=validate_server_args,
        spec_class=DDTreeSpecAlgo,
    )(worker_class)
    for target, hook in HOOKS.items():
        HookRegistry.register(target, hook, HookType.AROUND)
    logger.info("ddtree_runtime: registered %s with SGLang %s", compat.ALGORITHM_NAME,
                importlib.metadata.version("sglang"))
