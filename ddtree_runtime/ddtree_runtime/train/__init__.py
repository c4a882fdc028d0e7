"""Training of the shipped target + DFlash drafter pair from the Python standard library's sources.
Command line: ``python -m ddtree_runtime.train --help``; the recipe is in ``docs/model-pair.md``."""
