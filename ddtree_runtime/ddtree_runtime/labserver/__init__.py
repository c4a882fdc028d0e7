"""Lab-mode server: SGLang's HTTP surface and command line over the reference engine.

Run ``python -m ddtree_runtime.labserver --model-path ... [SGLang flags]``; see :mod:`.cli` for the flags
and DDTree environment knobs, :mod:`.models` for lab models, and :mod:`.server` for endpoints.
"""
