"""DDTree speculative decoding runtime.

Modules:
- :mod:`ddtree_runtime.tree`: best-first draft-tree construction (single and batched) and the tensors a
  serving engine needs to verify a tree (positions, attention masks, EAGLE-style retrieve lists).
- :mod:`ddtree_runtime.verify`: greedy and lossless sampled tree verification, KV-compaction indices.
- :mod:`ddtree_runtime.reference`: a pure-PyTorch Qwen3 target, the DFlash drafter and the
  autoregressive / DFlash / DDTree decoders.

The lab's server (SGLang's HTTP surface over the reference engine) is test equipment and not part of this package:
``pivot_labserver`` in ``lab/files/labserver``, which imports this package and is never imported by it.
"""

__version__ = "0.1.0"
