"""The lab server over HTTP on 127.0.0.1 (ephemeral port), plus its command line and decoding plan."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ddtree_runtime.bench.tau import save_random_pair
from ddtree_runtime.reference import load_target
from ddtree_runtime.tokenizer import ByteTokenizer, chat_prompt
from pivot_labserver.cli import TreeKnobs, parse_args, tree_knobs_from_env
from pivot_labserver.engine import plan_decoding
from pivot_labserver.models import resolve_drafter_dir, resolve_target_dir
from pivot_labserver.server import load_delay, proc_starttime, split_reasoning

PRODUCTION = (
    "--model-path /root/models/Qwen3.6-27B --port 30000 --host 0.0.0.0 --tp-size 2 --mem-fraction-static 0.88 "
    "--context-length 131072 --max-running-requests 16 --mamba-full-memory-ratio 0.5 "
    "--mamba-radix-cache-strategy extra_buffer --reasoning-parser qwen3 --tool-call-parser qwen3_coder "
    "--speculative-algorithm {algo} --speculative-draft-model-path /root/models/Qwen3.6-27B-DFlash "
    "--speculative-num-draft-tokens 16 --speculative-num-steps 1 --speculative-eagle-topk 1 --trust-remote-code "
    "--enable-metrics --api-key KEY --served-model-name NAME --attention-backend fa3 --page-size 1 "
    "--cuda-graph-max-bs-decode 16 --disable-cuda-graph --log-level info"
)
API_KEY = "lab-secret"


@pytest.mark.parametrize("algo", ["DDTREE", "DFLASH", "NEXTN", "EAGLE"])
def test_every_production_flag_parses(algo):
    args = parse_args(shlex.split(PRODUCTION.format(algo=algo)))
    assert args.tp_size == 2 and args.mem_fraction_static == 0.88
    assert args.speculative_algorithm == algo
    assert args.disable_cuda_graph and args.enable_metrics and args.trust_remote_code


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-path", "m", "--no-such-flag"],
        ["--model-path", "m", "--mamba-scheduler-strategy", "extra_buffer"],  # removed in SGLang 0.5.20
        ["--model-path", "m", "--speculative-algorithm", "MEDUSA"],
        ["--model-path", "m", "--speculative-algorithm", "DDTREE"],  # needs a drafter
        ["--model-path", "m", "--tp-size", "0"],
        [],
    ],
)
def test_bad_command_lines_exit_2_like_argparse(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_tree_knobs_come_from_the_environment():
    assert tree_knobs_from_env({}) == TreeKnobs(None, None)
    assert tree_knobs_from_env({"DDTREE_BUDGET": "64", "DDTREE_TOPK": "4"}) == TreeKnobs(64, 4)
    for bad in ({"DDTREE_BUDGET": "-1"}, {"DDTREE_TOPK": "0"}, {"DDTREE_BUDGET": "many"}):
        with pytest.raises(ValueError):
            tree_knobs_from_env(bad)


def test_decoding_plans_follow_sglang_semantics():
    def plan(algo, extra="", knobs=None, block=16):
        knobs = knobs or TreeKnobs(None, None)
        argv = shlex.split(f"--model-path m --speculative-draft-model-path d --speculative-algorithm {algo} {extra}")
        return plan_decoding(parse_args(argv), knobs, block)

    ddtree = plan("DDTREE", "--speculative-num-draft-tokens 8", TreeKnobs(32, 3))
    assert (ddtree.method, ddtree.draft_tokens, ddtree.budget, ddtree.topk) == ("ddtree", 8, 32, 3)
    assert plan("DDTREE").budget == 15 and plan("DDTREE").draft_tokens == 16
    assert plan("DFLASH").method == "dflash"
    nextn = plan("NEXTN", "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
    assert (nextn.reported_algorithm, nextn.reported_num_draft_tokens, nextn.method) == ("EAGLE", 4, "dflash")
    assert plan("EAGLE", "--speculative-num-steps 3", block=None).method == "ar"
    with pytest.raises(ValueError, match="block_size"):
        plan("DDTREE", "--speculative-num-draft-tokens 17")
    plain = plan_decoding(parse_args(["--model-path", "m"]), TreeKnobs(None, None), None)
    assert (plain.method, plain.reported_algorithm) == ("ar", None)


def test_byte_tokenizer_and_chat_template():
    tok = ByteTokenizer()
    prompt = chat_prompt([{"role": "user", "content": [{"type": "text", "text": "héllo"}]}])
    ids = tok.encode(prompt)
    assert ids[0] == 257 and 258 in ids
    assert tok.decode(tok.encode("héllo <think>x</think>")) == "héllo <think>x</think>"
    assert tok.decode([257, 104, 105, 258]) == "hi"
    assert split_reasoning("<think>plan</think> answer") == ("plan", "answer")
    assert split_reasoning("no tags") == (None, "no tags")


def test_lab_models_are_deterministic_and_need_the_root(tmp_path, monkeypatch):
    monkeypatch.delenv("PIVOT_LAB_MODEL_ROOT", raising=False)
    with pytest.raises(FileNotFoundError, match="PIVOT_LAB_MODEL_ROOT"):
        resolve_target_dir("/root/models/absent")
    monkeypatch.setenv("PIVOT_LAB_MODEL_ROOT", str(tmp_path / "a"))
    first = resolve_target_dir("/root/models/X")
    monkeypatch.setenv("PIVOT_LAB_MODEL_ROOT", str(tmp_path / "b"))
    second = resolve_target_dir("/root/models/X")
    assert first.name == second.name == "root_models_X"
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    assert json.loads((first / "pivot_lab_model.json").read_text())["random_weights"] is True


def test_lab_models_are_the_byte_pair_bench_tau_runs(tmp_path, monkeypatch):
    """Both make ddtree_runtime's random byte pair, seeded from the same names: the same files."""
    monkeypatch.setenv("PIVOT_LAB_MODEL_ROOT", str(tmp_path / "lab"))
    bench_target, bench_drafter = save_random_pair(tmp_path / "bench")
    lab_target = resolve_target_dir("/bench/target")
    lab_drafter = resolve_drafter_dir("/bench/drafter", load_target(lab_target).config)
    for lab, bench in ((lab_target, bench_target), (lab_drafter, bench_drafter)):
        for name in ("config.json", "model.safetensors"):
            assert (lab / name).read_bytes() == (bench / name).read_bytes(), name


# -- a real server process -------------------------------------------------------------------------------


@dataclass
class Running:
    process: subprocess.Popen
    port: int
    state_dir: Path
    log: list[str]
    health_codes: list[int] | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def request(
    url: str, body: dict | None = None, key: str | None = API_KEY, timeout: float = 60
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def start_server(tmp_path: Path, extra: list[str], load_delay: float = 0.0,
                 environment: dict[str, str] | None = None) -> Running:
    env = {
        **os.environ,
        "PIVOT_LAB_MODEL_ROOT": str(tmp_path / "models"),
        "FAKE_NVIDIA_STATE_DIR": str(tmp_path / "fake-nvidia"),
        "FAKE_NVIDIA_GPU_TOTAL_MIB": "1000",
        "DDTREE_LAB_LOAD_DELAY_S": str(load_delay),
        "DDTREE_BUDGET": "8",
        **(environment or {}),
    }
    argv = [sys.executable, "-m", "pivot_labserver", "--host", "127.0.0.1", "--port", "0", *extra]
    process = subprocess.Popen(argv, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    assert process.stderr is not None
    for line in process.stderr:
        log.append(line)
        match = re.search(r"HTTP server listening on 127\.0\.0\.1:(\d+)", line)
        if match:
            # Keep draining stderr so the server never blocks on a full pipe.
            threading.Thread(target=lambda: log.extend(process.stderr), daemon=True).start()
            return Running(process, int(match.group(1)), tmp_path / "fake-nvidia", log)
    raise AssertionError("server exited before listening:\n" + "".join(log))


def wait_healthy(running: Running, timeout: float = 60) -> list[int]:
    codes = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, _unused = request(running.url("/health"), key=None)
        codes.append(code)
        if code == 200:
            return codes
        time.sleep(0.1)
    raise AssertionError(f"never healthy: {codes[-5:]}")


def stop(running: Running) -> int:
    running.process.send_signal(signal.SIGTERM)
    return running.process.wait(timeout=30)


@pytest.fixture(scope="module")
def ddtree_server(tmp_path_factory) -> Iterator[Running]:
    tmp_path = tmp_path_factory.mktemp("lab")
    argv = shlex.split(PRODUCTION.format(algo="DDTREE").replace("--port 30000 --host 0.0.0.0 ", ""))
    argv[argv.index("KEY")] = API_KEY
    running = start_server(tmp_path, argv, load_delay=1.5)
    try:
        running.health_codes = wait_healthy(running)
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait()


def test_health_is_503_while_loading_then_200(ddtree_server):
    codes = ddtree_server.health_codes
    assert codes is not None
    assert codes[0] == 503 and codes[-1] == 200


def test_gpu_registry_file_matches_the_lab_double_format(ddtree_server):
    wait_healthy(ddtree_server)
    pid = ddtree_server.process.pid
    record = json.loads((ddtree_server.state_dir / "procs" / f"{pid}.json").read_text())
    assert record == {"pid": pid, "starttime": proc_starttime(pid), "name": "python3", "gpus": {"0": 880, "1": 880}}


def test_server_info_reports_sglang_fields(ddtree_server):
    wait_healthy(ddtree_server)
    for path in ("/server_info", "/get_server_info"):
        code, body = request(ddtree_server.url(path))
        assert code == 200
        info = json.loads(body)
        assert info["version"] == "0.5.23"
        assert info["speculative_algorithm"] == "DDTREE"
        assert info["speculative_num_draft_tokens"] == 16
        assert info["speculative_draft_model_path"] == "/root/models/Qwen3.6-27B-DFlash"
        assert info["model_path"] == "/root/models/Qwen3.6-27B"
        assert info["tp_size"] == 2
        assert info["ddtree_budget"] == 8
        assert isinstance(info["internal_states"][0]["avg_spec_accept_length"], float)
        assert "api_key" not in info


def test_api_key_is_enforced_except_on_health_and_metrics(ddtree_server):
    wait_healthy(ddtree_server)
    assert request(ddtree_server.url("/server_info"), key=None)[0] == 401
    assert request(ddtree_server.url("/server_info"), key="wrong")[0] == 401
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert request(ddtree_server.url("/v1/chat/completions"), chat, key=None)[0] == 401
    assert request(ddtree_server.url("/health"), key=None)[0] == 200
    assert request(ddtree_server.url("/health_generate"), key=None)[0] == 200
    assert request(ddtree_server.url("/metrics"), key=None)[0] == 200


def test_greedy_chat_completions_are_deterministic(ddtree_server):
    wait_healthy(ddtree_server)
    body = {"model": "NAME", "messages": [{"role": "user", "content": "Say hi"}], "temperature": 0, "max_tokens": 24}
    replies = []
    for _unused in range(2):
        code, raw = request(ddtree_server.url("/v1/chat/completions"), body)
        assert code == 200
        replies.append(json.loads(raw))
    first, second = replies
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    assert first["object"] == "chat.completion" and first["model"] == "NAME"
    usage = first["usage"]
    assert usage["completion_tokens"] <= 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert first["meta_info"]["spec_verify_ct"] >= 1
    assert first["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_thinking_template_answers_in_reasoning_until_thinking_is_turned_off(ddtree_server):
    """Served with --reasoning-parser qwen3, the lab model's template opens a think block (as Qwen3.6's does): a reply
    cut off by max_tokens is all reasoning with empty content, as SGLang returns it; enable_thinking false answers."""
    wait_healthy(ddtree_server)
    body = {"messages": [{"role": "user", "content": "Write fizzbuzz."}], "temperature": 0, "max_tokens": 24}
    code, raw = request(ddtree_server.url("/v1/chat/completions"), body)
    assert code == 200
    thinking = json.loads(raw)["choices"][0]["message"]
    assert thinking["content"] == "" and thinking["reasoning_content"]
    body["chat_template_kwargs"] = {"enable_thinking": False}
    code, raw = request(ddtree_server.url("/v1/chat/completions"), body)
    answer = json.loads(raw)["choices"][0]["message"]
    assert code == 200 and answer["content"] and answer["reasoning_content"] is None
    assert split_reasoning("plan only, cut off", think_open=True) == ("plan only, cut off", "")


def test_a_model_that_thinks_although_asked_not_to_spends_its_tokens_on_it(tmp_path):
    """DDTREE_LAB_FORCED_THINKING: the lab's stand-in for a reasoning model that ignores enable_thinking false. Its
    think block comes first, in reasoning_content, and takes its tokens from max_tokens."""
    argv = shlex.split(PRODUCTION.format(algo="NEXTN").replace("--port 30000 --host 0.0.0.0 ", ""))
    argv[argv.index("KEY")] = API_KEY
    running = start_server(tmp_path, argv, environment={"DDTREE_LAB_FORCED_THINKING": "plan the answer"})
    try:
        wait_healthy(running)
        body = {"messages": [{"role": "user", "content": "Write fizzbuzz."}], "temperature": 0, "max_tokens": 64,
                "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}
        code, raw = request(running.url("/v1/chat/completions"), body)
        assert code == 200
        reply = json.loads(raw)
        message = reply["choices"][0]["message"]
        assert message["reasoning_content"] == "plan the answer" and message["content"]
        assert 0 < reply["usage"]["completion_tokens"] < 64, "the think block's tokens came out of max_tokens"
    finally:
        running.process.kill()
        running.process.wait()


def test_native_generate_and_metrics(ddtree_server):
    wait_healthy(ddtree_server)
    params = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    body = {"input_ids": [257, 104, 105], "sampling_params": params}
    code, raw = request(ddtree_server.url("/generate"), body)
    assert code == 200
    reply = json.loads(raw)
    assert len(reply["output_ids"]) == 10
    meta = reply["meta_info"]
    assert meta["completion_tokens"] == 10 and meta["finish_reason"] == {"type": "length", "length": 10}
    assert meta["spec_verify_ct"] == len(meta["spec_acceptance_lengths"]) >= 1
    batch = {"text": ["ab", "cd"], "sampling_params": {"max_new_tokens": 2}}
    code, raw = request(ddtree_server.url("/generate"), batch)
    assert code == 200 and len(json.loads(raw)) == 2
    code, raw = request(ddtree_server.url("/metrics"), key=None)
    text = raw.decode()
    assert re.search(r'^sglang:spec_accept_length\{model_name="NAME"\} [0-9.]+$', text, re.MULTILINE)
    assert re.search(r"^sglang:generation_tokens_total\{.*\} [1-9]", text, re.MULTILINE)


def test_bad_requests_get_4xx(ddtree_server):
    wait_healthy(ddtree_server)
    assert request(ddtree_server.url("/v1/chat/completions"), {"messages": []})[0] == 400
    assert request(ddtree_server.url("/generate"), {"input_ids": [10**6]})[0] == 400
    assert request(ddtree_server.url("/generate"), {"sampling_params": {}})[0] == 400
    bad_temp = {"text": "x", "sampling_params": {"temperature": -1}}
    assert request(ddtree_server.url("/generate"), bad_temp)[0] == 400
    assert request(ddtree_server.url("/nope"))[0] == 404


def test_text_completions_and_streamed_chat(ddtree_server):
    wait_healthy(ddtree_server)
    code, raw = request(ddtree_server.url("/v1/completions"), {"prompt": "abc", "max_tokens": 5, "temperature": 0})
    reply = json.loads(raw)
    assert code == 200 and reply["object"] == "text_completion" and reply["usage"]["completion_tokens"] <= 5
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "temperature": 0, "stream": True}
    code, raw = request(ddtree_server.url("/v1/chat/completions"), chat)
    events = [line[len("data: ") :] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert code == 200 and events[-1] == "[DONE]"
    chunk = json.loads(events[0])
    assert chunk["object"] == "chat.completion.chunk" and chunk["choices"][0]["delta"]["role"] == "assistant"


def test_sigterm_exits_cleanly_and_removes_the_registry_file(ddtree_server):
    wait_healthy(ddtree_server)
    registry = ddtree_server.state_dir / "procs" / f"{ddtree_server.process.pid}.json"
    assert registry.exists()
    begin = time.monotonic()
    assert stop(ddtree_server) == 0
    assert time.monotonic() - begin < 10
    assert not registry.exists()


def test_nextn_is_reported_as_eagle_and_served_autoregressively(tmp_path):
    argv = ["--model-path", "/root/models/T", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"]
    running = start_server(tmp_path, [*argv, "--speculative-eagle-topk", "1"])
    try:
        wait_healthy(running)
        info = json.loads(request(running.url("/server_info"), key=None)[1])
        reported = (info["speculative_algorithm"], info["speculative_num_draft_tokens"], info["decoder"])
        assert reported == ("EAGLE", 4, "ar")
        assert request(running.url("/metrics"), key=None)[0] == 404  # no --enable-metrics
    finally:
        assert stop(running) == 0


def test_unknown_flag_exits_2_and_missing_model_exits_1(tmp_path):
    bad = subprocess.run(
        [sys.executable, "-m", "pivot_labserver", "--model-path", "m", "--bogus"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False,
    )
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr
    env = {k: v for k, v in os.environ.items() if k != "PIVOT_LAB_MODEL_ROOT"}
    missing = subprocess.run(
        [sys.executable, "-m", "pivot_labserver", "--model-path", str(tmp_path / "none"), "--port", "0"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env=env, check=False,
    )
    assert missing.returncode == 1 and "PIVOT_LAB_MODEL_ROOT" in missing.stderr


def test_server_path_works_without_transformers(tmp_path):
    """The serving host may lack transformers: load a lab model and generate with it blocked from import."""
    script = (
        "import sys; sys.modules['transformers'] = None\n"
        "import os; os.environ['PIVOT_LAB_MODEL_ROOT'] = sys.argv[1]\n"
        "from pivot_labserver.cli import parse_args, tree_knobs_from_env\n"
        "from pivot_labserver.engine import LabEngine\n"
        "from ddtree_runtime.sampling import SamplingParams\n"
        "args = parse_args(['--model-path', '/m/t', '--speculative-algorithm', 'DDTREE',"
        " '--speculative-draft-model-path', '/m/d'])\n"
        "engine = LabEngine(args, tree_knobs_from_env()); engine.load()\n"
        "print(len(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=5)).tokens))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "5"


def test_a_host_can_make_one_kind_of_server_slow_to_start(tmp_path, monkeypatch):
    """load-delay-s.<ALGORITHM> on the host: the NEXTN baseline as slow to start as a large model, the release not."""
    monkeypatch.delenv("DDTREE_LAB_LOAD_DELAY_S", raising=False)
    (tmp_path / "load-delay-s.NEXTN").write_text("30\n")
    assert load_delay("NEXTN", tmp_path) == 30.0 and load_delay("DDTREE", tmp_path) == 0.0
    monkeypatch.setenv("DDTREE_LAB_LOAD_DELAY_S", "2")
    assert load_delay(None, tmp_path) == 2.0 and load_delay("nextn", tmp_path) == 30.0
