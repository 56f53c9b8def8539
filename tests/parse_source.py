"""`ast.parse` for the structure tests, past CPython 3.11's spurious AST recursion-depth error.

CPython before 3.11.8 and 3.12.1 can raise `SystemError: AST constructor recursion depth mismatch`
for valid source while it turns the parsed tree into Python objects (python/cpython#106905: a
failure path skipped the depth bookkeeping; seen with other threads running, as in a test
worker, once in a CI run of this suite). It says nothing about the source, so it is parsed again.
"""

from __future__ import annotations

import ast


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    try:
        return ast.parse(source, filename)
    except SystemError as exc:
        if "recursion depth mismatch" not in str(exc):
            raise
        return ast.parse(source, filename)
