"""Sends greedy chat requests to a local SGLang-compatible server and prints JSON.

usage: smoke.py [--secrets-file FILE] PORT MODEL MAX_TOKENS COUNT PROMPT [PROMPT...]
Asks each prompt COUNT times, in order, and prints {"answers": [...], "contents": [...], "latency_s": [...]} in that
order (the smoke check asks one prompt twice; the quality gate asks its prompts once each); exits 1 with a message when
a request fails.

Reasoning models: the request asks the chat template not to think (``enable_thinking: false``, which Qwen3-style
templates honour and others ignore), and an answer is the reasoning text (``reasoning_content``, what SGLang's
``--reasoning-parser`` splits off) followed by the content, so a think block that did not finish within MAX_TOKENS
still counts as an answer instead of an empty one. ``contents`` holds the content alone, the answer after the think
block: what the quality gate compares, since two answers that share a long think block and then differ are different
answers.

The API key, when the server has one, is read from the root-only secrets file the server itself reads
(``--config FILE``, one ``api-key: KEY`` line): an argument or an environment variable set by Ansible would put it
in a command line (Ansible prefixes a task's ``environment`` to the remote ``sh -c`` command).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request


def request_body(model: str, max_tokens: int, prompt: str) -> dict:
    """One greedy chat request that asks the template not to think."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, "chat_template_kwargs": {"enable_thinking": False}}


def api_key_from(secrets_text: str) -> str:
    """The ``api-key`` of SGLang's YAML config file as the role writes it (one mapping line, the value plain, single-
    or double-quoted as a YAML dumper quotes it); without PyYAML, which the serving host's python3 may lack."""
    for line in secrets_text.splitlines():
        name, separator, value = line.partition(":")
        if separator and name.strip() == "api-key":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == "'":
                return value[1:-1].replace("''", "'")
            if len(value) >= 2 and value[0] == value[-1] == '"':
                return json.loads(value)
            return value
    raise ValueError("the secrets file has no api-key line")


def ask(port: int, model: str, max_tokens: int, prompt: str, api_key: str = "") -> tuple[dict, float]:
    body = request_body(model, max_tokens, prompt)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                     headers)
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.load(response)
    latency = time.monotonic() - started
    return reply["choices"][0]["message"], latency


def answer_text(message: dict) -> str:
    """The reasoning (if the server split any off) and the content, as one text."""
    return (message.get("reasoning_content") or "") + (message.get("content") or "")


def main(argv: list[str]) -> int:
    api_key = ""
    if argv[:1] == ["--secrets-file"]:
        try:
            with open(argv[1], encoding="utf-8") as secrets:
                api_key = api_key_from(secrets.read())
        except (OSError, ValueError) as error:
            print(f"smoke: cannot read the API key from {argv[1]}: {error}", file=sys.stderr)
            return 1
        argv = argv[2:]
    port, model, max_tokens, count, prompts = int(argv[0]), argv[1], int(argv[2]), int(argv[3]), argv[4:]
    answers, contents, latencies = [], [], []
    for prompt in (p for p in prompts for _unused in range(count)):
        try:
            message, latency = ask(port, model, max_tokens, prompt, api_key)
        except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError) as error:
            print(f"smoke request failed: {type(error).__name__}: {error}", file=sys.stderr)
            return 1
        answers.append(answer_text(message))
        contents.append(message.get("content") or "")
        latencies.append(round(latency, 3))
    print(json.dumps({"answers": answers, "contents": contents, "latency_s": latencies}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
