"""Acceptance-length evaluation: coding-task suite and prompt files, AR / DFlash chain / DDTree runs on the
reference engine or a live SGLang server, JSON and Markdown reports. Command line: ``python -m
ddtree_runtime.eval --help``."""
