"""Host side of assert-form suites (HumanEval, the recipe's KodCode, MBPP, pytest files): which tests a test code
holds, the harness program that runs one, and the verdict it proves.

    tests = split_tests(test_code, entry_point)    # [(code, target)]: target 'check', 'module', 'test:NAME'
    program, stdin, key = program_for(solution, prefix, code, target, entry_point)
    outcome, detail = verdict(executor.submit(program, stdin=stdin).result(), key)

What runs is decided here, from the test code, never by the solution: `check(entry_point)` when the test defines
`check` and names an entry point (one test per assert when `check` is a list of one-line asserts: the recipe's
partial credit); every pytest-style `test_*` function and `Test*` class method, each one test (parametrized ones
with all their cases); module-level asserts (MBPP) otherwise. A test code that would run nothing (`check` without
an entry point or a call, no test function, no assert) or does not parse is a malformed ground truth
(`ValueError`), never a pass. The program is the harness (`harness_protocol.py`, `harness_solution.py`,
`harness_tests.py`, `harness_main.py`: see the last for why it proves what it says) with the solution embedded;
the test, what to run and a fresh random key go on standard input, which only the harness's tester process
reads; the verdict line carries the HMAC of its text under that key, never the key.
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import hmac
import json
import os
import secrets

from agentrl_jax.tools.base import ExecResult
from agentrl_jax.tools import pyast

_HARNESS_FILES = ("harness_protocol.py", "harness_solution.py", "harness_tests.py", "harness_main.py")
# Verdicts of the harness that are not the response's doing, by the kind of failure they are.
INFRA_VERDICTS = {"malformed": "ground_truth", "unsupported": "harness", "harness_error": "harness"}
_BUILTIN_NAMES = frozenset(dir(builtins))
VERDICT_TAG = "agentrl-verdict"


@functools.cache
def harness_source() -> str:
  """The harness program's text, without the line that starts it."""
  here = os.path.dirname(os.path.abspath(__file__))
  parts = []
  for name in _HARNESS_FILES:
    with open(os.path.join(here, name), encoding="utf-8") as f:
      parts.append(f.read())
  return "\n\n".join(parts)


def _checks(node: ast.AST) -> bool:
  """Whether `node` holds something that can fail a test: an assert, a raise, or a call of assert* / raises."""
  for n in ast.walk(node):
    if isinstance(n, (ast.Assert, ast.Raise)):
      return True
    if isinstance(n, ast.Call):
      f = n.func
      name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
      if name.startswith("assert") or name in ("raises", "fail", "check"):
        return True
  return False


def _split_check(test: str) -> list[str]:
  """`def check(candidate):` + one-line asserts -> one test per assert (the recipe's partial credit)."""
  lines = [line for line in test.split("\n") if line.strip()]
  if len(lines) < 3 or not lines[0].startswith("def check(") or not all(
      line.strip().startswith("assert") for line in lines[1:]):
    return [test]
  parts = [lines[0] + "\n" + line for line in lines[1:]]
  try:
    for p in parts:
      pyast.parse(p)
  except SyntaxError:
    return [test]
  return parts


def split_tests(code: str, entry_point: str) -> list[tuple[str, str]]:
  """The tests a test code holds, as (code, target) pairs (see the module docstring).

  Raises:
    ValueError: the test code does not parse, or would run no check (a malformed ground truth).
  """
  try:
    tree = pyast.parse(code)
  except (SyntaxError, ValueError) as e:
    raise ValueError(f"code ground truth: the test code does not parse: {e}") from None
  defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
  functions = [name for name in defs if name.startswith("test")]
  methods = [f"{c.name}.{m.name}" for c in tree.body if isinstance(c, ast.ClassDef) and c.name.startswith("Test")
             for m in c.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")]
  top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
  module_checks = any(_checks(n) for n in top)
  if "check" in defs and entry_point:
    if not _checks(defs["check"]):
      raise ValueError("code ground truth: check(candidate) asserts nothing")
    return [(part, "check") for part in _split_check(code)]
  if functions or methods:
    return [(code, f"test:{name}") for name in functions + methods]
  if module_checks:
    return [(code, "module")]
  if "check" in defs:
    raise ValueError("code ground truth: the test defines check(candidate) but names no entry_point to call it "
                     "with, and never calls it")
  raise ValueError("code ground truth: the test code runs no check (no assert, no check(entry_point), no test_* "
                   "function or Test* class)")


def free_names(code: str) -> list[str]:
  """Names the test code reads but never binds (nor are builtins): those it takes from the solution."""
  tree = pyast.parse(code)
  loaded, bound = set(), set()
  for n in ast.walk(tree):
    if isinstance(n, ast.Name):
      (loaded if isinstance(n.ctx, ast.Load) else bound).add(n.id)
    elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      bound.add(n.name)
    elif isinstance(n, ast.arg):
      bound.add(n.arg)
    elif isinstance(n, ast.alias):
      bound.add((n.asname or n.name).split(".")[0])
    elif isinstance(n, ast.ExceptHandler) and n.name:
      bound.add(n.name)
  return sorted(loaded - bound - _BUILTIN_NAMES)


def prompt_helpers(prompt: str, entry_point: str) -> str:
  """A code prompt (HumanEval's) without the entry point's stub: its imports and helper functions, to pass as the
  suite's `import_prefix` so that the test uses the prompt's helpers (`poly`, `encode_cyclic`), never a
  solution's redefinition of them. '' when the prompt does not parse."""
  try:
    tree = pyast.parse(prompt)
  except (SyntaxError, ValueError):
    return ""
  lines = prompt.split("\n")
  drop = set()
  for n in tree.body:
    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point:
      start = min([n.lineno] + [d.lineno for d in n.decorator_list])
      drop.update(range(start - 1, n.end_lineno))
  return "\n".join(line for i, line in enumerate(lines) if i not in drop).strip() + "\n"


def program_for(solution: str, prefix: str, code: str, target: str, entry_point: str) -> tuple[str, str, str]:
  """(program, stdin, key) of one test run. Script-style targets (check, module) run the solution as
  `__main__`, as HumanEval and MBPP append the test to it; pytest-style ones import it as `solution`."""
  key = secrets.token_hex(32)
  script = not target.startswith("test:")
  program = f"{harness_source()}\n\n_main({solution!r}, {prefix!r}, {script!r})\n"
  stdin = json.dumps({"key": key, "test": code, "target": target, "entry_point": entry_point,
                      "free_names": free_names(code)})
  return program, stdin, key


def _proof(stdout: str, key: str) -> dict | None:
  """The first verdict line whose MAC is valid under `key`, decoded; None if there is none."""
  mac_key = bytes.fromhex(key)
  for line in stdout.split("\n"):
    if not line.startswith(VERDICT_TAG + " "):
      continue
    mac, _, body = line[len(VERDICT_TAG) + 1:].partition(" ")
    want = hmac.new(mac_key, body.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac.encode("ascii", "replace"), want.encode()):
      continue
    try:
      proof = json.loads(body)
    except ValueError:
      return None
    return proof if isinstance(proof, dict) else None
  return None


def verdict(result: ExecResult, key: str) -> tuple[str, str]:
  """(outcome, detail) of a harness run: 'pass', 'fail', an `INFRA_VERDICTS` key, 'sandbox_error', or the run's
  status ('timeout', 'memory', 'killed', 'error') when it ended without a verdict."""
  if result.status == "sandbox_error":
    return "sandbox_error", result.stderr.strip()[-300:]
  proof = _proof(result.stdout, key)
  if proof is None or proof.get("outcome") not in ("pass", "fail", *INFRA_VERDICTS):
    tail = result.stderr.strip().splitlines()[-1:] or [""]
    status = result.status if result.status != "ok" else "fail"
    return status, f"the harness gave no verdict (status {result.status}) {tail[0][:300]}".strip()
  if result.status != "ok":
    return result.status, f"the run ended with status {result.status} after the verdict"
  return str(proof["outcome"]), str(proof.get("detail", ""))[:1500]
