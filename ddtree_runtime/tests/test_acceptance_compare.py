"""Two acceptance runs compared (TP=1 against TP=2): the baselines token for token, each divergence judged by the
first run's top-2 gap where it happens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ddtree_runtime.acceptance.compare import main as compare_main
from ddtree_runtime.acceptance.prompts import suite_prompts
from ddtree_runtime.acceptance.suite import STATE_FILE, TIE_MARGIN

NAMES = [prompt.name for prompt in suite_prompts()]
LENGTH = 8


def outputs(offset: int = 0) -> list[list[int]]:
    return [[offset + index * 100 + position for position in range(LENGTH)] for index in range(len(NAMES))]


def measured(tokens_per_s: float) -> dict[str, Any]:
    """The suite's throughput entry of one DDTREE server measured at batch 16 only."""
    return {"ddtree-b16": {"algorithm": "DDTREE", "budget": 16,
                           "batch_16": {"requests": 16, "tokens": 2048, "seconds": 1.0, "tokens_per_s": tokens_per_s}}}


def write_run(directory: Path, *, tp_size: int, dense: list[list[int]], hybrid: list[list[int]] | None = None,
              gap: float = 3.0, dtype: str = "bfloat16", **extra: Any) -> Path:
    """An out directory as the suite leaves it: the baselines' outputs, their margins along the same paths."""
    directory.mkdir(parents=True)
    runs = {"baseline": dense, **({"hybrid-trained-baseline": hybrid} if hybrid is not None else {})}

    def greedy_run(outputs: list[list[int]]) -> dict[str, Any]:
        return {"outputs": outputs, "completion_tokens": 1, "verify_rounds": 1, "seconds": 1.0}

    state = {
        "dtype": dtype, "max_new_tokens": LENGTH, "tp_size": tp_size,
        "baseline": greedy_run(dense),
        "hybrid_baseline": None if hybrid is None else greedy_run(hybrid),
        "hybrid_baseline_name": "hybrid-trained-baseline",
        "margins": {name: {prompt: [gap] * LENGTH for prompt in NAMES} for name in runs},
        "margin_paths": {name: dict(zip(NAMES, run, strict=True)) for name, run in runs.items()},
        **extra,
    }
    (directory / STATE_FILE).write_text(json.dumps(state))
    return directory


def test_equal_baselines_pass_and_the_figures_stand_side_by_side(tmp_path, capsys) -> None:
    first = write_run(tmp_path / "tp1", tp_size=1, dense=outputs(), hybrid=outputs(7),
                      accept_lengths={"ddtree-b16": 3.5}, throughput=measured(900.0))
    second = write_run(tmp_path / "tp2", tp_size=2, dense=outputs(), hybrid=outputs(7),
                       accept_lengths={"ddtree-b16": 3.25}, throughput=measured(1500.0))
    assert compare_main([str(first), str(second), "--out", str(tmp_path / "c.md")]) == 0
    text = (tmp_path / "c.md").read_text()
    assert text == capsys.readouterr().out
    assert "(--tp-size 1) against" in text and "(--tp-size 2)" in text
    assert f"| baseline | {len(NAMES)} | {len(NAMES)} | 0 | - |" in text
    assert f"| hybrid-trained-baseline | {len(NAMES)} | {len(NAMES)} | 0 | - |" in text
    assert "| ddtree-b16 | accept length | 3.50 | 3.25 |" in text
    assert "| ddtree-b16 | tokens/s at batch 16 | 900.0 | 1500.0 |" in text


def test_a_divergence_at_a_near_tie_is_explained_by_reduction_order(tmp_path, capsys) -> None:
    forked = outputs()
    forked[2] = [*forked[2][:5], 99999, *forked[2][6:]]
    first = write_run(tmp_path / "tp1", tp_size=1, dense=outputs(), gap=TIE_MARGIN / 5)
    second = write_run(tmp_path / "tp2", tp_size=2, dense=forked)
    assert compare_main([str(first), str(second)]) == 0
    assert f"| baseline | {len(NAMES)} | {len(NAMES) - 1} | 1 | - |" in capsys.readouterr().out


def test_a_divergence_where_the_first_run_was_sure_fails_and_names_the_prompt(tmp_path, capsys) -> None:
    forked = outputs()
    forked[3] = [*forked[3][:2], 99999, *forked[3][3:]]
    first = write_run(tmp_path / "tp1", tp_size=1, dense=outputs(), gap=2 * TIE_MARGIN)
    second = write_run(tmp_path / "tp2", tp_size=2, dense=forked)
    assert compare_main([str(first), str(second)]) == 1
    out = capsys.readouterr().out
    assert f"| baseline | {len(NAMES)} | {len(NAMES) - 1} | 0 | {NAMES[3]} |" in out
    assert f"compare: divergences not at a near-tie (or not measured there): baseline: {NAMES[3]}" in out


def test_runs_of_other_settings_or_without_a_state_are_refused(tmp_path, capsys) -> None:
    first = write_run(tmp_path / "tp1", tp_size=1, dense=outputs())
    other = write_run(tmp_path / "fp16", tp_size=2, dense=outputs(), dtype="float16")
    with pytest.raises(SystemExit) as exited:
        compare_main([str(first), str(other)])
    assert exited.value.code == 2
    assert "the runs used other settings (dtype, new tokens)" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="give the --out directory of a finished acceptance run"):
        compare_main([str(first), str(tmp_path / "never-ran")])
