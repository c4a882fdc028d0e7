"""The acceptance cases: stock SGLang servers started one after another, driven over HTTP, held to the baseline.

Each server is started, used by every case that needs it, and stopped before the next starts (one GPU). Results
are :class:`CaseResult` lines; equality verdicts that depend on SGLang's own DFLASH (bf16 can make exact equality
impossible for it too) are settled in :meth:`Suite.verdicts` from every server run so far.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ddtree_runtime.acceptance.launch import DEFAULT_DTYPE, Server, ServerError, ServerSpec, generate, start_server
from ddtree_runtime.acceptance.prompts import STOP_TOKEN_IDS, LoadRequest, Prompt, load_mix
from ddtree_runtime.acceptance.round_cost import (
    SHAPE_8B,
    SYNC_FLAGS,
    RoundCostShape,
    measure_batch,
    measure_round_cost,
    round_cost_prompt,
)
from ddtree_runtime.acceptance.round_trace import profile_decode_rounds
from ddtree_runtime.acceptance.stats import (
    Agreement,
    agreement,
    chi_square_two_sample,
    first_difference,
    fisher_one_sided,
    margins_at_divergence,
    top2_margins,
)
from ddtree_runtime.acceptance.throughput import THROUGHPUT_BATCHES

GREEDY = {"temperature": 0.0, "stop_token_ids": STOP_TOKEN_IDS}
SAMPLED = {"temperature": 0.7, "top_p": 0.95, "stop_token_ids": STOP_TOKEN_IDS}
NEWLINE = ord("\n")
GRAMMAR_REGEX = "[a-z ]+"


@dataclass(frozen=True)
class StressRequest:
    """A case-8 request: its sampling parameters, what else the body carries, and what its answer must satisfy on
    its own (besides agreeing with the baseline's)."""

    label: str
    sampling: dict[str, Any]
    extra: dict[str, Any]
    honoured: Callable[[list[int]], bool]
    rule: str


def _no_newline_before_the_end(ids: list[int]) -> bool:
    return NEWLINE not in ids[:-1]


def _only_lowercase_and_spaces(ids: list[int]) -> bool:
    body = ids[:-1] if ids and ids[-1] in STOP_TOKEN_IDS else ids
    return bool(body) and all(t == ord(" ") or ord("a") <= t <= ord("z") for t in body)


STRESS_REQUESTS = (
    StressRequest("logprobs (top 3)", {**GREEDY, "max_new_tokens": 48},
                  {"return_logprob": True, "top_logprobs_num": 3}, bool, "some tokens"),
    StressRequest("stop token id", {**GREEDY, "max_new_tokens": 64, "stop_token_ids": [*STOP_TOKEN_IDS, NEWLINE]},
                  {}, _no_newline_before_the_end, "no newline before the last token"),
    StressRequest("stop string", {**GREEDY, "max_new_tokens": 64, "stop": ["\n"]}, {}, _no_newline_before_the_end,
                  "no newline before the last token"),
    StressRequest("grammar (regex)", {**GREEDY, "max_new_tokens": 32, "regex": GRAMMAR_REGEX}, {},
                  _only_lowercase_and_spaces, f"the bytes match {GRAMMAR_REGEX} (an end token may follow)"),
)
"""Requests that stress the verify path (case 8): each must be served correctly (the same answer as the baseline's
up to a bf16 near-tie, and its own rule) or fail alone with a clean per-request error, the server still serving."""
SAMPLING_ALPHA = 1e-3
"""Per-position false-failure probability of the distribution test (two positions: at most 2e-3 in all)."""
SAMPLING_PROMPT = "heldout:heapq.py:heappop"
"""The prompt the distribution test samples: one whose next tokens are uncertain at T 0.7 (the coding tasks'
first tokens are near-certain for the tiny pair: a histogram of one token tests nothing)."""
REQUEST_PROMPT = "bfs"
"""The prompt of the case-8 requests."""
TIE_MARGIN = 0.5
"""A greedy divergence counts as a bf16 near-tie when the baseline's own top-2 log-probability gap at that
position is below this. bf16 keeps 8 significant bits, so logits of magnitude 10-30 carry rounding errors of
0.05-0.1 per operation, and a verify batch of another shape (2-65 tokens per request instead of 1) rounds
differently; at the 2026-12-02 H200 run's DFLASH divergences the float32 reference's gaps were 0.03-0.30."""
MARGIN_CASE = "1. baseline with logprobs: same tokens, or a fork at a near-tie"


def hybrid_margin_case(label: str) -> str:
    return f"7. {label} baseline with logprobs: same tokens, or a fork at a near-tie"


HYBRID_MARGIN_CASE = hybrid_margin_case("hybrid")
RATE_ALPHA = 0.05
"""DDTREE is held to DFLASH's divergence rate by a one-sided Fisher exact test at this level."""
DETERMINISTIC_CASE = "9. deterministic inference: greedy == baseline"
DETERMINISTIC_START = "9. deterministic inference: start + /server_info"
Measured = TypeVar("Measured")
MEASUREMENT_ERRORS = (ServerError, OSError)
"""What a figure's measurement may raise (an HTTP error answer, a dead server, a refused or timed-out connection):
recorded as a failed case line, and the server's other cases go on."""


@dataclass
class CaseResult:
    case: str
    server: str
    ok: bool
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"case": self.case, "server": self.server, "ok": self.ok, "figures": self.figures,
                "detail": self.detail}


@dataclass
class GreedyRun:
    outputs: list[list[int]]
    completion_tokens: int
    verify_rounds: int
    seconds: float

    @property
    def accept_length(self) -> float | None:
        return self.completion_tokens / self.verify_rounds if self.verify_rounds else None


def output_ids(answer: dict[str, Any]) -> list[int]:
    ids = answer.get("output_ids")
    if not isinstance(ids, list):
        raise ServerError(f"answer without output_ids: {str(answer)[:300]}")
    return [int(t) for t in ids]


def greedy_run(server: Server, prompts: Sequence[Prompt], max_new_tokens: int) -> GreedyRun:
    started = time.monotonic()
    answers = generate(server, [p.input_ids for p in prompts], {**GREEDY, "max_new_tokens": max_new_tokens})
    seconds = time.monotonic() - started
    outputs = [output_ids(a) for a in answers]
    metas = [a.get("meta_info", {}) for a in answers]
    return GreedyRun(outputs=outputs, completion_tokens=sum(int(m.get("completion_tokens", 0)) for m in metas),
                     verify_rounds=sum(int(m.get("spec_verify_ct", 0) or 0) for m in metas), seconds=seconds)


def margin_run(server: Server, prompts: Sequence[Prompt],
               max_new_tokens: int) -> tuple[list[list[int]], list[list[float | None]]]:
    """Greedy outputs with the top-2 log-probability gap at every position (a separate pass: logprob requests
    may take other kernels, so the timed greedy run stays plain)."""
    answers = generate(server, [p.input_ids for p in prompts], {**GREEDY, "max_new_tokens": max_new_tokens},
                       {"return_logprob": True, "top_logprobs_num": 2})
    return [output_ids(a) for a in answers], [top2_margins(a.get("meta_info", {})) for a in answers]


def concurrent_run(server: Server, requests: Sequence[LoadRequest]) -> tuple[list[list[int] | None], list[str]]:
    """Every request on its own HTTP connection at once; returns outputs (None on error) and the errors."""

    def one(request: LoadRequest) -> list[int]:
        answer = generate(server, [request.input_ids], {**GREEDY, "max_new_tokens": request.max_new_tokens})
        return output_ids(answer[0])

    outputs: list[list[int] | None] = []
    errors: list[str] = []
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        futures = [pool.submit(one, r) for r in requests]
        for request, future in zip(requests, futures, strict=True):
            try:
                outputs.append(future.result())
            except Exception as error:  # every failure is a finding of the load case
                outputs.append(None)
                errors.append(f"{request.name}: {error}")
    return outputs, errors


def sampled_tokens(server: Server, prompt: Prompt, samples: int, positions: int, batch: int = 100) -> list[list[int]]:
    """``samples`` independent sampled continuations of ``positions`` tokens (requests batched ``batch`` at a time)."""
    rows: list[list[int]] = []
    while len(rows) < samples:
        count = min(batch, samples - len(rows))
        answers = generate(server, [prompt.input_ids] * count,
                           {**SAMPLED, "max_new_tokens": positions, "stop_token_ids": []})
        rows += [output_ids(a) for a in answers]
    return rows


STATE_FILE = "state.json"
"""What a run leaves in its out directory for a later run to go on from (``--resume``): every case line, the
servers, and the baseline's outputs the speculative servers are compared with."""


@dataclass(frozen=True)
class SuiteSettings:
    python: str
    """The interpreter that runs ``sglang.launch_server``."""
    max_new_tokens: int = 128
    health_timeout: float = 600.0
    dtype: str = DEFAULT_DTYPE
    tp_size: int = 1
    """``--tp-size`` of every server (tensor parallel over that many GPUs)."""


class Suite:
    def __init__(self, out_dir: Path, prompts: list[Prompt], settings: SuiteSettings) -> None:
        self.out_dir = out_dir
        self.prompts = prompts
        self.python = settings.python
        self.max_new_tokens = settings.max_new_tokens
        self.health_timeout = settings.health_timeout
        self.dtype = settings.dtype
        self.tp_size = settings.tp_size
        self.results: list[CaseResult] = []
        self.servers: list[dict[str, Any]] = []
        self.baseline: GreedyRun | None = None
        self.baseline_load: list[list[int] | None] | None = None
        self.baseline_samples: list[list[int]] | None = None
        self.baseline_logprobs: list[dict[str, Any]] | None = None
        self.hybrid_baseline: GreedyRun | None = None
        self.hybrid_baseline_name = "hybrid-baseline"
        self.hybrid_baseline_requests: list[dict[str, Any]] | None = None
        """The hybrid baseline's answers to the case-8 requests (with its top-2 gaps), for the hybrid servers'."""
        self.margins: dict[str, dict[str, list[float | None]]] = {}
        """Baseline name -> prompt name -> the baseline's top-2 gap at each position of its logprob pass."""
        self.margin_paths: dict[str, dict[str, list[int]]] = {}
        """Baseline name -> prompt name -> the logprob pass's greedy output (the path the margins belong to)."""
        self.divergence_margins: dict[tuple[str, str], dict[str, float | None]] = {}
        """(case, server) -> divergent prompt -> the baseline's top-2 gap where the server's output left it."""
        self.load = load_mix(prompts)
        self.agreements: dict[tuple[str, str], Agreement] = {}
        """(case, server) -> agreement with the baseline, settled against DFLASH's in :meth:`equality_verdicts`."""
        self.accept_lengths: dict[str, float | None] = {}
        self.run_figures: dict[tuple[str, str], dict[str, Any]] = {}
        self.throughput: dict[str, dict[str, Any]] = {}
        """Server name -> greedy tokens/s at batch 1 and 16 on the trained pair (:mod:`.throughput`)."""
        self.round_costs: dict[str, dict[str, Any]] = {}
        """Server name -> ms per decode round at real size, random weights (:mod:`.round_cost`)."""
        self.round_profiles: dict[str, dict[str, Any]] = {}
        """Server name -> where a round's GPU time goes, from a profiler trace (:mod:`.round_trace`)."""
        self.deterministic: dict[str, dict[str, Any]] = {}
        """Server name -> algorithm and greedy outputs with ``--enable-deterministic-inference`` (case 9)."""
        self.steps_done: list[str] = []
        """Plan steps finished (by name); ``--resume`` skips them."""

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.prompts]

    # ---- state ----------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "max_new_tokens": self.max_new_tokens,
            "tp_size": self.tp_size,
            "results": [r.as_dict() for r in self.results],
            "servers": self.servers,
            "baseline": None if self.baseline is None else vars(self.baseline),
            "baseline_load": self.baseline_load,
            "baseline_samples": self.baseline_samples,
            "baseline_logprobs": self.baseline_logprobs,
            "hybrid_baseline": None if self.hybrid_baseline is None else vars(self.hybrid_baseline),
            "hybrid_baseline_name": self.hybrid_baseline_name,
            "hybrid_baseline_requests": self.hybrid_baseline_requests,
            "margins": self.margins,
            "margin_paths": self.margin_paths,
            "divergence_margins": [{"case": c, "server": n, "margins": m}
                                   for (c, n), m in self.divergence_margins.items()],
            "agreements": [{"case": c, "server": n, "prompts": a.prompts, "equal": a.equal,
                            "first_divergence": a.first_divergence} for (c, n), a in self.agreements.items()],
            "run_figures": [{"case": c, "server": n, "figures": f} for (c, n), f in self.run_figures.items()],
            "accept_lengths": self.accept_lengths,
            "throughput": self.throughput,
            "round_costs": self.round_costs,
            "round_profiles": self.round_profiles,
            "deterministic": self.deterministic,
            "steps_done": self.steps_done,
        }

    def save(self) -> None:
        path = self.out_dir / STATE_FILE
        path.with_suffix(".tmp").write_text(json.dumps(self.state()))
        path.with_suffix(".tmp").replace(path)

    def resume(self) -> None:
        """Take up the state an earlier run left in the out directory (same dtype and output length)."""
        path = self.out_dir / STATE_FILE
        if not path.is_file():
            return
        state = json.loads(path.read_text())
        made_with = (state["dtype"], state["max_new_tokens"], state.get("tp_size", 1))
        if made_with != (self.dtype, self.max_new_tokens, self.tp_size):
            raise ValueError(f"{path} was made with dtype {made_with[0]}, {made_with[1]} new tokens and --tp-size "
                             f"{made_with[2]}; resume with the same settings or use another --out")
        self.results = [CaseResult(**r) for r in state["results"]]
        self.servers = state["servers"]
        self.baseline = None if state["baseline"] is None else GreedyRun(**state["baseline"])
        self.baseline_load = state["baseline_load"]
        self.baseline_samples = state["baseline_samples"]
        self.baseline_logprobs = state["baseline_logprobs"]
        hybrid = state["hybrid_baseline"]
        self.hybrid_baseline = None if hybrid is None else GreedyRun(**hybrid)
        self.hybrid_baseline_name = state.get("hybrid_baseline_name", self.hybrid_baseline_name)
        self.hybrid_baseline_requests = state.get("hybrid_baseline_requests")
        self.margins = state["margins"]
        # A state written before the paths were kept has none: its margins then count as unknown.
        self.margin_paths = state.get("margin_paths", {})
        self.divergence_margins = {(d["case"], d["server"]): d["margins"] for d in state["divergence_margins"]}
        self.agreements = {(a["case"], a["server"]): Agreement(a["prompts"], a["equal"], a["first_divergence"])
                           for a in state["agreements"]}
        self.run_figures = {(f["case"], f["server"]): f["figures"] for f in state["run_figures"]}
        self.accept_lengths = state["accept_lengths"]
        # A state written before these figures were measured has neither: its servers were not measured.
        self.throughput = state.get("throughput", {})
        self.round_costs = state.get("round_costs", {})
        self.round_profiles = state.get("round_profiles", {})
        self.deterministic = state.get("deterministic", {})
        self.steps_done = state["steps_done"]

    def forget(self, server: str) -> None:
        """Drop what an earlier run recorded for ``server`` (it is being run again)."""
        self.results = [r for r in self.results if r.server != server]
        self.servers = [s for s in self.servers if s["name"] != server]
        self.agreements = {key: value for key, value in self.agreements.items() if key[1] != server}
        self.divergence_margins = {key: value for key, value in self.divergence_margins.items()
                                   if key[1] != server}
        self.run_figures = {key: value for key, value in self.run_figures.items() if key[1] != server}
        self.accept_lengths.pop(server, None)
        self.throughput.pop(server, None)
        self.round_costs.pop(server, None)
        self.round_profiles.pop(server, None)
        self.deterministic.pop(server, None)

    def record(self, case: str, server: str, ok: bool, detail: str = "", **figures: Any) -> None:
        self.results.append(CaseResult(case, server, ok, figures, detail))

    # ---- servers ------------------------------------------------------------------------------------------

    def with_server(self, spec: ServerSpec, body: Callable[[Server], None]) -> None:
        """Start ``spec``, run ``body`` on it, stop it; a start or body failure is recorded, not raised."""
        self.forget(spec.name)
        server = start_server(spec, self.python, self.out_dir, self.dtype, tp_size=self.tp_size)
        entry: dict[str, Any] = {**spec.describe(), "command": server.command, "log": server.log_path.name}
        self.servers.append(entry)
        try:
            entry["ready_seconds"] = round(server.wait_healthy(self.health_timeout), 1)
            body(server)
        except Exception as error:
            self.record("start/run", spec.name, False, f"{type(error).__name__}: {error}")
        finally:
            entry["alive_at_end"] = server.alive()
            server.stop()
            entry["exit_code"] = server.process.returncode

    def check_identity(self, server: Server, algorithm: str | None, case: str = "2. start + /server_info") -> None:
        """``/health_generate`` answered; ``/server_info`` names the algorithm the server was started with."""
        info = server.call("/server_info").body
        reported = info.get("speculative_algorithm") if isinstance(info, dict) else None
        expected = algorithm
        ok = (reported or None) == expected
        figures = {"speculative_algorithm": reported, "ready_seconds": server.ready_seconds}
        if isinstance(info, dict):
            figures["speculative_num_draft_tokens"] = info.get("speculative_num_draft_tokens")
            figures["speculative_eagle_topk"] = info.get("speculative_eagle_topk")
            figures["attention_backend"] = info.get("attention_backend")
        self.record(case, server.spec.name, ok,
                    "" if ok else f"/server_info says {reported!r}, expected {expected!r}", **figures)

    # ---- baseline -----------------------------------------------------------------------------------------

    def run_baseline(self, spec: ServerSpec) -> None:
        def body(server: Server) -> None:
            run = greedy_run(server, self.prompts, self.max_new_tokens)
            self.baseline = run
            self.record("1. baseline greedy", spec.name, all(run.outputs), prompts=len(run.outputs),
                        tokens=run.completion_tokens, seconds=round(run.seconds, 2),
                        tokens_per_s=round(run.completion_tokens / run.seconds, 1))
            self.margin_pass(server, run, MARGIN_CASE)
            self.throughput_case(server)
            self.baseline_load, errors = concurrent_run(server, self.load)
            if errors:
                self.record("5. baseline load", spec.name, False, "; ".join(errors))
            self.baseline_samples = sampled_tokens(server, self.prompt(SAMPLING_PROMPT), 2000, 3)
            self.baseline_logprobs = self.logprob_answers(server, with_margins=True)

        self.with_server(spec, body)

    def margin_pass(self, server: Server, run: GreedyRun, case: str) -> None:
        """The baseline's top-2 gap along its greedy outputs (what tells a bf16 near-tie from a wrong token), from a
        second pass that asks for logprobs. On the H200 that pass left the plain run on 3 of 24 prompts (SGLang's
        own run-to-run bf16 noise): it passes when every such fork sits at a near-tie of its own, and the margins
        are then used only along the path they were measured on (:func:`margins_at_divergence`)."""
        outputs, margins = margin_run(server, self.prompts, self.max_new_tokens)
        name = server.spec.name
        self.margins[name] = dict(zip(self.names, margins, strict=True))
        self.margin_paths[name] = dict(zip(self.names, outputs, strict=True))
        same = agreement(self.names, outputs, run.outputs)
        forks = margins_at_divergence(same.first_divergence, dict(zip(self.names, run.outputs, strict=True)),
                                      self.margin_paths[name], self.margins[name])
        sure = sorted(prompt for prompt, margin in forks.items() if margin is None or margin >= TIE_MARGIN)
        if same.equal == same.prompts:
            detail = ""
        elif sure:
            detail = (f"the logprob pass left the plain greedy run where the baseline is not at a near-tie (gap >= "
                      f"{TIE_MARGIN} or unknown): {', '.join(sure)}")
        else:
            detail = (f"the logprob pass forked from the plain greedy run on {same.divergent}/{same.prompts} prompts, "
                      f"each at a near-tie (top-2 gap < {TIE_MARGIN}): the non-speculative server's own bf16 noise")
        self.record(case, name, not sure, detail, **same.as_dict(),
                    margin_at_fork={k: None if v is None else round(v, 4) for k, v in forks.items()})

    def prompt(self, name: str) -> Prompt:
        return next(p for p in self.prompts if p.name == name)

    def compare(self, case: str, server: str, names: Sequence[str], outputs: Sequence[Sequence[int]], *,
                references: Sequence[Sequence[int]], baseline: str) -> None:
        """Agreement of ``outputs`` with ``references`` and, for each divergence, the baseline's own top-2 gap
        there (``baseline``: whose greedy outputs and margins to read)."""
        found = agreement(names, outputs, references)
        self.agreements[(case, server)] = found
        self.divergence_margins[(case, server)] = margins_at_divergence(
            found.first_divergence, dict(zip(names, references, strict=True)), self.margin_paths.get(baseline, {}),
            self.margins.get(baseline, {}))

    # ---- speculative servers ------------------------------------------------------------------------------

    def run_speculative(self, spec: ServerSpec, *, load: bool, sampling: bool, requests: bool) -> None:
        graphs = "on" if spec.cuda_graphs else "off"
        case = "2. greedy == baseline" if spec.cuda_graphs else "4. greedy == baseline, CUDA graphs off"

        def body(server: Server) -> None:
            self.check_identity(server, spec.algorithm)
            if self.baseline is None:
                raise ServerError("no baseline outputs to compare with")
            run = greedy_run(server, self.prompts, self.max_new_tokens)
            self.compare(case, spec.name, self.names, run.outputs, references=self.baseline.outputs,
                         baseline="baseline")
            self.run_figures[(case, spec.name)] = {"accept_length": run.accept_length, "cuda_graphs": graphs,
                                                   "seconds": round(run.seconds, 2), "tokens": run.completion_tokens}
            if spec.cuda_graphs:
                self.accept_lengths[spec.name] = run.accept_length
                self.check_capture_log(server)
                self.throughput_case(server)
            if load:
                self.load_case(server)
            if sampling:
                self.sampling_case(server)
            if requests:
                self.request_cases(server)

        self.with_server(spec, body)

    # ---- figures: throughput on the trained pair, round cost at real size ------------------------------------

    def measure(self, figure: str, server: Server, measurement: Callable[[], Measured]) -> Measured | None:
        """``measurement()``'s figures, or None after recording its error as a failed ``figure`` case line."""
        try:
            return measurement()
        except MEASUREMENT_ERRORS as error:
            self.record(figure, server.spec.name, False, f"{type(error).__name__}: {str(error)[:500]}")
            return None

    def throughput_case(self, server: Server) -> None:
        """Greedy tokens/s at batch 1 and 16 (:mod:`.throughput`): figures for the report, not pass/fail."""
        sampling = {**GREEDY, "max_new_tokens": self.max_new_tokens}
        entry: dict[str, Any] = {"algorithm": server.spec.algorithm or "none", "budget": server.spec.budget}
        for figure, (batch, measurement) in THROUGHPUT_BATCHES.items():
            measured = self.measure(f"throughput at batch {batch}", server,
                                    partial(measurement, server, self.prompts, sampling))
            if measured is not None:
                entry[figure] = measured.as_dict()
        self.throughput[server.spec.name] = entry

    def run_round_cost(self, spec: ServerSpec, shape: RoundCostShape = SHAPE_8B) -> None:
        """A random-weight real-size server, started once: its identity, then its round cost at each of ``shape``'s
        batches (:mod:`.round_cost`)."""

        def body(server: Server) -> None:
            self.check_identity(server, spec.algorithm, "round cost: start + /server_info")
            measured = self.measure("round cost: ms per decode round", server,
                                    partial(measure_round_cost, server, shape))
            if measured is not None:
                self.round_costs[spec.name] = {"algorithm": spec.algorithm or "none", "budget": spec.budget,
                                               "shape": shape.name, "overlap": SYNC_FLAGS[0] not in spec.extra_flags,
                                               **measured}

        self.with_server(spec, body)

    def run_round_profile(self, spec: ServerSpec, shape: RoundCostShape = SHAPE_8B) -> None:
        """A random-weight real-size server profiled over decode rounds at batch 1 (:mod:`.round_trace`): GPU time per
        stage and idle time per round; the trace is kept under ``traces/<server>``."""

        def body(server: Server) -> None:
            self.check_identity(server, spec.algorithm, "round profile: start + /server_info")
            prompt = round_cost_prompt(0, shape.vocab_size)
            warm_up = partial(measure_batch, server, [prompt])  # compiles what the round launches, then measures
            if self.measure("round profile: warm-up", server, warm_up) is None:
                return
            profiled = self.measure("round profile: trace of decode rounds", server,
                                    partial(profile_decode_rounds, server, self.out_dir / "traces" / spec.name,
                                            prompt))
            if profiled is not None:
                trace = str(Path(profiled.pop("trace")).relative_to(self.out_dir))
                self.round_profiles[spec.name] = {"algorithm": spec.algorithm or "none", "budget": spec.budget,
                                                  "shape": shape.name, "overlap": SYNC_FLAGS[0] not in spec.extra_flags,
                                                  **profiled, "trace": trace}

        self.with_server(spec, body)

    def run_deterministic(self, spec: ServerSpec) -> None:
        """Case 9: greedy outputs with SGLang's ``--enable-deterministic-inference`` (the same prompts, one batch),
        settled against that flag's baseline in :meth:`deterministic_verdicts`."""

        def body(server: Server) -> None:
            self.check_identity(server, spec.algorithm, DETERMINISTIC_START)
            run = greedy_run(server, self.prompts, self.max_new_tokens)
            self.deterministic[spec.name] = {"algorithm": spec.algorithm or "none", "budget": spec.budget,
                                             "outputs": run.outputs, "accept_length": run.accept_length}

        self.with_server(spec, body)

    def deterministic_verdicts(self) -> list[CaseResult]:
        """With deterministic inference, DDTREE must equal the baseline token for token on every prompt; where
        SGLang's own DFLASH does not either, DDTREE passes when it diverges on no more prompts than DFLASH (the
        flag then does not make speculative decoding exact in this SGLang, and DDTREE is held to DFLASH's bar)."""
        runs = self.deterministic
        baseline = next((r for r in runs.values() if r["algorithm"] == "none"), None)
        if baseline is None:
            return []
        found = {name: agreement(self.names, r["outputs"], baseline["outputs"])
                 for name, r in runs.items() if r["algorithm"] != "none"}
        dflash = next((found[n] for n, r in runs.items() if r["algorithm"] == "DFLASH"), None)
        verdicts = []
        for name, result in found.items():
            figures = {**result.as_dict(), "accept_length": runs[name]["accept_length"]}
            if result.equal == result.prompts:
                ok, detail = True, "token for token equal to the deterministic baseline on every prompt"
            elif runs[name]["algorithm"] == "DFLASH":
                ok, detail = True, (f"SGLang's own DFLASH diverges on {result.divergent}/{result.prompts}: the bar "
                                    "for DDTREE")
            elif dflash is None:
                ok, detail = False, f"diverges on {result.divergent}/{result.prompts} and no DFLASH ran to compare"
            else:
                ok = result.divergent <= dflash.divergent
                detail = (f"diverges on {result.divergent}/{result.prompts}, DFLASH on {dflash.divergent}/"
                          f"{dflash.prompts}" + ("" if ok else ": more often than SGLang's own DFLASH"))
            verdicts.append(CaseResult(DETERMINISTIC_CASE, name, ok, figures, detail))
        return verdicts

    def figures(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The measured figures by kind, server by server (the report adds the ratios)."""
        return {"throughput": self.throughput, "round_cost": self.round_costs, "round_profile": self.round_profiles}

    # ---- the hybrid target (case 7) ------------------------------------------------------------------------

    def run_hybrid_baseline(self, spec: ServerSpec, label: str = "hybrid") -> None:
        """Case 7's baseline on a hybrid target; ``label`` names the target in the case lines (each target's
        speculative servers are compared with its own baseline and held to its own DFLASH)."""
        def body(server: Server) -> None:
            run = greedy_run(server, self.prompts, self.max_new_tokens)
            self.hybrid_baseline = run
            self.hybrid_baseline_name = spec.name
            self.record(f"7. {label} baseline greedy", spec.name, all(run.outputs), prompts=len(run.outputs),
                        tokens=run.completion_tokens, seconds=round(run.seconds, 2))
            self.margin_pass(server, run, hybrid_margin_case(label))
            self.hybrid_baseline_requests = self.logprob_answers(server, with_margins=True)

        self.with_server(spec, body)

    def run_hybrid_speculative(self, spec: ServerSpec, label: str = "hybrid") -> None:
        case = f"7. {label} greedy == baseline"

        def body(server: Server) -> None:
            self.check_identity(server, spec.algorithm, f"7. {label} start + /server_info")
            if self.hybrid_baseline is None:
                raise ServerError(f"no {label} baseline outputs to compare with")
            run = greedy_run(server, self.prompts, self.max_new_tokens)
            self.compare(case, spec.name, self.names, run.outputs, references=self.hybrid_baseline.outputs,
                         baseline=self.hybrid_baseline_name)
            self.run_figures[(case, spec.name)] = {"accept_length": run.accept_length,
                                                   "seconds": round(run.seconds, 2), "tokens": run.completion_tokens}
            # The hybrid's verify path differs (the GDN layers' tree-aware scan): the requests that stress it too.
            self.request_cases(server, self.hybrid_baseline_requests, case_prefix=f"7. {label} request")

        self.with_server(spec, body)

    def check_capture_log(self, server: Server) -> None:
        """SGLang's own capture lines ("Capture target ... CUDA graph begin. ..., num_tokens_per_req=N") must show the
        target-verify graphs at the tree width; the worker's start line must name the compiled kernels."""
        text = server.log_text()
        captures = re.findall(r"Capture [^\n]*CUDA graph (?:begin|end)[^\n]*", text)
        widths = sorted({int(w) for w in re.findall(r"Capture target[^\n]*num_tokens_per_req=(\d+)", text)})
        self.record("4. CUDA graphs captured (SGLang log)", server.spec.name, bool(captures),
                    "" if captures else "no capture lines in the log", lines=captures[:6])
        if server.spec.algorithm != "DDTREE":
            return
        expected = (server.spec.budget or 15) + 1
        ok = expected in widths
        self.record("4. verify graphs captured at tree width", server.spec.name, ok,
                    "" if ok else f"no target capture with num_tokens_per_req={expected} in the log",
                    target_widths=widths, expected=expected)
        builder = re.search(r"tree builder ([^\n]+)", text)
        compiled = bool(builder and "compiled CUDA kernels" in builder.group(1))
        self.record("kernels: worker uses the compiled tree kernels", server.spec.name, compiled,
                    "" if compiled else "the worker fell back to the PyTorch tree path",
                    tree_builder=builder.group(1).strip() if builder else None)

    def load_case(self, server: Server) -> None:
        outputs, errors = concurrent_run(server, self.load)
        names = [r.name for r in self.load]
        reference = self.baseline_load or []
        comparable = [(n, o, b) for n, o, b in zip(names, outputs, reference, strict=False)
                      if o is not None and b is not None]
        if comparable:
            self.compare("5. load: 16 concurrent == baseline", server.spec.name, [c[0] for c in comparable],
                         [c[1] for c in comparable], references=[c[2] for c in comparable], baseline="baseline")
        time.sleep(3.0)  # let the scheduler go idle: its strict memory check runs there
        healthy = server.alive() and server.call("/health_generate", timeout=60).status == 200
        leaks = re.findall(r"[^\n]*memory leak detected[^\n]*", server.log_text())
        ok = not errors and healthy and not leaks
        detail = "; ".join(errors + leaks[:3]) or ("" if healthy else "unhealthy after the load")
        self.record("5. load: no errors, pools back to idle", server.spec.name, ok, detail,
                    requests=len(self.load), errors=len(errors), leak_reports=len(leaks), healthy_after=healthy)

    def sampling_case(self, server: Server) -> None:
        if self.baseline_samples is None:
            self.record("6. sampling distribution", server.spec.name, False, "no baseline samples")
            return
        ours = sampled_tokens(server, self.prompt(SAMPLING_PROMPT), len(self.baseline_samples), 3)
        tests = {}
        ok = True
        # Position 0 comes from the prefill; positions 1 and 2 come from tree verify rounds.
        for position in (1, 2):
            a = [row[position] for row in self.baseline_samples if len(row) > position]
            b = [row[position] for row in ours if len(row) > position]
            test = chi_square_two_sample(a, b)
            tests[f"position_{position}"] = {"chi2": round(test.statistic, 2), "dof": test.degrees_of_freedom,
                                             "p_value": test.p_value, "samples": test.samples,
                                             "categories": test.categories}
            ok &= test.p_value >= SAMPLING_ALPHA
        self.record("6. sampling (T=0.7, top-p 0.95) matches the baseline's distribution", server.spec.name, ok,
                    f"two-sample chi-square per position, reject at p < {SAMPLING_ALPHA} (false-failure bound "
                    f"{2 * SAMPLING_ALPHA:g} for the case)", samples=len(ours), **tests)

    # ---- requests that stress the verify path -------------------------------------------------------------

    def logprob_answers(self, server: Server, with_margins: bool = False) -> list[dict[str, Any]]:
        """The :data:`STRESS_REQUESTS`, greedy (answers, or the HTTP error a request got). ``with_margins`` (the
        baseline) also asks for the top-2 log-probabilities, so that a later divergence from each answer can be
        told a near-tie or not along that very answer (a grammar changes the path)."""
        prompt = self.prompt(REQUEST_PROMPT)
        answers = []
        for request in STRESS_REQUESTS:
            extra = dict(request.extra)
            if with_margins:
                extra.update(return_logprob=True, top_logprobs_num=max(2, int(extra.get("top_logprobs_num", 0))))
            try:
                answer = generate(server, [prompt.input_ids], request.sampling, extra)[0]
                meta = answer.get("meta_info", {})
                entry: dict[str, Any] = {"ok": True, "output_ids": output_ids(answer),
                                         "logprobs": [row[0] for row in meta.get("output_token_logprobs", [])]}
                if with_margins:
                    entry["margins"] = top2_margins(meta)
                answers.append(entry)
            except ServerError as error:
                answers.append({"ok": False, "error": str(error)[:300]})
        return answers

    def request_cases(self, server: Server, reference: list[dict[str, Any]] | None = None,
                      case_prefix: str = "8. request") -> None:
        """The :data:`STRESS_REQUESTS` on ``server``, each against ``reference``'s answer (default: the baseline's)."""
        ours = self.logprob_answers(server)
        reference = (self.baseline_logprobs if reference is None else reference) or []
        for request, mine, theirs in zip(STRESS_REQUESTS, ours, reference, strict=False):
            case = f"{case_prefix}: {request.label}"
            if not mine["ok"]:
                alive = server.alive() and server.call("/health_generate", timeout=60).status == 200
                self.record(case, server.spec.name, alive,
                            f"per-request error, server {'kept serving' if alive else 'died'}: {mine['error']}")
                continue
            ok, detail, figures = self.request_verdict(mine, theirs)
            if not request.honoured(mine["output_ids"]):
                ok, detail = False, "; ".join(filter(None, [detail, f"the answer breaks its rule: {request.rule}"]))
            self.record(case, server.spec.name, ok, detail, **figures)

    def request_verdict(self, mine: dict[str, Any], theirs: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        """A request's answer against the baseline's: the same tokens, or the same up to a bf16 near-tie (the
        baseline's top-2 gap there, measured along its own answer, below :data:`TIE_MARGIN`); logprobs on the common
        part within that gap of the baseline's, one per output token."""
        reference = theirs.get("output_ids") or []
        index = first_difference(mine["output_ids"], reference)
        common = len(mine["output_ids"]) if index is None else index
        deltas = [abs(a - b) for a, b in zip(mine["logprobs"][:common], theirs.get("logprobs", [])[:common],
                                             strict=False) if a is not None and b is not None]
        figures: dict[str, Any] = {"tokens": len(mine["output_ids"]), "same_tokens_as_baseline": index is None}
        if deltas:
            figures["max_logprob_delta"] = round(max(deltas), 4)
        problems = []
        if index is not None:
            along = theirs.get("margins") or []
            margin = along[index] if index < len(along) else None
            figures.update(first_divergence=index, baseline_margin_there=margin)
            if margin is None or margin >= TIE_MARGIN:
                problems.append(f"leaves the baseline's answer at token {index}, where the baseline's top-2 gap is "
                                f"{'unknown' if margin is None else round(margin, 3)} (a near-tie is < {TIE_MARGIN})")
        if deltas and max(deltas) >= TIE_MARGIN:
            problems.append(f"logprobs differ from the baseline's by up to {max(deltas):.3f} on the common tokens")
        if len(mine["logprobs"]) not in (0, len(mine["output_ids"])):
            problems.append(f"{len(mine['logprobs'])} logprobs for {len(mine['output_ids'])} tokens")
        return not problems, "; ".join(problems), figures

    # ---- refusals -----------------------------------------------------------------------------------------

    def run_refusal(self, spec: ServerSpec, expected: str, timeout: float = 240.0) -> None:
        self.forget(spec.name)
        server = start_server(spec, self.python, self.out_dir, self.dtype, tp_size=self.tp_size)
        code = server.wait_exit(timeout)
        text = server.log_text()
        found = expected in text
        server.stop()
        ok = code not in (None, 0) and found
        line = next((ln for ln in text.splitlines() if expected in ln), "")
        self.record("8. refused at start", spec.name, ok,
                    line.strip()[:300] if found else f"exit {code}; expected message {expected!r} not in the log",
                    exit_code=code)

    # ---- verdicts -----------------------------------------------------------------------------------------

    def verdicts(self) -> list[CaseResult]:
        """Case lines settled across servers: greedy equality against DFLASH's bar, accept length vs DFLASH."""
        return self.equality_verdicts() + self.acceptance_verdicts() + self.deterministic_verdicts()

    def all_results(self) -> list[CaseResult]:
        return self.results + self.verdicts()

    def equality_verdicts(self) -> list[CaseResult]:
        """Exact equality passes. Otherwise a DDTREE run passes only when SGLang's own DFLASH also diverged from
        the baseline in the same case (so exact equality is out of reach in this dtype), every one of its
        divergences sits at a near-tie of the baseline (top-2 gap below :data:`TIE_MARGIN`: a wrong tree or mask
        leaves the baseline where it is sure), and its divergence rate is not above DFLASH's beyond chance
        (one-sided Fisher exact test, :data:`RATE_ALPHA`)."""
        verdicts = []
        for (case, name), result in self.agreements.items():
            dflash = next((a for (c, n), a in self.agreements.items() if c == case and n.startswith("dflash")), None)
            margins = self.divergence_margins.get((case, name), {})
            figures = {**self.run_figures.get((case, name), {}), **result.as_dict(),
                       "baseline_margin_at_divergence": {k: None if v is None else round(v, 4)
                                                         for k, v in margins.items()}}
            if result.equal == result.prompts:
                ok, detail = True, "token for token equal on every prompt"
            elif name.startswith("dflash"):
                ok, detail = True, "SGLang's own DFLASH: its divergence rate is the bar for DDTREE in this case"
            else:
                ok, detail = self.divergence_verdict(result, dflash, margins, figures)
            verdicts.append(CaseResult(case, name, ok, figures, detail))
        return verdicts

    @staticmethod
    def divergence_verdict(result: Agreement, dflash: Agreement | None, margins: dict[str, float | None],
                           figures: dict[str, Any]) -> tuple[bool, str]:
        if dflash is None or dflash.divergent == 0:
            standard = "no DFLASH run to compare" if dflash is None else "DFLASH is exact here"
            return False, f"diverges on {result.divergent}/{result.prompts} ({standard})"
        p_value = fisher_one_sided(result.divergent, result.prompts, dflash.divergent, dflash.prompts)
        figures["fisher_p_vs_dflash"] = round(p_value, 4)
        unexplained = sorted(n for n in result.first_divergence
                             if margins.get(n) is None or margins[n] >= TIE_MARGIN)
        problems = []
        if unexplained:
            problems.append(f"diverges where the baseline is not at a near-tie (gap >= {TIE_MARGIN} or unknown): "
                            f"{', '.join(unexplained)}")
        if p_value < RATE_ALPHA:
            problems.append(f"diverges more often than DFLASH beyond chance (p {p_value:.3g} < {RATE_ALPHA})")
        summary = (f"diverges on {result.divergent}/{result.prompts}, DFLASH on {dflash.divergent}/{dflash.prompts} "
                   f"(one-sided Fisher p {p_value:.3g}); ")
        if problems:
            return False, summary + "; ".join(problems)
        return True, summary + f"every divergence at a baseline near-tie (top-2 gap < {TIE_MARGIN})"

    def acceptance_verdicts(self) -> list[CaseResult]:
        dflash = self.accept_lengths.get("dflash")
        verdicts = []
        for name, tau in self.accept_lengths.items():
            if not name.startswith("ddtree"):
                continue
            ok = tau is not None and dflash is not None and tau > dflash
            verdicts.append(CaseResult("3. accept length above DFLASH's", name, ok, {
                "accept_length": tau, "dflash_accept_length": dflash,
                "ratio": (tau / dflash) if tau and dflash else None}))
        return verdicts
