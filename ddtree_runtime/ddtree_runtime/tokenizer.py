"""The tokenizer and chat template of the shipped model pairs (and of the lab's random models).

:class:`ByteTokenizer`: UTF-8 bytes are ids 0..255, the ChatML special tokens 256..263 (``<|endoftext|>`` 256,
``<|im_start|>`` 257, ``<|im_end|>`` 258, ``<think>`` 259, ``</think>`` 260, ``<|mask|>`` 261), ids 264..319 unused.
A model directory with ``tokenizer.json`` uses Hugging Face's tokenizer when ``transformers`` is installed
(:func:`load_tokenizer`). :func:`chat_prompt` is Qwen's ChatML; :func:`thinking_suffix` what a thinking model's
template (Qwen3.6's) adds after the assistant header.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol

SPECIAL_TOKENS = {
    "<|endoftext|>": 256,
    "<|im_start|>": 257,
    "<|im_end|>": 258,
    "<think>": 259,
    "</think>": 260,
    "<|mask|>": 261,
    "<tool_call>": 262,
    "</tool_call>": 263,
}
BYTE_VOCAB = 264
VOCAB_SIZE = 320
"""The shipped pairs' vocabulary: the byte tokenizer's 264 ids and 56 unused ones (a multiple of 64)."""


class Tokenizer(Protocol):
    eos_token_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, ChatML special tokens at 256..263, ids above decode to one printable
    ASCII character each (so random lab models produce visible text)."""

    eos_token_ids = frozenset({SPECIAL_TOKENS["<|endoftext|>"], SPECIAL_TOKENS["<|im_end|>"]})
    _by_id: ClassVar[dict[int, str]] = {v: k for k, v in SPECIAL_TOKENS.items()}

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        position = 0
        while position < len(text):
            special = next((s for s in SPECIAL_TOKENS if text.startswith(s, position)), None)
            if special is not None:
                ids.append(SPECIAL_TOKENS[special])
                position += len(special)
            else:
                ids.extend(text[position].encode())
                position += 1
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        pieces: list[str] = []
        pending = bytearray()
        for token in ids:
            if token < 256:
                pending.append(token)
                continue
            pieces.append(pending.decode(errors="replace"))
            pending.clear()
            if token in self._by_id:
                keep = not skip_special_tokens or self._by_id[token] in ("<think>", "</think>")
                pieces.append(self._by_id[token] if keep else "")
            else:
                pieces.append(chr(33 + token % 94))
        pieces.append(pending.decode(errors="replace"))
        return "".join(pieces)


class HfTokenizer:
    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer  # noqa: PLC0415 - optional dependency

        self._tok = AutoTokenizer.from_pretrained(str(directory))
        eos = self._tok.eos_token_id
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))


def load_tokenizer(directory: Path) -> Tokenizer:
    if (directory / "tokenizer.json").is_file():
        try:
            return HfTokenizer(directory)
        except ImportError:
            pass
    return ByteTokenizer()


def chat_prompt(messages: list[dict[str, Any]]) -> str:
    """ChatML prompt (Qwen's format) ending with the assistant header."""
    parts = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def thinking_suffix(enable_thinking: bool) -> str:
    """What a thinking model's chat template (Qwen3.6's) puts after the assistant header: an open think block, or,
    with ``chat_template_kwargs.enable_thinking: false``, an empty closed one so the model answers at once."""
    return "<think>\n" if enable_thinking else "<think>\n\n</think>\n\n"
