"""The lab's stand-in for SGLang (a test double, see lab/README.md).

It has SGLang's package name, version metadata, launcher module and the three entry points Pivot and the DDTree
plugin touch before a model loads (``sglang.srt.server_args.prepare_server_args``,
``sglang.srt.plugins.load_plugins``, ``SpeculativeAlgorithm.from_string``), with the flag set of the release it
stands in for. Serving is the lab's server (``pivot_labserver``): ddtree_runtime's reference engine on the CPU behind
SGLang's HTTP surface.
"""

from sglang.version import __version__

__all__ = ["__version__"]
