"""The tokenizer and chat template of the shipped model pairs (and of the lab's random models).

:class:`ByteTokenizer`: UTF-8 bytes are ids 0..255, the ChatML special tokens 256..263 (``<|endoftext|>`` 256,
``<|im_start|>`` 257, ``<|im_end|>`` 258, ``<think>`` 259, ``</think>`` 260, ``<|mask|>`` 261, ``<tool_call>`` 262,
``</tool_call>`` 263), ids 264..319 unused. :func:`write_hf_tokenizer` writes the same vocabulary as a Hugging Face
fast tokenizer (``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``), which is what SGLang and
xgrammar read; a model directory with ``tokenizer.json`` uses it when ``transformers`` is installed
(:func:`load_tokenizer`). :func:`chat_prompt` is Qwen's ChatML (:func:`chat_template` the same as a Jinja chat
template); :func:`thinking_suffix` what a thinking model's template (Qwen3.6's) adds after the assistant header.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
KEPT_IN_TEXT = frozenset({"<think>", "</think>", "<tool_call>", "</tool_call>"})
"""Special tokens that decoding keeps in the text (Qwen3's tokenizer marks them ``special: false``: the reasoning and
tool-call parsers read them there)."""
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"


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
                keep = not skip_special_tokens or self._by_id[token] in KEPT_IN_TEXT
                pieces.append(self._by_id[token] if keep else "")
            else:
                pieces.append(chr(33 + token % 94))
        pieces.append(pending.decode(errors="replace"))
        return "".join(pieces)


class HfTokenizer:
    """A directory's ``tokenizer.json`` as it is written. transformers' generic fast tokenizer, not ``AutoTokenizer``:
    for some model types (``qwen3_5``) ``AutoTokenizer`` picks a class that rebuilds the normalizer and pre-tokenizer
    from its own code (an NFC normalizer for Qwen3.5), which would change the ids of text that is not NFC."""

    def __init__(self, directory: Path) -> None:
        from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - optional dependency

        self._tok = PreTrainedTokenizerFast.from_pretrained(str(directory))
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


def _turn(role: str, content: str) -> str:
    """One ChatML turn; the assistant header is a turn's opening (:func:`chat_template` renders the same pieces)."""
    return f"{IM_START}{role}\n{content}{EOS_TOKEN}\n"


ASSISTANT_HEADER = f"{IM_START}assistant\n"


def chat_prompt(messages: list[dict[str, Any]]) -> str:
    """ChatML prompt (Qwen's format) ending with the assistant header."""
    parts = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        parts.append(_turn(message.get("role", "user"), content))
    parts.append(ASSISTANT_HEADER)
    return "".join(parts)


def thinking_suffix(enable_thinking: bool) -> str:
    """What a thinking model's chat template (Qwen3.6's) puts after the assistant header: an open think block, or,
    with ``chat_template_kwargs.enable_thinking: false``, an empty closed one so the model answers at once."""
    return "<think>\n" if enable_thinking else "<think>\n\n</think>\n\n"


# ---- the same vocabulary as a Hugging Face fast tokenizer (what SGLang, xgrammar and transformers read) ----------

HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
"""What :func:`write_hf_tokenizer` writes (the files a Qwen checkpoint ships its tokenizer in)."""


def unused_token(token_id: int) -> str:
    """The name of an unused id in the Hugging Face vocabulary (never produced by encoding: there are no merges)."""
    return f"<|unused_{token_id}|>"


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character map, by byte: how byte-level tokenizers (Qwen's, this one) write a byte in their
    vocabulary. Printable Latin-1 characters stand for themselves, the other bytes for ``chr(256 + n)`` in order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
    stand_ins = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(stand_ins)) for byte in range(256)]


def hf_special_tokens(extra_special_tokens: Mapping[str, int] | None = None) -> dict[str, int]:
    """The added tokens of the Hugging Face tokenizer, by name: :data:`SPECIAL_TOKENS` and ``extra_special_tokens``
    (unused ids above :data:`BYTE_VOCAB`, e.g. a multimodal target's vision tokens)."""
    extra = dict(extra_special_tokens or {})
    for name, token_id in extra.items():
        if not BYTE_VOCAB <= token_id < VOCAB_SIZE or name in SPECIAL_TOKENS:
            raise ValueError(f"{name!r}: extra special tokens take unused ids {BYTE_VOCAB}..{VOCAB_SIZE - 1}")
    if len(set(extra.values())) != len(extra):
        raise ValueError(f"extra special tokens share ids: {extra}")
    return {**SPECIAL_TOKENS, **extra}


def build_hf_tokenizer(extra_special_tokens: Mapping[str, int] | None = None) -> Any:
    """A ``tokenizers.Tokenizer`` with :class:`ByteTokenizer`'s ids: a byte-level BPE without merges (every UTF-8 byte
    its own token, id = byte value), the special tokens as added tokens at their ids (found anywhere in the text, as
    ByteTokenizer finds them), ids up to :data:`VOCAB_SIZE` named by :func:`unused_token`. No normalizer: the bytes
    of the text are its ids, as ByteTokenizer's are."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415 - optional

    specials = hf_special_tokens(extra_special_tokens)
    names = {token_id: unused_token(token_id) for token_id in range(BYTE_VOCAB, VOCAB_SIZE)}
    names.update({token_id: name for name, token_id in specials.items()})
    vocab = {char: byte for byte, char in enumerate(byte_alphabet())}
    vocab.update({name: token_id for token_id, name in sorted(names.items())})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], dropout=None, unk_token=None, fuse_unk=False,
                                     byte_fallback=False, ignore_merges=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    for name, _token_id in sorted(specials.items(), key=lambda item: item[1]):
        token = AddedToken(name, special=name not in KEPT_IN_TEXT, normalized=False)
        if name in KEPT_IN_TEXT:
            tokenizer.add_tokens([token])
        else:
            tokenizer.add_special_tokens([token])
    return tokenizer


def _jinja_string(text: str) -> str:
    """``text`` as a Jinja string literal (Jinja unescapes string literals as Python's ``unicode-escape`` does)."""
    return json.dumps(text)


def chat_template() -> str:
    """:func:`chat_prompt` as a Jinja chat template (``add_generation_prompt`` adds the assistant header; given
    ``enable_thinking``, :func:`thinking_suffix` follows it, as the lab server's ``--reasoning-parser`` does). Made
    from the pieces :func:`chat_prompt` joins, so the two cannot disagree."""
    role_mark, content_mark = "\x00role\x00", "\x00content\x00"
    before_role, rest = _turn(role_mark, content_mark).split(role_mark)
    between, after = rest.split(content_mark)
    turn = " ~ ".join([_jinja_string(before_role), "role", _jinja_string(between), "content", _jinja_string(after)])
    lines = [
        "{%- for message in messages -%}",
        "{%- set role = message['role'] if message['role'] is defined else 'user' -%}",
        "{%- set content = message['content'] if message['content'] is defined and message['content'] else '' -%}",
        "{%- if content is not string and content is iterable and content is not mapping -%}",
        "{%- set text = namespace(value='') -%}",
        "{%- for part in content if part is mapping and part['text'] is defined -%}",
        "{%- set text.value = text.value ~ part['text'] -%}",
        "{%- endfor -%}",
        "{%- set content = text.value -%}",
        "{%- endif -%}",
        "{{- " + turn + " -}}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}",
        "{{- " + _jinja_string(ASSISTANT_HEADER) + " -}}",
        "{%- if enable_thinking is defined -%}",
        "{{- " + _jinja_string(thinking_suffix(True)) + " if enable_thinking else "
        + _jinja_string(thinking_suffix(False)) + " -}}",
        "{%- endif -%}",
        "{%- endif -%}",
    ]
    return "\n".join(lines) + "\n"


def hf_tokenizer_config(extra_special_tokens: Mapping[str, int] | None = None) -> dict[str, Any]:
    """``tokenizer_config.json``: end of turn ``<|im_end|>`` as EOS and ``<|endoftext|>`` as padding (Qwen's), no
    BOS, the added tokens as Qwen lists them. The class is transformers' generic fast tokenizer, which reads
    ``tokenizer.json`` as it is."""
    specials = hf_special_tokens(extra_special_tokens)
    added = {str(token_id): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": name not in KEPT_IN_TEXT}
             for name, token_id in sorted(specials.items(), key=lambda item: item[1])}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def _write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def write_hf_tokenizer(directory: Path, extra_special_tokens: Mapping[str, int] | None = None) -> list[Path]:
    """Write :data:`HF_TOKENIZER_FILES` into ``directory``: :class:`ByteTokenizer`'s vocabulary as a Hugging Face fast
    tokenizer (:func:`build_hf_tokenizer`), its config and :func:`chat_template`. Deterministic: the shipped model
    directories hold exactly what this writes (a test regenerates and compares them)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_hf_tokenizer(extra_special_tokens)
    template = directory / "chat_template.jinja"
    template.write_text(chat_template(), encoding="utf-8")
    return [_write_json(directory / "tokenizer.json", json.loads(tokenizer.to_str())),
            _write_json(directory / "tokenizer_config.json", hf_tokenizer_config(extra_special_tokens)), template]
