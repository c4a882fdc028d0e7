"""The GPU acceptance suite's server command lines, checked on CPU by stock SGLang 0.5.23's own parser.

The suite runs only on a GPU machine, where a flag SGLang does not accept costs a server start (0.5.23 found
``--cuda-graph-max-bs`` ambiguous there). Here every serving command must parse with the plugin loaded and every
refusal must fail with the plugin's own message.
"""

from __future__ import annotations

from contract_support import ProbeRunner


def test_every_serving_command_parses_and_every_refusal_fails_with_the_plugins_message(
    run_probe: ProbeRunner,
) -> None:
    outcome = run_probe("acceptance-commands")
    serving = {name: o for name, o in outcome.items() if o["expected"] is None}
    refusals = {name: o for name, o in outcome.items() if o["expected"] is not None}
    assert {"baseline", "ddtree-b16", "ddtree-b64", "dflash", "ddtree-b64-nographs"} <= set(serving)
    assert len(refusals) == 4
    for name, o in serving.items():
        assert o["ok"], f"{name}: {o.get('error')}"
        assert o["algorithm"] == {"baseline": None, "dflash": "DFLASH"}.get(name.removesuffix("-nographs"), "DDTREE")
    for name, o in refusals.items():
        assert not o["ok"], f"{name} was accepted"
        assert o["expected"] in o["error"], f"{name}: {o['error']}"
