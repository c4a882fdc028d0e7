"""Version guards: which SGLang releases the plugin supports and what it hooks there.

The plugin refuses to register (raises :class:`UnsupportedSGLang`) on a release outside
:data:`SUPPORTED_VERSIONS`, when SGLang already ships a built-in ``DDTREE``, or when any attribute the plugin
hooks or subclasses is missing. The checks take their inputs as arguments so they are unit-tested without SGLang.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Iterable

SUPPORTED_VERSIONS = frozenset({"0.5.23"})
"""Releases whose DFlash V2 worker, registry and hook targets this plugin was written and contract-tested against."""

SUPPORTED_VERSIONS_TEXT = ", ".join(sorted(SUPPORTED_VERSIONS))

MINIMUM_VERSION = (0, 5, 14)
"""First release with ``DFlashWorkerV2`` and sliding-window DFlash drafter layers (0.5.12 added the registry)."""

ALGORITHM_NAME = "DDTREE"

HOOK_TARGETS = (
    # Target-verify CUDA graphs must be captured with a custom-mask buffer under DDTREE.
    "sglang.srt.speculative.dflash_utils.resolve_dflash_verify_mask_policy",
    # The capture-time dummy verify input must have the tree's width and a custom mask.
    "sglang.srt.speculative.spec_info.create_dummy_verify_input",
    # DFLASH's decode step reserves 2 x D KV slots (the commit lagging one round under overlap, then the block);
    # a tree round needs D + W.
    "sglang.srt.speculative.dflash_info_v2.page_aligned_decode_alloc_lens",
    # The req_to_token rows' headroom past the context length must hold that reservation.
    "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len",
    # Triton sizes the target's graph-replay tree-mask buffer with D; a tree verify writes W rows per request.
    "sglang.srt.layers.attention.verify_mask.maybe_create_verify_mask",
)
"""Functions the plugin wraps with ``HookRegistry`` (AROUND)."""

WORKER_BASE = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"

REQUIRED_ATTRIBUTES = (
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.register",
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo",
    "sglang.srt.plugins.hook_registry.HookRegistry",
    "sglang.srt.speculative.dflash_info.DFlashVerifyInput",
    "sglang.srt.speculative.dflash_info_v2.DFlashDraftInputV2",
    "sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_func",
    "sglang.kernels.ops.speculative.verify_sampling.tree_speculative_sampling_target_only",
    "sglang.srt.speculative.eagle_utils.eagle_sample",
    "sglang.srt.layers.sampler.apply_custom_logit_processor",
    "sglang.srt.speculative.draft_worker_common.make_draft_input_v2",
    "sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_func",
    "sglang.srt.runtime_context.get_spec",
    "sglang.srt.arg_groups.overrides.resolving_view",
    *(f"{WORKER_BASE}.{name}" for name in (
        "__init__",
        "forward_batch_generation",
        "_ensure_draft_block_buffers",
        "_append_target_hidden_to_draft_kv_by_loc",
        "_update_target_mamba_state_after_verify",
        "_make_next_draft_input_decode",
        "_draft_write_ids",
        "_maybe_build_draft_sampler",
        "target_worker",
    )),
)
"""Everything the plugin imports, subclasses or calls; a release missing any of them is refused."""


class UnsupportedSGLang(RuntimeError):
    """This SGLang cannot host the DDTree plugin; the message says why."""


def parse_version(text: str) -> tuple[int, ...]:
    """Numeric release tuple of a version string (``"0.5.23.post1"`` -> ``(0, 5, 23)``)."""
    parts = []
    for piece in text.split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts)


def check_version(version: str) -> None:
    """Refuse releases other than the pinned set (and anything older than the V2 worker)."""
    if parse_version(version) < MINIMUM_VERSION:
        minimum = ".".join(map(str, MINIMUM_VERSION))
        raise UnsupportedSGLang(
            f"SGLang {version} is too old for the DDTree plugin: it needs >= {minimum} (DFlashWorkerV2, "
            f"sliding-window drafter layers) and is validated on {SUPPORTED_VERSIONS_TEXT}"
        )
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedSGLang(
            f"SGLang {version} is not a release the DDTree plugin supports ({SUPPORTED_VERSIONS_TEXT}): "
            "its DFlash worker and hook targets change between releases. Pin SGLang or port and re-validate the plugin."
        )


def check_no_builtin(builtin_names: Iterable[str]) -> None:
    """Refuse when SGLang itself defines ``DDTREE`` (its own implementation must win, not be shadowed)."""
    if ALGORITHM_NAME in {name.upper() for name in builtin_names}:
        raise UnsupportedSGLang(
            f"this SGLang already ships a built-in {ALGORITHM_NAME} speculative algorithm; the ddtree_runtime plugin "
            "does not override it. Unset SGLANG_PLUGINS=ddtree (or uninstall the plugin) to use the built-in one."
        )


def _resolves(dotted: str) -> bool:
    module_path, _unused, attribute = dotted.rpartition(".")
    try:
        owner = pkgutil.resolve_name(module_path)
    except (ImportError, AttributeError, ValueError):
        return False
    return hasattr(owner, attribute)


def missing_attributes(dotted_names: Iterable[str], resolves: Callable[[str], bool] = _resolves) -> list[str]:
    """The dotted names that do not resolve (an import error counts as missing)."""
    return [name for name in dotted_names if not resolves(name)]


def check_targets(dotted_names: Iterable[str], resolves: Callable[[str], bool] = _resolves) -> None:
    missing = missing_attributes(dotted_names, resolves)
    if missing:
        raise UnsupportedSGLang(
            "the DDTree plugin hooks or subclasses attributes this SGLang does not have: " + ", ".join(missing)
        )
