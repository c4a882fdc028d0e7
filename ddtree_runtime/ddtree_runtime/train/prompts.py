"""Evaluation prompts from held-out standard-library files: a documented function's header and docstring,
as raw code for the target to continue (the files were never trained on)."""

from __future__ import annotations

import ast
from typing import Any

from ddtree_runtime.train.corpus import SourceFile

MIN_BODY_BYTES = 120


def function_header_prompt(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The function's source up to the end of its docstring plus the next line's indentation, or None."""
    if not node.body or ast.get_docstring(node) is None or len(node.body) < 2 or node.col_offset != 0:
        return None
    lines = source.splitlines(keepends=True)
    docstring_end = node.body[0].end_lineno
    body_start = node.body[1]
    assert docstring_end is not None
    header = "".join(lines[node.lineno - 1 - len(node.decorator_list) : docstring_end])
    body = "".join(lines[docstring_end : node.end_lineno])
    if len(body) < MIN_BODY_BYTES:
        return None
    return header + " " * body_start.col_offset


def held_out_prompts(files: list[SourceFile], count: int) -> list[dict[str, Any]]:
    """Up to ``count`` prompts, at most one per file, in path order."""
    records = []
    for source in sorted(files, key=lambda s: s.relative):
        if "/test" in "/" + source.relative or len(records) >= count:
            continue
        try:
            text = source.data.decode()
            tree = ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                prompt = function_header_prompt(text, node)
                if prompt is not None:
                    records.append({"name": f"heldout:{source.relative}:{node.name}", "prompt": prompt})
                    break
    return records
