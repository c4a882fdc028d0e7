"""The byte vocabulary as a Hugging Face fast tokenizer (``write_hf_tokenizer``): the same ids as ByteTokenizer for
every text, the chat template :func:`chat_prompt` is, the files shipped in the model directories exactly what the
code writes, and every user of the shipped pairs (eval, lab server, bench, acceptance prompts) on the same ids.

Needs ``tokenizers`` and ``transformers`` (.venv-rt). What SGLang 0.5.23 and xgrammar make of the files is checked in
.venv-sglang by tests/contract/test_acceptance_tokenizers.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers", minversion="5")

from ddtree_runtime.acceptance.hybrid import HYBRID_VISION_TOKEN_NAMES, PROCESSOR_FILES  # noqa: E402
from ddtree_runtime.acceptance.prompts import suite_prompts  # noqa: E402
from ddtree_runtime.bench.tau import PROMPTS, bench_prompts  # noqa: E402
from ddtree_runtime.eval.backends import (  # noqa: E402
    SHIPPED_DRAFTER,
    SHIPPED_HYBRID_DRAFTER,
    SHIPPED_HYBRID_TARGET,
    SHIPPED_TARGET,
    ReferenceBackend,
)
from ddtree_runtime.eval.tasks import CODING_TASKS, HELD_OUT_PROMPTS, load_prompt_file  # noqa: E402
from ddtree_runtime.tokenizer import (  # noqa: E402
    BYTE_VOCAB,
    HF_TOKENIZER_FILES,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    ByteTokenizer,
    HfTokenizer,
    chat_prompt,
    chat_template,
    load_tokenizer,
    thinking_suffix,
    unused_token,
    write_hf_tokenizer,
)
from ddtree_runtime.train.__main__ import main as train_main  # noqa: E402
from ddtree_runtime.train.pair import CHECKSUM_FILE, TOKENIZER_NOTE, verify_checksums  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

BYTE = ByteTokenizer()
SHIPPED = (SHIPPED_TARGET, SHIPPED_DRAFTER, SHIPPED_HYBRID_TARGET, SHIPPED_HYBRID_DRAFTER)
PIECES = ["a", "Z", " ", "\n", "\t", "\r\n", "é", "e\u0301", "ß", "日本", "🙂", "\x00", "\x7f", "<", "|", ">", "<|",
          "|>", "<|im_end", "<think", "unused_270", unused_token(270), *SPECIAL_TOKENS]
TEXTS = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=24).map("".join)


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerFast:
    directory = tmp_path_factory.mktemp("tokenizer")
    assert [p.name for p in write_hf_tokenizer(directory)] == list(HF_TOKENIZER_FILES)
    return PreTrainedTokenizerFast.from_pretrained(str(directory))


@settings(max_examples=400, deadline=None)
@given(text=TEXTS)
def test_every_text_gets_the_byte_tokenizers_ids_and_decodes_back(hf: PreTrainedTokenizerFast, text: str) -> None:
    ids = hf.encode(text, add_special_tokens=False)
    assert ids == BYTE.encode(text)
    assert hf.decode(ids, skip_special_tokens=False) == text
    assert hf.decode(ids, skip_special_tokens=True) == BYTE.decode(ids)


def test_bytes_specials_and_the_vocabulary(hf: PreTrainedTokenizerFast) -> None:
    assert hf.encode("héllo 🙂", add_special_tokens=False) == list("héllo 🙂".encode())
    for name, token_id in SPECIAL_TOKENS.items():
        assert hf.encode(f"x{name}y", add_special_tokens=False) == [ord("x"), token_id, ord("y")]
        assert hf.convert_ids_to_tokens(token_id) == name
    # Qwen's split: the reasoning and tool-call tags stay in decoded text, the chat markers and the mask do not.
    ids = BYTE.encode("<|im_start|>a<think>b</think><tool_call>c</tool_call><|mask|><|im_end|><|endoftext|>")
    assert hf.decode(ids, skip_special_tokens=True) == "a<think>b</think><tool_call>c</tool_call>"
    assert BYTE.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert len(hf) == hf.vocab_size == VOCAB_SIZE
    assert (hf.eos_token, hf.eos_token_id, hf.pad_token, hf.pad_token_id, hf.bos_token) == (
        "<|im_end|>", SPECIAL_TOKENS["<|im_end|>"], "<|endoftext|>", SPECIAL_TOKENS["<|endoftext|>"], None)
    assert hf.encode("ab") == [97, 98], "no BOS or EOS is added"
    # Unused ids are in the vocabulary (the models' embedding has 320 rows) and never come out of encoding.
    assert hf.convert_ids_to_tokens(list(range(BYTE_VOCAB, VOCAB_SIZE))) == [
        unused_token(i) for i in range(BYTE_VOCAB, VOCAB_SIZE)]
    assert hf.encode(unused_token(300), add_special_tokens=False) == list(unused_token(300).encode())


def test_the_tokenizers_library_alone_reads_tokenizer_json(tmp_path: Path) -> None:
    write_hf_tokenizer(tmp_path)
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "<|im_start|>user\nnaïve — 🙂<|im_end|>\n"
    assert raw.encode(text, add_special_tokens=False).ids == BYTE.encode(text)
    assert raw.get_vocab_size() == VOCAB_SIZE and raw.normalizer is None


def test_extra_special_tokens_take_unused_ids_only(tmp_path: Path) -> None:
    write_hf_tokenizer(tmp_path, HYBRID_VISION_TOKEN_NAMES)
    tok = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    for name, token_id in HYBRID_VISION_TOKEN_NAMES.items():
        assert tok.encode(name, add_special_tokens=False) == [token_id]
    assert tok.decode([302, 300, 303, 104, 105], skip_special_tokens=True) == "hi"
    assert len(tok) == VOCAB_SIZE
    with pytest.raises(ValueError, match="unused ids"):
        write_hf_tokenizer(tmp_path, {"<x>": 12})
    with pytest.raises(ValueError, match="share ids"):
        write_hf_tokenizer(tmp_path, {"<x>": 300, "<y>": 300})


MESSAGES = [
    [{"role": "user", "content": "Write gcd(a, b)."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo\n<think>"},
     {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}],
    [{"role": "user",
      "content": [{"type": "text", "text": "a"}, {"type": "image"}, "raw", {"type": "text", "text": "b"}]}],
    [{"content": "no role"}, {"role": "user", "content": None}, {"role": "user"}],
]


@pytest.mark.parametrize("messages", MESSAGES)
def test_the_chat_template_is_chat_prompt(hf: PreTrainedTokenizerFast, messages: list[dict]) -> None:
    assert hf.chat_template == chat_template()
    render = hf.apply_chat_template
    assert render(messages, add_generation_prompt=True, tokenize=False) == chat_prompt(messages)
    for thinking in (True, False):
        assert render(messages, add_generation_prompt=True, tokenize=False, enable_thinking=thinking) == (
            chat_prompt(messages) + thinking_suffix(thinking)), "what the lab server's --reasoning-parser sends"
    assert chat_prompt(messages).startswith(render(messages, add_generation_prompt=False, tokenize=False))


# ---- the shipped model directories ----------------------------------------------------------------------------


def test_shipped_tokenizer_files_are_exactly_what_the_code_writes(tmp_path: Path) -> None:
    """Regenerated from scratch (note, tokenizer and processor files, SHA256SUMS), every shipped directory comes out
    byte for byte the same, so the files cannot drift from write_hf_tokenizer."""
    generated = {TOKENIZER_NOTE, CHECKSUM_FILE, *HF_TOKENIZER_FILES, *PROCESSOR_FILES}
    for shipped in SHIPPED:
        copy = tmp_path / shipped.name
        shutil.copytree(shipped, copy)
        for name in generated:
            (copy / name).unlink(missing_ok=True)
        assert train_main(["tokenizer-files", str(copy)]) == 0
        names = sorted(p.name for p in shipped.iterdir())
        assert sorted(p.name for p in copy.iterdir()) == names, shipped.name
        for name in names:
            assert (copy / name).read_bytes() == (shipped / name).read_bytes(), f"{shipped.name}/{name}"
        assert verify_checksums(shipped) == []
    assert {p.name for p in SHIPPED_TARGET.iterdir()} >= set(HF_TOKENIZER_FILES)
    assert {p.name for p in SHIPPED_HYBRID_TARGET.iterdir()} >= {*HF_TOKENIZER_FILES, *PROCESSOR_FILES}
    assert not {*HF_TOKENIZER_FILES, *PROCESSOR_FILES} & {p.name for p in SHIPPED_DRAFTER.iterdir()}
    assert not {*HF_TOKENIZER_FILES, *PROCESSOR_FILES} & {p.name for p in SHIPPED_HYBRID_DRAFTER.iterdir()}


def test_the_hybrid_targets_tokenizer_has_its_vision_tokens_at_the_configs_ids() -> None:
    config = json.loads((SHIPPED_HYBRID_TARGET / "config.json").read_text())
    tok = PreTrainedTokenizerFast.from_pretrained(str(SHIPPED_HYBRID_TARGET))
    assert {name: tok.convert_tokens_to_ids(name) for name in HYBRID_VISION_TOKEN_NAMES} == {
        "<|image_pad|>": config["image_token_id"], "<|video_pad|>": config["video_token_id"],
        "<|vision_start|>": config["vision_start_token_id"], "<|vision_end|>": config["vision_end_token_id"]}
    image = json.loads((SHIPPED_HYBRID_TARGET / "preprocessor_config.json").read_text())
    vision = config["vision_config"]
    assert (image["patch_size"], image["merge_size"], image["temporal_patch_size"]) == (
        vision["patch_size"], vision["spatial_merge_size"], vision["temporal_patch_size"])
    assert image["processor_class"] == "Qwen3VLProcessor"


def all_prompt_texts() -> list[str]:
    texts = [p.text for p in (*CODING_TASKS, *load_prompt_file(HELD_OUT_PROMPTS))]
    return [*texts, *(chat_prompt([{"role": "user", "content": t}]) for t in PROMPTS), "naïve e\u0301 🙂 <think>"]


@pytest.mark.parametrize("target", [SHIPPED_TARGET, SHIPPED_HYBRID_TARGET], ids=["dense", "hybrid"])
def test_every_user_of_the_shipped_pairs_gets_the_byte_tokenizers_ids(target: Path) -> None:
    """load_tokenizer (the lab server's engine, eval's ReferenceBackend) now reads tokenizer.json; bench and the
    acceptance suite's prompts come out as ByteTokenizer's, so nothing the pairs were trained and measured with
    moves."""
    loaded = load_tokenizer(target)
    assert isinstance(loaded, HfTokenizer) and loaded.eos_token_ids == {SPECIAL_TOKENS["<|im_end|>"]}
    for text in all_prompt_texts():
        assert loaded.encode(text) == BYTE.encode(text)
        assert loaded.decode(BYTE.encode(text)) == BYTE.decode(BYTE.encode(text))
    assert [p.input_ids for p in suite_prompts()] == [loaded.encode(t) for t in all_prompt_texts()[:24]]
    assert bench_prompts(target, len(PROMPTS)) == [BYTE.encode(chat_prompt([{"role": "user", "content": t}]))
                                                   for t in PROMPTS]
    # transformers' AutoTokenizer picks Qwen3.5's own class for a qwen3_5 directory, which adds NFC normalization
    # (as SGLang's tokenizer for the hybrid does): the same ids for text that is NFC, as every prompt here is.
    auto = AutoTokenizer.from_pretrained(str(target))
    assert all(auto.encode(t, add_special_tokens=False) == BYTE.encode(t) for t in all_prompt_texts()[:-1])


def test_eval_reads_the_targets_tokenizer_and_stops_at_its_eos() -> None:
    backend = ReferenceBackend(SHIPPED_TARGET, {}, "cpu", "float32")
    assert isinstance(backend.tokenizer, HfTokenizer)
    assert backend.eos == {SPECIAL_TOKENS["<|endoftext|>"], SPECIAL_TOKENS["<|im_end|>"]}


def test_without_transformers_load_tokenizer_falls_back_to_the_byte_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "transformers", None)
    assert isinstance(load_tokenizer(SHIPPED_TARGET), ByteTokenizer)
