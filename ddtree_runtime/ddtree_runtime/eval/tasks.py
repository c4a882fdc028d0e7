"""The coding-task suite and free-form prompt files.

The suite's tasks were written for this project: short, common programming exercises phrased the way the
lab's smoke request is ("Write a Python function ... that ..."). Each becomes a ChatML prompt, so it works
with the lab's byte tokenizer and as raw text on SGLang's ``/generate``.

Prompt files: ``*.txt`` (the whole file is one raw prompt, named after the file) and ``*.jsonl`` (one object
per line with ``name`` and either ``prompt`` (raw text), ``instruction`` (wrapped as a chat turn) or
``messages`` (a chat)). A directory means every ``.txt``/``.jsonl`` file in it, sorted by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_runtime.tokenizer import chat_prompt

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
HELD_OUT_PROMPTS = PROMPTS_DIR / "stdlib-heldout.jsonl"


@dataclass(frozen=True)
class EvalPrompt:
    name: str
    text: str
    """The exact prompt text sent to the model (chat prompts already carry the ChatML markup)."""


def chat_task(name: str, instruction: str) -> EvalPrompt:
    return EvalPrompt(name, chat_prompt([{"role": "user", "content": instruction}]))


CODING_TASKS: tuple[EvalPrompt, ...] = (
    chat_task("fizzbuzz", "Write a Python function fizzbuzz(n) that returns the FizzBuzz sequence up to n."),
    chat_task(
        "bfs",
        "Write a Python function bfs(graph, start) that returns the nodes of a "
        "graph in breadth-first order.",
    ),
    chat_task(
        "merge_sort",
        "Write a Python function merge_sort(items) that returns a sorted copy "
        "of a list using merge sort.",
    ),
    chat_task(
        "binary_search",
        "Write a Python function binary_search(items, target) that returns the "
        "index of target in a sorted list, or -1.",
    ),
    chat_task(
        "is_palindrome",
        "Write a Python function is_palindrome(text) that returns True if the "
        "string reads the same backwards.",
    ),
    chat_task(
        "fibonacci",
        "Write a Python function fibonacci(n) that returns the first n "
        "Fibonacci numbers as a list.",
    ),
    chat_task(
        "word_count",
        "Write a Python function word_count(text) that returns a dictionary "
        "mapping each word to its count.",
    ),
    chat_task("flatten", "Write a Python function flatten(nested) that returns a flat list from a list of lists."),
    chat_task("gcd", "Write a Python function gcd(a, b) that returns the greatest common divisor of two integers."),
    chat_task(
        "read_config",
        "Write a Python function read_config(path) that parses a file of "
        "key=value lines into a dict.",
    ),
    chat_task(
        "matrix_multiply",
        "Write a Python function matrix_multiply(a, b) that returns the "
        "product of two matrices.",
    ),
    chat_task(
        "lru_cache",
        "Implement a Python class LRUCache with get(key) and put(key, value) "
        "methods and a fixed capacity.",
    ),
)


def _prompt_from_record(record: Any, origin: str) -> EvalPrompt:
    if not isinstance(record, dict) or not isinstance(record.get("name"), str) or not record["name"]:
        raise ValueError(f"{origin}: each line must be an object with a non-empty 'name'")
    name = record["name"]
    if isinstance(record.get("prompt"), str) and record["prompt"]:
        return EvalPrompt(name, record["prompt"])
    if isinstance(record.get("instruction"), str) and record["instruction"]:
        return chat_task(name, record["instruction"])
    messages = record.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        return EvalPrompt(name, chat_prompt(messages))
    raise ValueError(f"{origin}: prompt {name!r} needs a non-empty 'prompt', 'instruction' or 'messages'")


def load_prompt_file(path: Path) -> list[EvalPrompt]:
    if path.suffix == ".txt":
        text = path.read_text()
        if not text:
            raise ValueError(f"{path}: the prompt file is empty")
        return [EvalPrompt(path.stem, text)]
    if path.suffix == ".jsonl":
        prompts = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: invalid JSON: {error}") from None
                prompts.append(_prompt_from_record(record, f"{path}:{number}"))
        if not prompts:
            raise ValueError(f"{path}: no prompts")
        return prompts
    raise ValueError(f"{path}: prompt files must be .txt or .jsonl")


def load_prompts(paths: list[Path]) -> list[EvalPrompt]:
    """Prompts from files and directories, in order; names must be unique."""
    prompts: list[EvalPrompt] = []
    for path in paths:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in (".txt", ".jsonl"))
            if not files:
                raise ValueError(f"{path}: no .txt or .jsonl prompt files")
            for file in files:
                prompts += load_prompt_file(file)
        elif path.is_file():
            prompts += load_prompt_file(path)
        else:
            raise FileNotFoundError(f"{path}: no such prompt file or directory")
    check_unique(prompts)
    return prompts


def check_unique(prompts: list[EvalPrompt]) -> None:
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.name in seen:
            raise ValueError(f"duplicate prompt name {prompt.name!r}")
        seen.add(prompt.name)
