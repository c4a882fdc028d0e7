"""The lab's stand-in for SGLang's server: SGLang's HTTP surface and command line over the reference engine.

Test equipment, in a distribution of its own that production never installs: the lab's stand-in SGLang
(``lab/files/sglang-standin``) serves with it, and ddtree_runtime's tests start it. It imports ddtree_runtime; nothing
in ddtree_runtime imports it.

Run ``python -m pivot_labserver --model-path ... [SGLang flags]``; see :mod:`.cli` for the flags
and DDTree environment knobs, :mod:`.models` for lab models, and :mod:`.server` for endpoints.
"""
