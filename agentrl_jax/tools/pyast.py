"""`ast.parse` safe to call from several threads at once.

CPython 3.11 (before 3.11.8) keeps the counter that guards the depth of the AST it builds in interpreter-wide
state, not per thread. Two threads parsing at once (the rewards score a batch's responses on a thread pool) can
interleave, and one of them then raises `SystemError: AST constructor recursion depth mismatch` on a program that
is fine (python/cpython#106905): an honest solution scored as a crash. Every host-side parse of model-written code
goes through this module's lock. Code that runs inside the sandbox (one parse per process) needs none.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec", **kwargs) -> ast.AST:
  """`ast.parse`, one thread at a time (the caller's source is parsed exactly as `ast.parse` parses it)."""
  with _LOCK:
    return ast.parse(source, filename, mode, **kwargs)
