"""Speculative algorithms of the stand-in: SGLang's built-in names plus what plugins registered in this process."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

BUILTIN_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH")

Validator = Callable[[argparse.Namespace], None]
_registered: dict[str, Validator] = {}


def register_algorithm(name: str, validate: Validator) -> None:
    """What a plugin's registration leaves behind here: the name and the server-args check it runs."""
    _registered[name.upper()] = validate


def registered_algorithms() -> tuple[str, ...]:
    return tuple(_registered)


@dataclass(frozen=True)
class SpeculativeAlgorithm:
    """A resolved algorithm; every one is served by the lab's reference engine."""

    name: str

    @classmethod
    def from_string(cls, name: str | None) -> SpeculativeAlgorithm | None:
        if name is None:
            return None
        upper = name.upper()
        if upper not in BUILTIN_ALGORITHMS and upper not in _registered:
            raise ValueError(f"Unknown speculative algorithm name: {name}")
        return cls(upper)

    def factory(self, server_args: object) -> type:
        """The worker class SGLang would start for this algorithm: here, the reference engine."""
        del server_args
        from pivot_labserver.engine import LabEngine  # noqa: PLC0415 - the lab's server, installed beside this stand-in

        return LabEngine


def validate_registered(args: argparse.Namespace) -> None:
    """Run the registering plugin's server-args check for a plugin algorithm (built-in ones have none here)."""
    validate = _registered.get((args.speculative_algorithm or "").upper())
    if validate is not None:
        validate(args)
