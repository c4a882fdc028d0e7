"""Sends the same greedy chat request N times to a local SGLang-compatible server and prints JSON.

usage: smoke.py PORT MODEL MAX_TOKENS COUNT PROMPT   (API key, if any, from the SGLANG_API_KEY environment)
Prints {"answers": [...], "latency_s": [...]}; exits 1 with a message when a request fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request


def ask(port: int, model: str, max_tokens: int, prompt: str) -> tuple[str, float]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens}
    headers = {"Content-Type": "application/json"}
    if os.environ.get("SGLANG_API_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["SGLANG_API_KEY"]
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                     headers)
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.load(response)
    latency = time.monotonic() - started
    return reply["choices"][0]["message"].get("content") or "", latency


def main(argv: list[str]) -> int:
    port, model, max_tokens, count, prompt = int(argv[0]), argv[1], int(argv[2]), int(argv[3]), argv[4]
    answers, latencies = [], []
    for _unused in range(count):
        try:
            answer, latency = ask(port, model, max_tokens, prompt)
        except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError) as error:
            print(f"smoke request failed: {type(error).__name__}: {error}", file=sys.stderr)
            return 1
        answers.append(answer)
        latencies.append(round(latency, 3))
    print(json.dumps({"answers": answers, "latency_s": latencies}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
