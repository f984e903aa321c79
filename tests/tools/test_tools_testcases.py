"""Test-case runner: suite parsing in every accepted form, output comparison, and runs in the sandbox."""

from __future__ import annotations

import json

import pytest

from agentrl_jax.tools import assert_tests, testcases
from tests.tools.sandbox_testing import needs_bwrap


def test_parse_stdin_functional_and_assert_forms():
  s = testcases.parse_suite(json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}))
  assert (s.kind, s.total, s.inputs[1], s.outputs[0]) == ("stdin", 2, "3 4\n", "3\n")
  f = testcases.parse_suite({"inputs": ["[1, 2]\n3", "[]\n0"], "outputs": ["[4, 5]", "[]"], "fn_name": "addAll"})
  assert (f.kind, f.fn_name, f.inputs[0], f.outputs[0]) == ("functional", "addAll", [[1, 2], 3], [4, 5])
  apps = testcases.parse_suite({"inputs": [[1, 2]], "outputs": [[3]], "fn_name": "add"})
  assert apps.inputs == ([1, 2],) and apps.outputs == ([3],)
  a = testcases.parse_suite({"test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "inc"})
  assert (a.kind, a.tests, a.entry_point) == ("assert", ("def check(candidate):\n    assert candidate(1) == 2\n",),
                                              "inc")
  # The recipe's KodCode form: one-line asserts are split into one test each (partial credit).
  k = testcases.parse_suite({"import_prefix": "import math\n", "entry_point": "f",
                             "test_code": "def check(candidate):\n    assert candidate(1) == 1\n"
                                          "    assert candidate(2) == 4\n"})
  assert k.total == 2 and k.tests[1] == "def check(candidate):\n    assert candidate(2) == 4"
  nested = testcases.parse_suite({"ground_truth": {"inputs": ["x"], "outputs": ["y"]}})
  assert nested.kind == "stdin"
  lcb = testcases.parse_suite({"test_cases": [{"input": "[1]\n2", "output": "3", "testtype": "functional"}],
                               "func_name": "g"})
  assert (lcb.kind, lcb.fn_name, lcb.inputs[0]) == ("functional", "g", [[1], 2])


def test_split_tests_reads_what_runs_from_the_test_code():
  split = assert_tests.split_tests
  pytest_file = ("from solution import f\n\ndef helper():\n    return 1\n\ndef test_a():\n    assert f() == 1\n\n"
                 "class TestB:\n    def test_c(self):\n        assert f()\n    def other(self):\n        pass\n")
  assert [t for _, t in split(pytest_file, "")] == ["test:test_a", "test:TestB.test_c"]
  assert split("assert f(1) == 2\n", "") == [("assert f(1) == 2\n", "module")]
  calls_itself = "def check(candidate):\n    assert candidate(1)\n\ncheck(f)\n"
  assert split(calls_itself, "") == [(calls_itself, "module")]
  humaneval = "METADATA = {}\n\ndef check(candidate):\n    for x in range(3):\n        assert candidate(x) == x\n"
  assert split(humaneval, "f") == [(humaneval, "check")]
  assert assert_tests.free_names("from solution import g\nimport math\n\ndef test_x(a=1):\n    y = h(a)\n"
                                 "    assert g(y) == math.pi and len(z) == 0\n") == ["h", "z"]


@pytest.mark.parametrize("test, entry, message", [
    ("def check(candidate):\n    assert candidate(1) == 2\n", "", "names no entry_point"),
    ("def check(candidate):\n    pass\n", "f", "asserts nothing"),
    ("x = 1\n", "f", "runs no check"),
    ("def check(candidate:\n", "f", "does not parse"),
])
def test_suites_that_cannot_run_are_malformed(test, entry, message):
  with pytest.raises(ValueError, match=message):
    testcases.parse_suite({"test": test, "entry_point": entry})


@pytest.mark.parametrize("bad, message", [
    ("not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ({"inputs": ["a"], "outputs": ["b", "c"]}, "outputs"),
    ({"inputs": "a", "outputs": "b"}, "must be lists"),
    ({"inputs": [], "outputs": []}, "no test cases"),
    ({"inputs": ["1"], "outputs": ["1"], "fn_name": "not an id"}, "fn_name"),
    ({"something": 1}, "neither"),
    ({"test": "assert True", "entry_point": "1x"}, "entry_point"),
])
def test_parse_rejects_malformed_ground_truth(bad, message):
  with pytest.raises(ValueError, match=message):
    testcases.parse_suite(bad)


def test_stdout_and_value_comparison():
  assert testcases.stdout_matches("3\n", "3")
  assert testcases.stdout_matches("1 2  \n3\n\n", "1 2\n3")
  assert testcases.stdout_matches("0.50 1e2\n", "0.5 100")
  assert not testcases.stdout_matches("3\n4\n", "3")
  assert not testcases.stdout_matches("abc", "abd")
  assert testcases.values_match((1, [2, 3]), [1, [2, 3]])
  assert testcases.values_match(0.1 + 0.2, 0.3)
  assert testcases.values_match({"a": (1,)}, {"a": [1]})
  assert not testcases.values_match([1, 2], [2, 1])
  assert not testcases.values_match("1", 1)


@needs_bwrap
def test_run_suite_stdin(pool):
  suite = testcases.parse_suite({"inputs": ["1 2\n", "5 7\n", "0 0\n"], "outputs": ["3\n", "12\n", "0\n"]})
  good = testcases.run_suite("a, b = map(int, input().split())\nprint(a + b)", suite, pool)
  assert (good.passed, good.total, good.all_passed) == (3, 3, True)
  wrong = testcases.run_suite("a, b = map(int, input().split())\nprint(a * b if a else 0)", suite, pool)
  assert wrong.passed == 1 and wrong.outcomes == ("wrong", "wrong", "pass")
  assert wrong.first_failure.startswith("test 0: wrong")
  crash = testcases.run_suite("raise SystemExit(input())", suite, pool)
  assert crash.passed == 0 and set(crash.outcomes) == {"error"}


@needs_bwrap
def test_run_suite_functional(pool):
  suite = testcases.parse_suite({"inputs": ["[1, 2, 3]\n2", "[]\n5"], "outputs": ["[3, 4, 5]", "[]"],
                                 "fn_name": "addAll"})
  method = ("class Solution:\n  def addAll(self, nums: List[int], k: int) -> List[int]:\n"
            "    print('debug output is fine')\n    return [n + k for n in nums]")
  assert testcases.run_suite(method, suite, pool).all_passed
  function = "def addAll(nums, k):\n  return tuple(n + k for n in nums)"  # tuples compare as lists
  assert testcases.run_suite(function, suite, pool).all_passed
  # A solution that only prints the expected value (no call result) does not pass: results carry a nonce.
  fake = "print('[3, 4, 5]')\ndef addAll(nums, k):\n  raise SystemExit(0)"
  assert testcases.run_suite(fake, suite, pool).passed == 0
  missing = testcases.run_suite("def other():\n  pass", suite, pool)
  assert missing.passed == 0 and "not found" in missing.first_failure


@needs_bwrap
def test_run_suite_assert_with_partial_credit(pool):
  suite = testcases.parse_suite({"entry_point": "square", "import_prefix": "import math\n",
                                 "test_code": "def check(candidate):\n    assert candidate(2) == 4\n"
                                              "    assert candidate(3) == 9\n    assert candidate(-1) == 1\n"})
  report = testcases.run_suite("def square(x):\n  return x * x if x > 0 else math.inf", suite, pool)
  assert (report.passed, report.total) == (2, 3) and report.outcomes[2] == "fail"
  assert report.first_failure.startswith("test 2: fail: line 2: assert candidate(-1) == 1: AssertionError")
