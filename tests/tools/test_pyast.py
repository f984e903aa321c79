"""Host-side parsing of model-written code from many threads at once (the rewards' thread pool)."""

import ast
import concurrent.futures

from agentrl_jax.tools import pyast

# A tall AST. The interleaving that breaks unlocked parses (python/cpython#106905: another thread runs while one
# builds its AST, through a garbage collection that calls back into Python) is rare and not reproduced here; CI
# met it once in 164 HumanEval solutions scored on 16 threads. This checks the locked parse from many threads.
_DEEP = "def f(x):\n" + "".join("  " * (i + 1) + f"if x > {i}:\n" for i in range(40)) + "  " * 41 + "return [" + \
    ", ".join(f"({i}, {{'k': [x, {i}]}})" for i in range(200)) + "]\n"


def test_parse_equals_ast_parse():
  assert ast.dump(pyast.parse(_DEEP)) == ast.dump(ast.parse(_DEEP))
  assert ast.dump(pyast.parse("1 + 2", mode="eval")) == ast.dump(ast.parse("1 + 2", mode="eval"))


def test_parses_from_many_threads_never_raise():
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    trees = list(pool.map(lambda _: ast.dump(pyast.parse(_DEEP)), range(400)))
  assert set(trees) == {ast.dump(ast.parse(_DEEP))}
