"""Where generations come from: the reference engine in this process, or a running SGLang (or lab) server.

Both return a :class:`Sample` per prompt: the generated tokens/text, the per-round acceptance lengths
(accepted drafts + the bonus token, the DDTree paper's tau convention) and the wall time.

HTTP: SGLang's native ``POST /generate`` reports ``meta_info.completion_tokens`` and, for speculative
servers, ``meta_info.spec_verify_ct`` (verify rounds). The first token comes from the prefill, so the
rounds produced ``completion_tokens - 1`` tokens and tau = ``(completion_tokens - 1) / spec_verify_ct``.
When the last round overshoots ``max_new_tokens`` the overshoot is discarded, so this is a lower bound
(by under ``1 / rounds``). The lab server also returns ``spec_acceptance_lengths``, which is exact and is
used when present. A server that reports no ``spec_verify_ct`` decodes autoregressively (tau 1).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ddtree_runtime.reference import DFlashDrafter, SpeculativeDecoder, load_dflash, load_target
from ddtree_runtime.reference.decoding import Method
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tokenizer import load_tokenizer

SHIPPED_MODELS = Path(__file__).resolve().parents[2] / "models"
SHIPPED_TARGET = SHIPPED_MODELS / "pivot-coder-tiny"
SHIPPED_DRAFTER = SHIPPED_MODELS / "pivot-coder-tiny-dflash"
SHIPPED_HYBRID_TARGET = SHIPPED_MODELS / "pivot-coder-tiny-hybrid"
SHIPPED_HYBRID_DRAFTER = SHIPPED_MODELS / "pivot-coder-tiny-hybrid-dflash"
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class RunSpec:
    """One column of the evaluation: a decoding method (and for DDTree a budget) with one drafter."""

    method: Method
    drafter: str | None = None
    budget: int = 0
    draft_tokens: int = 16
    max_topk: int | None = None

    @property
    def label(self) -> str:
        if self.method == "ar":
            return "AR"
        if self.method == "dflash":
            return "DFlash chain"
        return f"DDTree-{self.budget}" + (f" (top-{self.max_topk})" if self.max_topk else "")


@dataclass
class Sample:
    tokens: list[int]
    text: str
    seconds: float
    acceptance_lengths: list[int] = field(default_factory=list)
    rounds: int = 0
    tau: float = 1.0


class EvalError(RuntimeError):
    """A backend could not produce a generation (bad server answer, unreachable server, bad model dir)."""


class ReferenceBackend:
    """The pure-PyTorch reference engine on local target/drafter directories (the target's architecture, dense
    Qwen3 or the Qwen3.5/3.6 hybrid, is read from its ``config.json``)."""

    def __init__(self, target_dir: Path, drafter_dirs: dict[str, Path], device: str, dtype: str) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}")
        for path in (target_dir, *drafter_dirs.values()):
            if not (path / "config.json").is_file():
                raise EvalError(f"{path} is not a model directory (no config.json)")
        torch_dtype = DTYPES[dtype]
        self.target = load_target(target_dir, dtype=torch_dtype, device=device)
        self.tokenizer = load_tokenizer(target_dir)
        self.eos = frozenset(self.target.config.eos_token_id) | self.tokenizer.eos_token_ids
        self.decoders = {None: SpeculativeDecoder(self.target)}
        for label, path in drafter_dirs.items():
            drafter = DFlashDrafter(load_dflash(path, dtype=torch_dtype, device=device), self.target)
            self.decoders[label] = SpeculativeDecoder(self.target, drafter)
        self.description = {"backend": "reference", "target": str(target_dir), "device": device, "dtype": dtype,
                            "architecture": type(self.target).__name__}

    def generate(self, prompt: str, spec: RunSpec, params: SamplingParams) -> Sample:
        decoder = self.decoders.get(spec.drafter if spec.method != "ar" else None)
        if decoder is None:
            raise EvalError(f"no drafter named {spec.drafter!r}")
        ids = self.tokenizer.encode(prompt)
        begin = time.perf_counter()
        result = decoder.generate(
            ids, params, spec.method, draft_tokens=spec.draft_tokens, budget=spec.budget, max_topk=spec.max_topk
        )
        seconds = time.perf_counter() - begin
        stats = result.stats
        return Sample(
            tokens=result.tokens,
            text=self.tokenizer.decode(result.tokens),
            seconds=seconds,
            acceptance_lengths=list(stats.acceptance_lengths),
            rounds=stats.rounds,
            tau=stats.tau if stats.rounds else 1.0,
        )


class HttpBackend:
    """A running SGLang-compatible server: ``GET /server_info`` once, ``POST /generate`` per prompt."""

    def __init__(
        self, url: str, api_key: str | None = None, timeout: float = 600.0, ignore_eos: bool = False
    ) -> None:
        self.url = url.rstrip("/")
        self.ignore_eos = ignore_eos
        self.api_key = api_key
        self.timeout = timeout
        info = self._call("/server_info", None)
        if not isinstance(info, dict):
            raise EvalError(f"{self.url}/server_info did not return a JSON object")
        self.info = info
        self.description = {
            "backend": "http",
            "url": self.url,
            "model_path": info.get("model_path"),
            "speculative_algorithm": info.get("speculative_algorithm"),
            "speculative_num_draft_tokens": info.get("speculative_num_draft_tokens"),
            "speculative_draft_model_path": info.get("speculative_draft_model_path"),
            "ddtree_budget": info.get("ddtree_budget"),
            "version": info.get("version"),
        }

    def served_spec(self) -> RunSpec:
        """What the server runs, as a :class:`RunSpec` (for labels only: the server decides how it decodes)."""
        algorithm = str(self.info.get("speculative_algorithm") or "").upper()
        draft_tokens = int(self.info.get("speculative_num_draft_tokens") or 1)
        drafter = self.info.get("speculative_draft_model_path")
        label = Path(str(drafter)).name if drafter else None
        if algorithm == "DDTREE":
            budget = int(self.info.get("ddtree_budget") or draft_tokens - 1)
            topk = self.info.get("ddtree_topk")
            return RunSpec("ddtree", label, budget, draft_tokens, int(topk) if topk else None)
        if algorithm in ("DFLASH", "EAGLE", "EAGLE3", "NEXTN"):
            return RunSpec("dflash", label, 0, draft_tokens)
        return RunSpec("ar")

    def _call(self, path: str, body: dict[str, Any] | None) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        method = "GET" if body is None else "POST"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            raise EvalError(f"{self.url}{path} answered HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as error:
            raise EvalError(f"{self.url}{path} is unreachable: {error}") from None
        except json.JSONDecodeError as error:
            raise EvalError(f"{self.url}{path} did not return JSON: {error}") from None

    def generate(self, prompt: str, spec: RunSpec, params: SamplingParams) -> Sample:
        del spec  # the server decodes the way it was launched
        sampling: dict[str, Any] = {
            "temperature": params.temperature,
            "max_new_tokens": params.max_new_tokens,
            "ignore_eos": self.ignore_eos,
        }
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        begin = time.perf_counter()
        answer = self._call("/generate", {"text": prompt, "sampling_params": sampling})
        seconds = time.perf_counter() - begin
        return sample_from_response(answer, seconds)


def sample_from_response(answer: Any, seconds: float) -> Sample:
    """A :class:`Sample` from one SGLang ``/generate`` response (see the module docstring for tau)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("meta_info"), dict):
        raise EvalError("the /generate response has no meta_info")
    meta = answer["meta_info"]
    try:
        completion = int(meta["completion_tokens"])
    except (KeyError, TypeError, ValueError):
        raise EvalError("the /generate response has no completion_tokens") from None
    tokens = [int(t) for t in answer.get("output_ids") or []]
    text = str(answer.get("text") or "")
    lengths = [int(n) for n in meta.get("spec_acceptance_lengths") or []]
    verify = meta.get("spec_verify_ct")
    if lengths:
        return Sample(tokens, text, seconds, lengths, len(lengths), sum(lengths) / len(lengths))
    if verify:
        rounds = int(verify)
        return Sample(tokens, text, seconds, [], rounds, max(completion - 1, 0) / rounds)
    return Sample(tokens, text, seconds, [], max(completion - 1, 0), 1.0)
