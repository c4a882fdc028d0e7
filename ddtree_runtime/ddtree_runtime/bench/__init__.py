"""Benchmarks (not tests): tree build time and tau of the reference decoders."""
