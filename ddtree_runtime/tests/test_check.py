"""``python -m ddtree_runtime.check``: what a host without a GPU, or without the compiled kernels, reports, with and
without the flags the release venv's role passes on a GPU host (--require-gpu, --require-cuda-extension)."""

from __future__ import annotations

import json

import pytest
import torch

from ddtree_runtime import check, ops

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a host without a usable GPU reports")
with_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def by_name(results: list[check.Check]) -> dict[str, check.Check]:
    return {result.name: result for result in results}


@no_gpu
def test_without_a_gpu_the_checks_pass_on_the_cpu_unless_a_gpu_is_required() -> None:
    relaxed = by_name(check.run_checks(False, server_start=False))
    assert relaxed["gpu"].ok and "CPU only" in relaxed["gpu"].detail

    strict = by_name(check.run_checks(False, server_start=False, require_gpu=True))
    assert not strict["gpu"].ok
    assert "required" in strict["gpu"].detail
    # torch's own reason, not just "False": this machine's torch is a CPU build or has no driver
    assert check.why_no_gpu() in strict["gpu"].detail


@no_gpu
def test_a_required_extension_without_a_gpu_to_run_it_fails() -> None:
    assert check.check_cuda_extension(required=False).ok
    required = check.check_cuda_extension(required=True)
    assert not required.ok
    expected = "no GPU to run them on" if ops.extension_available() else "not built"
    assert expected in required.detail


def test_the_exit_code_and_json_follow_the_required_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code = check.main(["--json", "--no-server-start", "--require-gpu"])
    report = json.loads(capsys.readouterr().out)
    gpu = next(item for item in report["checks"] if item["name"] == "gpu")
    assert report["ok"] is (code == 0)
    assert gpu["ok"] is torch.cuda.is_available()
    assert code == (0 if torch.cuda.is_available() and all(item["ok"] for item in report["checks"]) else 1)


def test_a_check_that_raises_is_reported_under_its_own_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(required: bool = False) -> check.Check:
        raise RuntimeError("driver went away")

    monkeypatch.setattr(check, "check_cuda_extension", broken)
    results = by_name(check.run_checks(False, server_start=False, require_cuda_extension=True))
    assert not results["cuda_extension"].ok
    assert results["cuda_extension"].detail == "RuntimeError: driver went away"


@no_gpu
def test_the_server_start_is_reported_as_skipped_when_sglang_is_here_but_no_gpu(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real_find_spec = check.importlib.util.find_spec
    monkeypatch.setattr(check.importlib.util, "find_spec",
                        lambda name: object() if name == "sglang" else real_find_spec(name))
    result = check.check_sglang_server()
    assert result is not None and result.ok and result.skipped
    assert result.detail == "no GPU visible to torch"
    monkeypatch.setattr(check, "run_checks", lambda *args, **kwargs: [result, check.check_torch()])
    assert check.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "skipped sglang_server: no GPU visible to torch", "a check that did not run is never 'ok'"
    assert lines[1].startswith("ok torch: torch ")


@no_gpu
def test_kernels_without_a_gpu_are_skipped_unless_required() -> None:
    assert check.check_cuda_extension().skipped
    required = check.check_cuda_extension(required=True)
    assert not required.ok and not required.skipped


@with_gpu
def test_on_a_gpu_the_required_checks_pass_when_the_kernels_are_built() -> None:
    results = by_name(check.run_checks(False, server_start=False, require_gpu=True,
                                       require_cuda_extension=ops.extension_available()))
    assert results["gpu"].ok and "sm_" in results["gpu"].detail
    assert results["cuda_extension"].ok, results["cuda_extension"].detail
    assert results["ddtree_decode"].ok and "cuda" in results["ddtree_decode"].detail
