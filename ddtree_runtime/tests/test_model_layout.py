"""Which target layers SGLang can capture for a drafter, read from the configs on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ddtree_runtime.model_layout import (
    capture_problem,
    drafter_target_layer_ids,
    drafter_window_problem,
    pair_problem,
    text_settings,
)
from ddtree_runtime.train.pair import SHAPES


@pytest.mark.parametrize(("layer_ids", "layers", "unreadable"), [
    ([1, 2, 4], 6, None),
    ([0], 2, None),
    ([1, 3, 5], 6, [5]),
    ([-1, 2], 6, [-1]),
    ([0, 1], 2, [1]),
    ([7], 6, [7]),
])
def test_only_layers_before_the_last_can_be_captured(layer_ids: list[int], layers: int,
                                                     unreadable: list[int] | None) -> None:
    problem = capture_problem(layer_ids, layers)
    if unreadable is None:
        assert problem is None
    else:
        assert problem is not None and f"not {unreadable}" in problem and f"0..{layers - 2}" in problem


def test_every_training_shape_gives_a_pair_sglang_can_serve() -> None:
    for name, shape in SHAPES.items():
        assert capture_problem(shape.target_layer_ids, shape.target_layers) is None, name


def _config(directory: Path, config: dict[str, object]) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_pair_problem_reads_text_config_and_z_lab_layer_ids(tmp_path: Path) -> None:
    target = _config(tmp_path / "target", {"text_config": {"num_hidden_layers": 64}, "vision_config": {}})
    drafter = _config(tmp_path / "drafter", {"dflash_config": {"target_layer_ids": [1, 16, 31, 46, 63]}})
    problem = pair_problem(target, drafter)
    assert problem is not None and "0..62 of this 64-layer target" in problem and "not [63]" in problem


def test_pair_problem_says_nothing_without_local_configs_or_layer_ids(tmp_path: Path) -> None:
    target = _config(tmp_path / "target", {"num_hidden_layers": 6})
    unnamed = _config(tmp_path / "unnamed", {"num_hidden_layers": 1})
    assert pair_problem("Qwen/Qwen3.6-27B", "z-lab/drafter") is None
    assert pair_problem(target, tmp_path / "missing") is None
    assert pair_problem(target, unnamed) is None  # SGLang then chooses the layers itself


def test_flat_configs_and_top_level_layer_ids_are_read_too() -> None:
    assert text_settings({"num_hidden_layers": 6}) == {"num_hidden_layers": 6}
    assert drafter_target_layer_ids({"target_layer_ids": [0, 2]}) == [0, 2]
    assert drafter_target_layer_ids({}) is None


SLIDING_DRAFTER = {"model_type": "qwen3", "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
                   "sliding_window": 2048, "use_sliding_window": True,
                   "dflash_config": {"target_layer_ids": [1, 16, 31, 46, 61]}}


@pytest.mark.parametrize(("change", "named"), [
    ({}, None),
    ({"layer_types": ["full_attention"] * 5, "use_sliding_window": None, "sliding_window": None}, None),
    ({"use_sliding_window": None}, "use_sliding_window: true"),
    ({"use_sliding_window": False}, "use_sliding_window: true"),
    ({"sliding_window": None}, "sliding_window is None"),
    ({"sliding_window": 0}, "sliding_window is 0"),
    ({"model_type": "llama", "use_sliding_window": None}, None),
])
def test_sliding_window_layers_need_a_window_that_transformers_keeps(change: dict[str, object],
                                                                     named: str | None) -> None:
    config = {key: value for key, value in {**SLIDING_DRAFTER, **change}.items() if value is not None}
    problem = drafter_window_problem(config)
    assert problem is None if named is None else (problem is not None and named in problem)


def test_pair_problem_refuses_a_drafter_whose_window_sglang_would_not_see(tmp_path: Path) -> None:
    target = _config(tmp_path / "target", {"text_config": {"num_hidden_layers": 64}})
    without = {key: value for key, value in SLIDING_DRAFTER.items() if key != "use_sliding_window"}
    problem = pair_problem(target, _config(tmp_path / "drafter", without))
    assert problem is not None and "use_sliding_window" in problem
    assert pair_problem(target, _config(tmp_path / "good", SLIDING_DRAFTER)) is None
