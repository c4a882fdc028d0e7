"""The acceptance suite's models as stock SGLang 0.5.23 loads them at start, on CPU (.venv-sglang, with xgrammar).

The first GPU run found two things: the hybrid target could not start (a multimodal config makes SGLang load a
processor even with ``--skip-tokenizer-init``, and the directory had none), and with ``--skip-tokenizer-init`` every
stop string and grammar was refused per request, so DDTREE's grammar path was never exercised. Here each model is
loaded with its baseline server's exact command line by SGLang's own start code (``get_tokenizer``, or for the
multimodal target ``get_processor_wrapper`` and ``get_mm_processor``; then ``create_grammar_backend``), and the
suite's regex goes through SGLang's own vocabulary mask.
"""

from __future__ import annotations

from typing import Any

import pytest
from contract_support import ProbeRunner

BYTE_IDS = {"a": 97, "z": 122, " ": 32, "1": 49}
EOS = [256, 258]
LOWERCASE_AND_SPACE = [32, *range(97, 123)]


@pytest.fixture(scope="module")
def loaded(run_probe: ProbeRunner) -> dict[str, Any]:
    return run_probe("acceptance-tokenizers")


def test_the_hybrid_target_starts_with_the_qwen_vl_processor_at_its_vision_token_ids(loaded: dict[str, Any]) -> None:
    hybrid = loaded["servers"]["hybrid-baseline"]
    assert hybrid["ok"], hybrid.get("error")
    assert hybrid["multimodal"] and not hybrid["skip_tokenizer_init"]
    assert (hybrid["processor"], hybrid["image_processor"], hybrid["video_processor"]) == (
        "Qwen3VLProcessor", "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor")
    assert hybrid["mm_processor"] == "QwenVLImageProcessor", "SGLang's processor for Qwen3_5ForConditionalGeneration"
    # image, video, vision start, vision end: the tokenizer's ids agree with the config's (hybrid.py)
    assert hybrid["processor_token_ids"] == hybrid["mm_token_ids"] == [300, 301, 302, 303]


def test_without_its_processor_files_the_hybrid_target_fails_as_on_the_gpu(loaded: dict[str, Any]) -> None:
    message = loaded["hybrid_without_processor"]
    assert message is not None and "preprocessor_config.json" in message


@pytest.mark.parametrize("server", ["baseline", "hybrid-baseline"])
def test_the_servers_tokenizer_gives_the_suites_ids(loaded: dict[str, Any], server: str) -> None:
    outcome = loaded["servers"][server]
    assert outcome["ok"], outcome.get("error")
    assert outcome["prompts_as_suite"], "text prompts tokenize to the suite's input_ids"
    assert outcome["tokenizer_size"] == outcome["vocab_size"] == 320 and outcome["eos"] == EOS
    assert outcome["eos_token_id"] == 258 and outcome["has_chat_template"]
    assert outcome["specials"] == [257, 258, 259]
    if server == "baseline":
        assert outcome["tokenizer"] == "TokenizersBackend"  # tokenizer.json as written: bytes are ids, no NFC
        assert outcome["decomposed_accent"] == outcome["decomposed_accent_bytes"]
    else:
        # transformers' Qwen3.5 class adds the NFC normalization real Qwen3.5 has (text that is not NFC: other ids;
        # the suite sends input_ids, and its prompts are NFC)
        assert outcome["tokenizer"] == "Qwen3_5Tokenizer"
        assert outcome["decomposed_accent"] == [0xC3, 0xA9]


@pytest.mark.parametrize("server", ["baseline", "hybrid-baseline"])
def test_xgrammar_masks_the_byte_vocabulary_for_the_suites_regex(loaded: dict[str, Any], server: str) -> None:
    outcome = loaded["servers"][server]
    assert outcome["ok"], outcome.get("error")
    assert outcome["grammar_backend"] == "xgrammar", "SGLang's default once the tokenizer is loaded"
    assert outcome["grammar_backend_class"] == "XGrammarGrammarBackend"
    assert outcome["grammar_first"] == LOWERCASE_AND_SPACE, "[a-z ]+ needs one character before it may end"
    assert outcome["grammar_after_text"] == sorted([*LOWERCASE_AND_SPACE, *EOS]) and outcome["grammar_refuses_digit"]
    assert outcome["grammar_after_rollback"] == outcome["grammar_after_text"]


def test_the_round_cost_models_load_no_tokenizer(loaded: dict[str, Any]) -> None:
    outcome = loaded["servers"]["8b-baseline"]
    assert outcome["ok"], outcome.get("error")
    assert outcome["skip_tokenizer_init"] and "tokenizer" not in outcome
