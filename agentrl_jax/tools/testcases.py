"""Test-case runner: a candidate program against a suite of tests, each test one sandboxed run.

Suites come in the forms code datasets use (`parse_suite` accepts each as a dict or its JSON text):
  stdin       LiveCodeBench / APPS standard I/O: {"inputs": [str], "outputs": [str]}. The program reads the input on
              stdin; its stdout must match line by line (trailing spaces ignored, numbers compared as decimals).
  functional  LiveCodeBench call-based: {"inputs": [...], "outputs": [...], "fn_name": "f"}. An input is a string
              with one JSON argument per line (or a list of arguments); `Solution().f(*args)` (or a top-level
              `f`) must return the JSON-decoded output.
  assert      HumanEval / the recipe's KodCode / MBPP / pytest form: {"test_code" or "test": str (or a list of
              them), "entry_point": str, "import_prefix": str (optional)}. Which tests run is read from the test
              code (`assert_tests.split_tests`: check(entry_point), one test per one-line assert of a `check`,
              every `test_*` function and `Test*` method, module-level asserts); each runs in the two-process
              harness (`harness_main.py`), where a pass is a verdict only the harness can write after the test's
              last check, and comparisons are the harness's own. The prefix runs before the solution and, as
              trusted code, before the test: names it defines (a prompt's helpers) are the test's, not the
              solution's.
Also accepted: {"ground_truth": <suite>} and LiveCodeBench's list of {"input", "output", "testtype"} records under
"test_cases" (with "fn_name" / "func_name" for functional ones).

In the stdin and functional forms the expected outputs never enter the sandbox: the host compares what the
program printed, as data of its own (decoded JSON), so no exit or hook inside the program can pass a test. The
comparison is total: whatever the program prints (10**400, a list nested 10,000 deep, a number of 100,000
digits, undecodable JSON) it ends in pass or wrong, never in an exception. Test runs keep their whole output up
to a cap far above any expected output (`output_cap`: 16 MiB, or 4x the largest expected output), not the head
and tail a tool call shows the model. A run the sandbox could not carry out (`sandbox_error`: the executor
showed its infrastructure broken), a verdict that the test cannot run here (malformed) or that the harness
cannot run it (unsupported, harness_error) is an infrastructure outcome: `SuiteReport.infra` names it, and the
suite's score is not the solution's.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import math
import secrets
from collections.abc import Mapping
from typing import Any

from agentrl_jax.tools import assert_tests
from agentrl_jax.tools.base import ExecResult, Executor
from agentrl_jax.tools import pyast

KINDS = ("stdin", "functional", "assert")
OUTPUT_CAP_BYTES = 16 << 20  # at least this much of a test run's output is kept whole (see `output_cap`)
# What LiveCodeBench prepends to call-based solutions (starter code relies on typing names and the stdlib).
FUNCTIONAL_PREFIX = (
    "from typing import *\nfrom collections import *\nfrom functools import *\nfrom itertools import *\n"
    "from heapq import *\nfrom bisect import *\nimport math, string, re, sys, heapq, bisect, collections, "
    "itertools, functools\n"
)


@dataclasses.dataclass(frozen=True)
class TestSuite:
  """A parsed test suite (see the module docstring for the forms).

  Attributes:
    kind: one of `KINDS`.
    inputs: stdin texts (stdin) or argument lists (functional).
    outputs: expected stdout texts (stdin) or expected return values (functional).
    fn_name: functional only: the function / `Solution` method to call.
    tests: assert only: the test code of each test.
    targets: assert only: what each test runs ('check', 'module', 'test:NAME', 'test:Class.method').
    entry_point: assert only: the name passed to `check(...)`; '' = the test code calls what it needs itself.
    import_prefix: code placed before the solution (assert form: before the test too).
  """

  kind: str
  inputs: tuple[Any, ...] = ()
  outputs: tuple[Any, ...] = ()
  fn_name: str = ""
  tests: tuple[str, ...] = ()
  targets: tuple[str, ...] = ()
  entry_point: str = ""
  import_prefix: str = ""

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"TestSuite.kind must be one of {KINDS}, got {self.kind!r}")
    if len(self.inputs) != len(self.outputs):
      raise ValueError(f"TestSuite: {len(self.inputs)} inputs but {len(self.outputs)} outputs")
    if self.total == 0:
      raise ValueError("TestSuite: no test cases")
    if self.kind == "functional" and not self.fn_name.isidentifier():
      raise ValueError(f"TestSuite.fn_name must be an identifier, got {self.fn_name!r}")
    if self.kind == "assert" and len(self.targets) != len(self.tests):
      raise ValueError(f"TestSuite: {len(self.tests)} tests but {len(self.targets)} targets")

  @property
  def total(self) -> int:
    return len(self.tests) if self.kind == "assert" else len(self.inputs)


@dataclasses.dataclass(frozen=True)
class SuiteReport:
  """Outcome of running a solution against a suite.

  Attributes:
    passed: number of tests passed.
    total: number of tests.
    outcomes: per test: 'pass', 'wrong' (stdin / functional), 'fail' (assert), the run's status ('error',
      'timeout', ...), or an infrastructure outcome ('sandbox_error', 'malformed', 'unsupported',
      'harness_error').
    first_failure: a short description of the first failing test ('' if all passed).
    infra: '' when every test's outcome is the solution's doing; else `kind: detail` of the first that is not
      (kind: 'sandbox', 'harness' or 'ground_truth'), and `passed` means nothing.
  """

  passed: int
  total: int
  outcomes: tuple[str, ...]
  first_failure: str = ""
  infra: str = ""

  @property
  def all_passed(self) -> bool:
    return self.total > 0 and self.passed == self.total


def _json_or_value(value: Any) -> Any:
  if isinstance(value, str):
    try:
      return loads(value)
    except ValueError:
      return value
  return value


def _functional_args(value: Any) -> list:
  if isinstance(value, str):
    lines = [line for line in value.split("\n") if line.strip()]
    try:
      return [loads(line) for line in lines]
    except ValueError:
      return [value]
  if isinstance(value, (list, tuple)):
    return list(value)
  return [value]


def parse_suite(ground_truth: Any) -> TestSuite:
  """Parses a code ground truth into a `TestSuite`.

  Raises:
    ValueError: the ground truth is in none of the accepted forms (the message says what was found).
  """
  gt = ground_truth
  if isinstance(gt, (bytes, bytearray)):
    gt = gt.decode("utf-8", errors="replace")
  if isinstance(gt, str):
    try:
      gt = loads(gt)
    except ValueError as e:
      raise ValueError(f"code ground truth is not JSON: {e}") from None
  if isinstance(gt, Mapping) and "ground_truth" in gt and not ({"inputs", "test_code", "test"} & set(gt)):
    return parse_suite(gt["ground_truth"])
  if not isinstance(gt, Mapping):
    raise ValueError(f"code ground truth must be a JSON object, got {type(gt).__name__}")
  prefix = gt.get("import_prefix") or ""
  if not isinstance(prefix, str):
    raise ValueError("code ground truth: 'import_prefix' must be a string")
  fn_name = gt.get("fn_name") or gt.get("func_name") or ""
  if isinstance(gt.get("test_cases"), list):
    cases = [c for c in gt["test_cases"] if isinstance(c, Mapping)]
    if not cases or len(cases) != len(gt["test_cases"]):
      raise ValueError("code ground truth: 'test_cases' must be a non-empty list of {input, output} objects")
    gt = {"inputs": [c.get("input") for c in cases], "outputs": [c.get("output") for c in cases],
          "fn_name": fn_name if any(c.get("testtype") == "functional" for c in cases) else ""}
  if "inputs" in gt or "outputs" in gt:
    inputs, outputs = gt.get("inputs"), gt.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
      raise ValueError("code ground truth: 'inputs' and 'outputs' must be lists")
    fn_name = gt.get("fn_name") or gt.get("func_name") or ""
    if fn_name:
      return TestSuite("functional", tuple(_functional_args(i) for i in inputs),
                       tuple(_json_or_value(o) for o in outputs), fn_name=str(fn_name), import_prefix=prefix)
    as_text = lambda v: v if isinstance(v, str) else "\n".join(map(str, v)) if isinstance(v, list) else str(v)
    return TestSuite("stdin", tuple(as_text(i) for i in inputs), tuple(as_text(o) for o in outputs),
                     import_prefix=prefix)
  test = gt.get("test_code", gt.get("test"))
  if isinstance(test, str) and test.strip():
    codes = [test]
  elif isinstance(test, list) and test and all(isinstance(t, str) and t.strip() for t in test):
    codes = list(test)
  else:
    raise ValueError(f"code ground truth has neither inputs/outputs nor test code (keys: {sorted(gt)[:10]})")
  entry = gt.get("entry_point") or ""
  if entry and not str(entry).isidentifier():
    raise ValueError(f"code ground truth: entry_point must be an identifier, got {entry!r}")
  try:
    pyast.parse(prefix)
  except (SyntaxError, ValueError) as e:
    raise ValueError(f"code ground truth: import_prefix does not parse: {e}") from None
  pairs = [pair for code in codes for pair in assert_tests.split_tests(code, str(entry))]
  return TestSuite("assert", tests=tuple(c for c, _ in pairs), targets=tuple(t for _, t in pairs),
                   entry_point=str(entry), import_prefix=prefix)


def _functional_program(solution: str, suite: TestSuite, args: list, nonce: str) -> str:
  # Arguments travel inside the program (not on stdin) so a solution reading stdin cannot disturb them; the
  # result line is tagged with a per-run nonce so ordinary prints are not mistaken for it.
  return (f"{FUNCTIONAL_PREFIX}{suite.import_prefix}\n{solution}\n\n"
          f"def __agentrl_call():\n"
          f"  import json as _json, sys as _sys\n"
          f"  if hasattr(_sys, 'set_int_max_str_digits'):\n"
          f"    _sys.set_int_max_str_digits(0)  # arguments and results of more than 4,300 digits\n"
          f"  _args = _json.loads({json.dumps(args)!r})\n"
          f"  _g = globals()\n"
          f"  if 'Solution' in _g and hasattr(_g['Solution'], {suite.fn_name!r}):\n"
          f"    _f = getattr(_g['Solution'](), {suite.fn_name!r})\n"
          f"  elif {suite.fn_name!r} in _g:\n"
          f"    _f = _g[{suite.fn_name!r}]\n"
          f"  else:\n"
          f"    raise NameError('function {suite.fn_name} not found (neither Solution.{suite.fn_name} nor a "
          f"top-level def)')\n"
          f"  _r = _f(*_args)\n"
          f"  _sys.stdout.write('\\n{nonce}' + _json.dumps(_r, default=repr) + '\\n')\n"
          f"\n__agentrl_call()\n")


def _as_decimal(token: str) -> decimal.Decimal | None:
  try:
    d = decimal.Decimal(token)
  except (decimal.InvalidOperation, ValueError):
    return None
  return d if d.is_finite() else None


def stdout_matches(actual: str, expected: str) -> bool:
  """LiveCodeBench-style stdout check: same non-empty-trimmed lines; tokens equal or equal as decimals."""
  got = [line.rstrip() for line in actual.strip().split("\n")]
  want = [line.rstrip() for line in str(expected).strip().split("\n")]
  if got == want:
    return True
  if len(got) != len(want):
    return False
  for g, w in zip(got, want):
    if g.strip() == w.strip():
      continue
    gt, wt = g.split(), w.split()
    if len(gt) != len(wt):
      return False
    for a, b in zip(gt, wt):
      if a != b and (_as_decimal(a) is None or _as_decimal(a) != _as_decimal(b)):
        return False
  return True


def _numbers_match(actual: int | float, expected: int | float) -> bool:
  if isinstance(actual, int) and isinstance(expected, int):
    return actual == expected  # exact, however large
  try:
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9)
  except OverflowError:  # an int beyond any float: equal to no float
    return False


def _match(actual: Any, expected: Any) -> bool:
  """`values_match` without the guard: iterative over the expected value's structure (the actual one may be
  arbitrarily deep; it is only walked as far as the expected one goes)."""
  stack = [(actual, expected)]
  while stack:
    a, e = stack.pop()
    if isinstance(a, tuple):
      a = list(a)
    if isinstance(e, tuple):
      e = list(e)
    if isinstance(a, (int, float)) and isinstance(e, (int, float)):
      if not _numbers_match(a, e):
        return False
    elif isinstance(a, list) and isinstance(e, list):
      if len(a) != len(e):
        return False
      stack.extend(zip(a, e))
    elif isinstance(a, dict) and isinstance(e, dict):
      a = {str(k): v for k, v in a.items()}
      e = {str(k): v for k, v in e.items()}
      if a.keys() != e.keys():
        return False
      stack.extend((a[k], e[k]) for k in e)
    elif type(a) in (list, dict) or type(e) in (list, dict) or a != e:
      return False
  return True


def values_match(actual: Any, expected: Any) -> bool:
  """Return-value check: equal after tuple->list and str dict keys; ints exactly, floats within 1e-9 (relative)
  or 1e-9 (absolute). Total: any value a program can print compares (False rather than an exception)."""
  try:
    return _match(actual, expected)
  except (RecursionError, OverflowError, ValueError, TypeError, MemoryError):
    return False


def _parse_int(text: str) -> int:
  """json's `parse_int` without the interpreter's 4,300-digit limit on int(str)."""
  try:
    return int(text)
  except ValueError:
    return int(decimal.Decimal(text))


def loads(text: str) -> Any:
  """`json.loads` for program output and ground truth: big integers allowed; raises ValueError for anything
  it cannot decode (too deep included)."""
  try:
    return json.loads(text, parse_int=_parse_int)
  except (RecursionError, MemoryError, OverflowError, decimal.InvalidOperation) as e:
    raise ValueError(f"undecodable JSON: {type(e).__name__}") from None


def _functional_ok(result: ExecResult, nonce: str, expected: Any) -> bool:
  lines = [line for line in result.stdout.split("\n") if line.startswith(nonce)]
  if not lines:
    return False
  try:
    got = loads(lines[-1][len(nonce):])
  except ValueError:
    return False
  # APPS stores a call-based output as a one-element list around the value.
  return values_match(got, expected) or (isinstance(expected, list) and len(expected) == 1
                                         and values_match(got, expected[0]))


def _json_size(value: Any) -> int:
  try:
    return len(json.dumps(value, default=repr))
  except (ValueError, TypeError, RecursionError):  # an int beyond the interpreter's str() limit, say
    return 0


def output_cap(suite: TestSuite) -> int:
  """Bytes of a test run's output kept whole (the program is killed beyond): `OUTPUT_CAP_BYTES`, or 4x the
  largest expected output where that is more."""
  if suite.kind == "stdin":
    largest = max((len(str(o).encode("utf-8", "surrogatepass")) for o in suite.outputs), default=0)
  elif suite.kind == "functional":
    largest = max((_json_size(o) for o in suite.outputs), default=0)
  else:
    largest = 0
  return max(OUTPUT_CAP_BYTES, 4 * largest)


def run_suite(solution: str, suite: TestSuite, executor: Executor) -> SuiteReport:
  """Runs `solution` against every test of `suite` (concurrently, through `executor`).

  Args:
    solution: the candidate program.
    suite: the tests.
    executor: where to run (its `timeout_s` is the per-test limit).

  Returns:
    The `SuiteReport`. Never raises for anything the solution does.
  """
  nonces: list[str] = []
  if suite.kind == "stdin":
    codes = [suite.import_prefix + solution] * suite.total
    stdins = list(suite.inputs)
  elif suite.kind == "functional":
    nonce = f"__agentrl_result_{secrets.token_hex(8)}__"
    codes = [_functional_program(solution, suite, list(args), nonce) for args in suite.inputs]
    stdins = [""] * suite.total
  else:
    runs = [assert_tests.program_for(solution, suite.import_prefix, code, target, suite.entry_point)
            for code, target in zip(suite.tests, suite.targets)]
    codes, stdins, nonces = [r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs]
  results = executor.run_batch(codes, stdins, output_limit_bytes=output_cap(suite))
  outcomes, first, infra = [], "", ""
  for i, r in enumerate(results):
    detail = ""
    if r.status == "sandbox_error":
      outcome, detail = "sandbox_error", r.stderr.strip()[-300:]
    elif suite.kind == "assert":
      outcome, detail = assert_tests.verdict(r, nonces[i])
    elif r.status != "ok":
      outcome = r.status
    elif suite.kind == "stdin":
      outcome = "pass" if stdout_matches(r.stdout, suite.outputs[i]) else "wrong"
    else:
      outcome = "pass" if _functional_ok(r, nonce, suite.outputs[i]) else "wrong"
    outcomes.append(outcome)
    kind = "sandbox" if outcome == "sandbox_error" else assert_tests.INFRA_VERDICTS.get(outcome)
    if kind and not infra:
      infra = f"{kind}: test {i}: {outcome}: {detail}"[:500]
    if outcome != "pass" and not first:
      if not detail:
        detail = (r.stderr.strip().splitlines()[-1:] or [""])[0] if outcome != "wrong" else f"got {r.stdout[-200:]!r}"
      first = f"test {i}: {outcome}" + (f": {detail[:300]}" if detail else "")
  passed = sum(o == "pass" for o in outcomes)
  return SuiteReport(passed, suite.total, tuple(outcomes), first, infra)


def run_tests(solution: str, ground_truth: Any, executor: Executor) -> SuiteReport:
  """`parse_suite` + `run_suite`. Raises ValueError for a malformed ground truth."""
  return run_suite(solution, parse_suite(ground_truth), executor)


