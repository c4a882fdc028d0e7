"""SGLang plugin: ``--speculative-algorithm DDTREE`` in stock SGLang through its plugin entry points.

``ddtree_runtime`` declares the entry point ``ddtree`` in the group ``sglang.srt.plugins``; SGLang's
``load_plugins()`` runs :func:`register` in every process (launcher, schedulers, detokenizer), also when
``SGLANG_PLUGINS=ddtree`` restricts loading to it. Registration checks the SGLang release and every attribute the
plugin hooks or subclasses first (:mod:`ddtree_runtime.sglang.compat`) and refuses, loudly, when one does not fit:
``load_plugins`` only logs a plugin's exception, so the refusal is also logged at ERROR, kept in
:func:`registration_error`, and ``SpeculativeAlgorithm.from_string("DDTREE")`` is made to raise it.

Importing this package does not import SGLang.
"""

from __future__ import annotations

import logging

from ddtree_runtime.sglang.compat import ALGORITHM_NAME, UnsupportedSGLang

__all__ = ["ALGORITHM_NAME", "UnsupportedSGLang", "register", "registration_error"]

logger = logging.getLogger(__name__)

_state: dict[str, BaseException | None] = {"refusal": None}


def registration_error() -> BaseException | None:
    """Why the last :func:`register` call in this process refused, or None."""
    return _state["refusal"]


def register() -> None:
    """Entry point: register ``DDTREE`` with SGLang, or raise why it cannot be."""
    try:
        from ddtree_runtime.sglang.plugin import register_ddtree  # noqa: PLC0415 - imports SGLang

        register_ddtree()
    except Exception as error:
        _state["refusal"] = error
        logger.error("ddtree_runtime: %s NOT registered with SGLang: %s", ALGORITHM_NAME, error)
        _make_lookup_fail_loudly(error)
        raise
    _state["refusal"] = None


def _make_lookup_fail_loudly(error: BaseException) -> None:
    """Make ``from_string("DDTREE")`` raise the refusal instead of SGLang's bare "Unknown ... name"."""
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: PLC0415
    except Exception:  # SGLang itself does not import: nothing to patch, the error is already logged.
        return
    original = SpeculativeAlgorithm.__dict__["from_string"].__func__
    if getattr(original, "__ddtree_refusal__", None) is not None:
        original = original.__wrapped__

    def from_string(cls: type, name: str | None) -> object:
        if name is not None and name.upper() == ALGORITHM_NAME:
            raise UnsupportedSGLang(f"{ALGORITHM_NAME} is unavailable: the ddtree_runtime plugin refused: {error}")
        return original(cls, name)

    from_string.__wrapped__ = original  # type: ignore[attr-defined]
    from_string.__ddtree_refusal__ = error  # type: ignore[attr-defined]
    SpeculativeAlgorithm.from_string = classmethod(from_string)  # type: ignore[assignment,method-assign]
