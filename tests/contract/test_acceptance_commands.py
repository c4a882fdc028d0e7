"""The GPU acceptance suite's server command lines, checked on CPU by stock SGLang 0.5.23's own parser.

The suite runs only on a GPU machine, where a flag SGLang does not accept costs a server start (0.5.23 found
``--cuda-graph-max-bs`` ambiguous there). Here every serving command must parse with the plugin loaded and every
refusal must fail with the plugin's own message.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from contract_support import ProbeRunner

SERVING_VARS = Path(__file__).resolve().parents[2] / "inventory" / "production" / "group_vars" / "serving.yml"
ROUND_COST_SERVERS = ("8b-baseline", "dflash-8b", "dflash-8b-sync", "ddtree-8b-b15", "ddtree-8b-b16", "ddtree-8b-b64",
                      "ddtree-8b-b256", "ddtree-8b-b64-sync", "27b-baseline", "dflash-27b", "dflash-27b-sync",
                      "ddtree-27b-b15", "ddtree-27b-b64", "ddtree-27b-b64-sync")
"""The round-cost steps' servers (random weights, config-only Qwen3-8B- and Qwen3.6-27B-shaped models)."""


def test_every_serving_command_parses_and_every_refusal_fails_with_the_plugins_message(
    run_probe: ProbeRunner,
) -> None:
    outcome = run_probe("acceptance-commands")["specs"]
    serving = {name: o for name, o in outcome.items() if o["expected"] is None}
    refusals = {name: o for name, o in outcome.items() if o["expected"] is not None}
    assert {"baseline", "ddtree-b16", "ddtree-b64", "dflash", "ddtree-b64-nographs", "hybrid-baseline",
            "ddtree-hybrid-b16", "dflash-hybrid", "deterministic-baseline", "deterministic-dflash",
            "deterministic-ddtree-b64", *ROUND_COST_SERVERS} <= set(serving)
    assert len(refusals) == 4
    for name, o in serving.items():
        assert o["ok"], f"{name}: {o.get('error')}"
        expected = None if "baseline" in name else "DFLASH" if "dflash" in name else "DDTREE"
        assert o["algorithm"] == expected, name
    for name, o in refusals.items():
        assert not o["ok"], f"{name} was accepted"
        assert o["expected"] in o["error"], f"{name}: {o['error']}"


def test_the_round_cost_servers_load_random_weights_for_target_and_drafter(run_probe: ProbeRunner) -> None:
    outcome = run_probe("acceptance-commands")["specs"]
    for name in ROUND_COST_SERVERS:
        assert outcome[name]["ok"], f"{name}: {outcome[name].get('error')}"
        assert outcome[name]["load_format"] == "dummy", name
        expected_draft = None if name.endswith("baseline") else "dummy"
        assert outcome[name]["draft_load_format"] == expected_draft, name
        assert outcome[name]["draft_tokens"] == (None if name.endswith("baseline") else 16), name
        # DDTREE runs under the overlap scheduler as DFLASH does; only the -sync servers turn it off.
        assert outcome[name]["disable_overlap_schedule"] == name.endswith("-sync"), name
    # Everything else reads its checkpoint.
    assert {o["load_format"] for n, o in outcome.items() if o["ok"] and n not in ROUND_COST_SERVERS} == {"auto"}


def test_only_the_config_only_round_cost_models_skip_the_tokenizer(run_probe: ProbeRunner) -> None:
    """Every server with a real model loads its tokenizer (stop strings, grammars, a multimodal target's processor);
    the round-cost models have none to load (test_acceptance_tokenizers.py loads the others)."""
    outcome = run_probe("acceptance-commands")["specs"]
    skipping = {name for name, o in outcome.items() if o["ok"] and o["skip_tokenizer_init"]}
    assert skipping == set(ROUND_COST_SERVERS)


def test_the_hybrid_case_runs_the_mamba_settings_of_the_production_unit(run_probe: ProbeRunner) -> None:
    flags = run_probe("acceptance-commands")["hybrid_flags"]
    common = yaml.safe_load(SERVING_VARS.read_text())["pivot_serving_common_args"]
    production = {key: str(value) for key, value in common.items() if key.startswith("mamba-")}
    assert production, "the production inventory renders mamba settings for the hybrid target"
    assert dict(zip(flags[::2], flags[1::2], strict=True)) == {f"--{k}": v for k, v in production.items()}
