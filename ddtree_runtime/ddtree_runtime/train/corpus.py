"""Training text for the shipped pair: the Python standard library's own ``.py`` sources, byte-tokenized.

Every machine with Python has this corpus, so nothing is downloaded. Two kinds of documents go into one
token stream, each followed by ``<|endoftext|>``:

- raw source files (bytes 0-255 as token ids, exactly as :class:`ByteTokenizer` encodes them);
- chat examples built from documented functions: a ChatML user turn asking for the function (its name,
  arguments and the first line of its docstring) and an assistant turn holding the function's source, ended
  by ``<|im_end|>``. They teach the target to answer the lab's chat requests with code and then stop.

A file is held out (never trained on) when the SHA-256 of its path relative to the standard library
starts with a value below ``held_out_per_mille``; the split depends only on the path, so it is the same
on every Python version.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sysconfig
import textwrap
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ddtree_runtime.tokenizer import SPECIAL_TOKENS, chat_prompt

END_OF_TEXT = SPECIAL_TOKENS["<|endoftext|>"]
IM_END = SPECIAL_TOKENS["<|im_end|>"]
IM_START = SPECIAL_TOKENS["<|im_start|>"]
EXCLUDED_PARTS = frozenset({"site-packages", "dist-packages", "__pycache__", "idlelib", "turtledemo"})
MAX_FILE_BYTES = 400_000
MAX_FUNCTION_BYTES = 2_500
INSTRUCTION_TEMPLATES = (
    "Write a Python function {signature} that {summary}.",
    "Implement {signature} in Python: {summary}.",
    "Write {signature} in Python. It should {summary}.",
)


@dataclass(frozen=True)
class SourceFile:
    relative: str
    data: bytes


@dataclass(frozen=True)
class ChatExample:
    instruction: str
    code: str

    def text(self) -> str:
        return chat_prompt([{"role": "user", "content": self.instruction}]) + self.code + "<|im_end|>\n"

    def prompt_ids(self) -> list[int]:
        """Token ids of the chat prompt through ``<|im_start|>assistant\\n`` (what ByteTokenizer gives)."""
        user = [IM_START, *b"user\n", *self.instruction.encode(), IM_END, *b"\n"]
        return [*user, IM_START, *b"assistant\n"]

    def answer_ids(self) -> list[int]:
        return [*self.code.encode(), IM_END, *b"\n"]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative: str, held_out_per_mille: int = 50) -> bool:
    digest = hashlib.sha256(relative.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < held_out_per_mille


def list_sources(root: Path) -> list[SourceFile]:
    """Every ``.py`` under ``root`` (sorted by path), minus third-party and oversized files."""
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in EXCLUDED_PARTS)
        for name in sorted(names):
            path = Path(directory) / name
            if not name.endswith(".py") or not path.is_file():
                continue
            data = path.read_bytes()
            if 0 < len(data) <= MAX_FILE_BYTES:
                files.append(SourceFile(path.relative_to(root).as_posix(), data))
    return sorted(files, key=lambda source: source.relative)


def spread_sample(files: list[SourceFile], count: int | None) -> list[SourceFile]:
    """``count`` files spread evenly over the sorted list (all of them when ``count`` is None)."""
    if count is None or count >= len(files):
        return files
    step = len(files) / count
    return [files[int(i * step)] for i in range(count)]


def split_sources(
    files: Iterable[SourceFile], held_out_per_mille: int = 50
) -> tuple[list[SourceFile], list[SourceFile]]:
    train, held_out = [], []
    for source in files:
        (held_out if is_held_out(source.relative, held_out_per_mille) else train).append(source)
    return train, held_out


def docstring_summary(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The docstring's first line as a clause ("Return the sum." -> "returns the sum"), or None."""
    doc = (ast.get_docstring(node) or "").strip()
    if not doc:
        return None
    line = doc.splitlines()[0].strip().rstrip(".")
    if len(line) < 8 or not line[0].isalpha() or not line.isascii():
        return None
    words = line.split()
    first = words[0].lower()
    if first in {"return", "compute", "create", "make", "build", "convert", "check", "get", "find", "parse"}:
        first += "s"
    return " ".join([first, *words[1:]])


def signature_of(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    if args.vararg:
        names.append("*" + args.vararg.arg)
    names += [a.arg for a in args.kwonlyargs]
    if args.kwarg:
        names.append("**" + args.kwarg.arg)
    return f"{node.name}({', '.join(names)})"


def function_examples(source: str) -> list[ChatExample]:
    """Chat examples for every documented function or method in ``source`` (empty if it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines(keepends=True)
    examples = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
            continue
        summary = docstring_summary(node)
        segment = "".join(lines[node.lineno - 1 : node.end_lineno])
        if summary is None or len(segment) > MAX_FUNCTION_BYTES:
            continue
        code = textwrap.dedent(segment).rstrip() + "\n"
        template = INSTRUCTION_TEMPLATES[len(examples) % len(INSTRUCTION_TEMPLATES)]
        examples.append(ChatExample(template.format(signature=signature_of(node), summary=summary), code))
    return examples


@dataclass
class TokenStream:
    """All documents concatenated; ``chat_starts`` are the stream offsets just after each chat prompt's
    ``<|im_start|>assistant\\n`` (where an answer begins)."""

    tokens: torch.Tensor
    chat_starts: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.tokens.numel())


class _StreamBuilder:
    def __init__(self) -> None:
        self.pieces: list[np.ndarray] = []
        self.offset = 0

    def add(self, ids: bytes | list[int]) -> None:
        if isinstance(ids, bytes):
            array = np.frombuffer(ids, dtype=np.uint8).astype(np.int16)
        else:
            array = np.array(ids, dtype=np.int16)
        self.pieces.append(array)
        self.offset += array.size


def _examples_of(data: bytes) -> list[ChatExample]:
    try:
        return function_examples(data.decode())
    except UnicodeDecodeError:
        return []


def build_stream(files: Sequence[SourceFile], with_chat: bool = True, workers: int | None = None) -> TokenStream:
    """Raw files and their chat examples, each document followed by ``<|endoftext|>``.

    Parsing every file is the slow part, so it runs in ``workers`` processes (default: one per CPU).
    """
    examples: Iterable[list[ChatExample]] = [[] for _unused in files]
    if with_chat:
        workers = workers or os.cpu_count() or 1
        if workers > 1 and len(files) > workers:
            with ProcessPoolExecutor(workers) as pool:
                examples = list(pool.map(_examples_of, [f.data for f in files], chunksize=8))
        else:
            examples = [_examples_of(f.data) for f in files]
    builder = _StreamBuilder()
    chat_starts: list[int] = []
    for source, file_examples in zip(files, examples, strict=True):
        builder.add(source.data)
        builder.add([END_OF_TEXT])
        for example in file_examples:
            builder.add(example.prompt_ids())
            chat_starts.append(builder.offset)
            builder.add(example.answer_ids())
            builder.add([END_OF_TEXT])
    if not builder.pieces:
        raise ValueError("the corpus is empty")
    tokens = torch.from_numpy(np.concatenate(builder.pieces))
    return TokenStream(tokens, torch.tensor(chat_starts, dtype=torch.long))


def random_windows(stream: TokenStream, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``length`` consecutive tokens at uniform random offsets, as int64 ``[count, length]``."""
    if stream.size < length:
        raise ValueError(f"the stream has {stream.size} tokens, fewer than one window of {length}")
    starts = torch.randint(0, stream.size - length + 1, (count,), generator=generator)
    return stream.tokens[starts[:, None] + torch.arange(length)].long()


def windows_ending_at(stream: TokenStream, ends: torch.Tensor, length: int) -> torch.Tensor:
    """Windows of ``length`` tokens ending just before each offset in ``ends`` (clamped to the stream start)."""
    starts = (ends - length).clamp(min=0)
    return stream.tokens[starts[:, None] + torch.arange(length)].long()
