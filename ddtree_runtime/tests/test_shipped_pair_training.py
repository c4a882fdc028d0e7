"""The scripts that make the shipped pair: batched training forwards against the reference engine, the
corpus, the schedule, and a smoke run of the whole recipe on a synthetic corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_decoder
from ddtree_runtime.reference import SpeculativeDecoder, load_dflash, load_qwen3
from ddtree_runtime.sampling import SamplingParams
from ddtree_runtime.tokenizer import ByteTokenizer
from ddtree_runtime.train.__main__ import main as train_main
from ddtree_runtime.train.corpus import (
    SourceFile,
    build_stream,
    docstring_summary,
    function_examples,
    is_held_out,
    list_sources,
    random_windows,
    split_sources,
    spread_sample,
)
from ddtree_runtime.train.forward import (
    RopeTable,
    block_visibility,
    drafter_block_logits,
    greedy_continue,
    target_forward,
)
from ddtree_runtime.train.loop import DraftSettings, Schedule
from ddtree_runtime.train.pair import CHECKSUM_FILE, MASK_TOKEN_ID, PAIR_NAME, verify_checksums
from ddtree_runtime.train.pipeline import PairRecipe, make_pair
from ddtree_runtime.train.prompts import held_out_prompts

SOURCE = '''import os


def add(a, b):
    """Return the sum of a and b."""
    return a + b


class Box:
    def area(self, scale=1):
        """Compute the area of the box."""
        return self.width * self.height * scale


def undocumented(x):
    return x


def blank_doc():
    """   """
'''


# -- batched forwards == the reference engine ------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    decoder = make_decoder(seed=3)
    return decoder.target, decoder.drafter.model


def test_target_forward_matches_the_reference_logits_and_features(pair):
    target, drafter = pair
    ids = torch.randint(0, 31, (2, 24), generator=torch.Generator().manual_seed(0))
    layers = drafter.config.target_layer_ids
    rope = RopeTable(target.rotary.inv_freq, 64, "cpu")
    with torch.no_grad():
        logits, features = target_forward(target, ids, rope, capture_layers=layers)
    for row in range(2):
        reference = target(ids[row], torch.arange(24), target.new_cache(), capture_layers=layers)
        torch.testing.assert_close(logits[row], reference.logits, rtol=0, atol=1e-10)
        torch.testing.assert_close(features[row], reference.features, rtol=0, atol=1e-10)


@pytest.mark.parametrize("sliding", [False, True], ids=["full-attention", "sliding-window"])
def test_drafter_block_forward_matches_the_reference_draft_call(sliding):
    # the sliding drafter's first layer is causal with a window of 8, which binds at these anchors
    decoder = make_decoder(seed=3, sliding=sliding)
    target, drafter = decoder.target, decoder.drafter.model
    ids = torch.randint(0, 31, (2, 40), generator=torch.Generator().manual_seed(1))
    layers = drafter.config.target_layer_ids
    rope = RopeTable(target.rotary.inv_freq, 64, "cpu")
    anchors = torch.tensor([[1, 17, 24], [9, 3, 22]])
    with torch.no_grad():
        _unused, features = target_forward(target, ids, rope, capture_layers=layers)
        logits = drafter_block_logits(drafter, target, features, ids, anchors, rope=rope)
    assert logits.shape == (2, 3, drafter.config.block_size - 1, target.config.vocab_size)
    reference = decoder.drafter
    for row in range(2):
        for column, anchor in enumerate(anchors[row].tolist()):
            expected = reference.draft(
                reference.new_state(), ids[row, :anchor].tolist(), int(ids[row, anchor]), features[row, :anchor]
            )
            torch.testing.assert_close(logits[row, column], expected, rtol=0, atol=1e-10)


def test_a_sliding_layers_visibility_is_causal_and_windowed_as_at_inference():
    allowed = block_visibility(torch.tensor([[4]]), context_length=6, block_size=3, causal=True, window=2)[0, 0]
    # slot k of the block at position 4 + k sees positions 4 + k - 1 and 4 + k, so slot 0 sees context 3 only
    assert allowed[0].tolist() == [False, False, False, True, False, False, True, False, False]
    assert allowed[1].tolist() == [False] * 6 + [True, True, False]
    assert allowed[2].tolist() == [False] * 6 + [False, True, True]


def test_block_visibility_hides_later_context_and_other_blocks():
    allowed = block_visibility(torch.tensor([[2, 5]]), context_length=6, block_size=2)[0, 0]
    assert allowed.shape == (4, 10)
    assert allowed[0, :6].tolist() == [True, True, False, False, False, False]
    assert allowed[2, :6].tolist() == [True] * 5 + [False]
    assert allowed[0, 6:].tolist() == [True, True, False, False]
    assert allowed[3, 6:].tolist() == [False, False, True, True]


def test_cached_greedy_generation_equals_reference_ar(pair):
    target, _unused = pair
    prompts = torch.randint(0, 31, (3, 7), generator=torch.Generator().manual_seed(2))
    out = greedy_continue(target, prompts, 10, RopeTable(target.rotary.inv_freq, 32, "cpu"), torch.float64)
    decoder = SpeculativeDecoder(target)
    for row in range(3):
        expected = decoder.generate(prompts[row].tolist(), SamplingParams(max_new_tokens=10), "ar").tokens
        assert out[row, :7].tolist() == prompts[row].tolist()
        assert out[row, 7:].tolist() == expected


# -- corpus ------------------------------------------------------------------------------------------------


def test_chat_examples_come_from_documented_functions_and_tokenize_like_the_lab():
    examples = function_examples(SOURCE)
    assert [e.instruction for e in examples] == [
        "Write a Python function add(a, b) that returns the sum of a and b.",
        "Implement area(self, scale) in Python: computes the area of the box.",
    ]
    assert examples[1].code.startswith("def area(self, scale=1):\n")
    tokenizer = ByteTokenizer()
    for example in examples:
        assert tokenizer.encode(example.text()) == example.prompt_ids() + example.answer_ids()
    assert function_examples("def broken(:\n") == []


def test_docstring_summary_skips_unusable_docstrings():
    import ast  # noqa: PLC0415

    nodes = {n.name: n for n in ast.walk(ast.parse(SOURCE)) if isinstance(n, ast.FunctionDef)}
    assert docstring_summary(nodes["add"]) == "returns the sum of a and b"
    assert docstring_summary(nodes["undocumented"]) is None
    assert docstring_summary(nodes["blank_doc"]) is None


def test_held_out_split_is_deterministic_disjoint_and_path_based():
    files = [SourceFile(f"pkg/m{i}.py", b"x = 1\n") for i in range(400)]
    train, held_out = split_sources(files)
    assert len(train) + len(held_out) == 400 and held_out
    assert {f.relative for f in train}.isdisjoint({f.relative for f in held_out})
    assert all(is_held_out(f.relative) for f in held_out)
    assert split_sources(files) == (train, held_out)
    assert spread_sample(files, 4) == [files[0], files[100], files[200], files[300]]


def test_stream_marks_where_chat_answers_start(tmp_path):
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "skip.py").write_text(SOURCE)
    (tmp_path / "m.py").write_text(SOURCE)
    (tmp_path / "empty.py").write_text("")
    files = list_sources(tmp_path)
    assert [f.relative for f in files] == ["m.py"]
    stream = build_stream(files, workers=1)
    tokenizer = ByteTokenizer()
    assert stream.chat_starts.numel() == 2
    for start in stream.chat_starts.tolist():
        before = tokenizer.decode(stream.tokens[start - 10 : start].long().tolist(), skip_special_tokens=False)
        assert before == "assistant\n"
        assert tokenizer.decode(stream.tokens[start : start + 4].long().tolist()) == "def "
    assert build_stream(files, with_chat=False).size == len(SOURCE.encode()) + 1
    with pytest.raises(ValueError, match="fewer than one window"):
        random_windows(stream, 1, stream.size + 1, torch.Generator())
    with pytest.raises(ValueError, match="empty"):
        build_stream([])


def test_learning_rate_warms_up_then_decays_with_time():
    schedule = Schedule(seconds=10, max_steps=1000, batch=1, lr=1.0, warmup_steps=10, min_lr_fraction=0.1)
    assert schedule.lr_at(0, 0.0) == pytest.approx(0.1)
    assert schedule.lr_at(9, 0.0) == pytest.approx(1.0)
    assert schedule.lr_at(10, 0.0) == pytest.approx(1.0, rel=1e-3)
    assert schedule.lr_at(10, 0.5) == pytest.approx(0.55)
    assert schedule.lr_at(10, 2.0) == pytest.approx(0.1)
    assert schedule.lr_at(1000, 0.0) == pytest.approx(0.1)


def test_held_out_prompts_end_where_the_body_starts():
    body = "    total = 0\n" + "    total += 1\n" * 12 + "    return total\n"
    code = f'def count():\n    """Count to twelve."""\n{body}'
    records = held_out_prompts([SourceFile("b.py", code.encode()), SourceFile("test/a.py", code.encode())], 5)
    assert records == [{"name": "heldout:b.py:count", "prompt": 'def count():\n    """Count to twelve."""\n    '}]


# -- the recipe end to end (smoke size, synthetic corpus) ----------------------------------------------------


def smoke_recipe() -> PairRecipe:
    quick = Schedule(seconds=60, max_steps=3, batch=2, lr=1e-3, warmup_steps=1, log_every=1)
    draft = DraftSettings(
        prompt_tokens=16,
        new_tokens=16,
        distill_batch=4,
        distill_seconds=60,
        distill_max_batches=1,
        anchors_per_sequence=2,
    )
    return PairRecipe(shape="smoke", seq_len=32, target=quick, drafter=quick, draft=draft, held_out_per_mille=500)


@pytest.fixture(scope="module")
def smoke_pair(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for index in range(6):
        (root / f"mod{index}.py").write_text(SOURCE * 3)
    output = tmp_path_factory.mktemp("pair")
    make_pair(smoke_recipe(), output, "cpu", root)
    return output


def test_recipe_writes_a_loadable_checksummed_pair(smoke_pair):
    target_dir, drafter_dir = smoke_pair / PAIR_NAME, smoke_pair / f"{PAIR_NAME}-dflash"
    target, drafter = load_qwen3(target_dir), load_dflash(drafter_dir)
    assert drafter.config.block_size == 16 and drafter.config.mask_token_id == MASK_TOKEN_ID
    assert target.config.vocab_size == 320 and drafter.config.target_layer_ids == [0, 1]
    for directory in (target_dir, drafter_dir):
        assert verify_checksums(directory) == []
        assert json.loads((directory / "config.json").read_text())["torch_dtype"] == "bfloat16"
        provenance = json.loads((directory / "pivot_model.json").read_text())
        assert provenance["random_weights"] is False and provenance["target_steps"] == 3
        assert (directory / "tokenizer.json").exists() is (directory == target_dir)
    log = json.loads((smoke_pair / "train_log.json").read_text())["log"]
    assert [e["phase"] for e in log] == ["target"] * 3 + ["drafter"] * 3


def test_checksums_catch_tampering_and_the_cli_reports_it(smoke_pair, tmp_path, capsys):
    import shutil  # noqa: PLC0415

    copy = tmp_path / "copy"
    shutil.copytree(smoke_pair / PAIR_NAME, copy)
    assert train_main(["checksums", str(copy)]) == 0
    (copy / "config.json").write_text("{}")
    (copy / "TOKENIZER.md").unlink()
    assert verify_checksums(copy) == ["TOKENIZER.md", "config.json"]
    assert train_main(["checksums", str(copy)]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    assert train_main(["checksums", "--write", str(copy)]) == 0
    # TOKENIZER.md is gone; config.json, the weights, pivot_model.json and the three tokenizer files are left
    assert (copy / CHECKSUM_FILE).read_text().count("\n") == 6
    assert train_main(["checksums", str(copy)]) == 0


def test_random_drafter_cli_copies_the_config_with_fresh_weights(smoke_pair, tmp_path):
    out = tmp_path / "random"
    assert train_main(["random-drafter", "--like", str(smoke_pair / f"{PAIR_NAME}-dflash"), "--out", str(out)]) == 0
    trained, random = load_dflash(smoke_pair / f"{PAIR_NAME}-dflash"), load_dflash(out)
    assert trained.config == random.config
    assert not torch.equal(trained.fc.weight, random.fc.weight)
    assert json.loads((out / "pivot_model.json").read_text())["random_weights"] is True


def test_held_out_prompts_cli_writes_jsonl(tmp_path):
    root = tmp_path / "lib"
    root.mkdir()
    body = "    value = 1\n" * 12
    for index in range(40):
        (root / f"m{index}.py").write_text(f'def f{index}():\n    """Doc."""\n{body}')
    out = tmp_path / "p.jsonl"
    assert train_main(["held-out-prompts", "--out", str(out), "--stdlib", str(root), "--count", "2"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2
    assert all(is_held_out(r["name"].split(":")[1]) for r in records)
