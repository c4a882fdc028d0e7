"""GPU acceptance suite: stock ``sglang.launch_server`` with the DDTree plugin, held to SGLang's own output.

``python -m ddtree_runtime.acceptance --out DIR`` starts stock SGLang servers as subprocesses on this machine's GPU
(the plugin selected as the production unit selects it, ``SGLANG_PLUGINS=ddtree``), drives them over HTTP with the
shipped tiny pair (each server loads the model's tokenizer, requests carry token ids), stops each by PID, and writes
``DIR/results.json`` and ``DIR/results.md``: versions, GPU, flags and one pass/fail line per case with its figures.
Without a CUDA GPU or without SGLang it writes the reason and exits 0. Nothing in SGLang is replaced or patched;
the plugin's own hooks are the ones SGLang's plugin loader applies.

Cases: baseline greedy; DDTREE (budgets 16 and 64) and DFLASH start, report themselves and decode token for token
like the baseline (or, where bf16 makes SGLang's own DFLASH diverge, no more often than it); accept length above
DFLASH's; CUDA graphs on and off; 16 concurrent mixed requests with SGLang's strict idle memory check; sampled
decoding's token distribution against the baseline's; logprob, stop-token, stop-string and regex-grammar
requests; refusals at start.

Figures beside the cases (not pass/fail; an HTTP error while measuring is a failed case line): greedy tokens/s at
batch 1 and 16 on the baseline and on every speculative server with CUDA graphs (:mod:`.throughput`), and the step
``round-cost``: ms per decode round of baseline, DFLASH and DDTREE on a random-weight Qwen3-8B-shaped target with a
1B-shaped drafter (:mod:`.round_cost`). The report states DDTREE/DFLASH and X/baseline ratios.
"""
