"""Attacks on the code reward, in the real sandbox: every one scores as a wrong answer, honest solutions pass.

Three suites of the same task (add two numbers), one per form (assert, stdin, functional), plus a pytest-style
suite with an exception test. Each attack is a whole solution; `WRONG` is a wrong function some attacks add
their trick to. A blocked attack passes no test: the reward is 0 with acc False and no infrastructure failure.
"""

from __future__ import annotations

import decimal
import json
import math

import pytest

from agentrl_jax.rewards import code as code_reward
from agentrl_jax.tools import assert_tests, testcases
from tests.tools.sandbox_testing import needs_bwrap

ASSERT = {"entry_point": "add", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
                                        "    assert candidate(-1, 1) == 0\n"
                                        "    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-9\n"}
PYTEST = {"test": "import pytest\nfrom solution import safe_div\n\n\n"
                  "def test_value():\n    assert safe_div(6, 3) == 2\n\n\n"
                  "def test_zero():\n    with pytest.raises(ZeroDivisionError):\n        safe_div(1, 0)\n"}
MODULE = {"test": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]}  # MBPP's test_list
STDIN = {"inputs": ["2 3\n", "10 -4\n"], "outputs": ["5\n", "6\n"]}
FUNCTIONAL = {"inputs": ["2\n3", "10\n-4"], "outputs": ["5", "6"], "fn_name": "add"}
# Suites the attacks of part III target: namespaces, objects that decide, checks that never run.
STAR = {"test": "from solution import *\n\n\ndef test_add():\n    assert abs(add(0.5, 0.25) - 0.75) < 1e-9\n"
                "    assert sorted([add(2, 3), 1]) == [1, 5]\n    assert isinstance(add(2, 3), int)\n"}
MATH = {"test": ["assert math.isclose(add(0.1, 0.2), 0.3)"]}  # MBPP: `math` comes from the solution's import
IN = {"entry_point": "divisors", "test": "def check(candidate):\n    assert 3 in candidate(6)\n"
                                         "    assert 2 in candidate(6)\n"}
ASSERT_IN = {"test": "import unittest\nfrom solution import divisors\n\n\nclass TestDivisors(unittest.TestCase):\n"
                     "    def test_in(self):\n        self.assertIn(3, divisors(6))\n"}
SYMMETRIC = {"entry_point": "normalise", "test": "def check(candidate):\n"
                                                 "    assert candidate([3, 1, 2]) == candidate([1, 2, 3])\n"
                                                 "    assert candidate([2, 1]) == candidate([1, 2])\n"}
MAP = {"entry_point": "add", "test": "def check(candidate):\n"
                                     "    assert all(map(lambda p: candidate(*p) == p[0] + p[1], [(2, 3), (-1, 1)]))\n"}
ZIP = {"entry_point": "add", "test": "def check(candidate):\n"
                                     "    got = map(lambda p: candidate(*p), [(2, 3), (-1, 1)])\n"
                                     "    for g, want in zip(got, [5, 0]):\n        assert g == want\n"}
MUTATE = {"entry_point": "sort_list", "test": "def check(candidate):\n    xs = [3, 1, 2]\n"
                                              "    assert candidate(xs) == sorted(xs)\n"}
LOOP = {"entry_point": "divisors", "test": "def check(candidate):\n    for d in candidate(12):\n"
                                           "        assert 12 % d == 0\n"}
SORT_KEY = {"entry_point": "words", "test": "def check(candidate):\n    r = candidate('bb a')\n    r.sort(key=len)\n"
                                            "    assert r == ['a', 'bb']\n"}
MAIN_ASSERTS = {"test": "if __name__ == '__main__':\n    assert add(2, 3) == 5\n    assert add(-1, 1) == 0\n"}
MAIN_CHECK = {"test": "def check(f):\n    assert f(2, 3) == 5\n    assert f(-1, 1) == 0\n\n\n"
                      "if __name__ == '__main__':\n    check(add)\n"}
ASYNC = {"test": "from solution import add\n\n\nasync def test_add():\n    assert add(2, 3) == 5\n"}
GENERATOR = {"test": "from solution import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n    yield\n"}
NOSE = {"test": "from solution import add\n\n\ndef check_sum(a, b, want):\n    assert add(a, b) == want\n\n\n"
                "def test_sums():\n    for a, b, want in [(2, 3, 5), (-1, 1, 0)]:\n"
                "        yield check_sum, a, b, want\n"}
OWN_HELPER = {"test": "def expected(a, b):\n    return a + b\n\n\nfrom solution import *\n\n\ndef test_add():\n"
                      "    assert add(2, 3) == expected(2, 3)\n"}
SUITES = {"own_helper": OWN_HELPER, "assert": ASSERT, "pytest": PYTEST, "module": MODULE, "stdin": STDIN,
          "functional": FUNCTIONAL,
          "star": STAR, "math": MATH, "in": IN, "assert_in": ASSERT_IN, "symmetric": SYMMETRIC, "map": MAP,
          "zip": ZIP, "mutate": MUTATE, "loop": LOOP, "sort_key": SORT_KEY, "main_asserts": MAIN_ASSERTS,
          "main_check": MAIN_CHECK, "async": ASYNC, "generator": GENERATOR, "nose": NOSE}

WRONG = "def add(a, b):\n    return a - b\n\ndef safe_div(a, b):\n    return a // b + 1\n"
WRONG_STDIN = "a, b = map(int, input().split())\nprint(a - b)\n"
_STEAL = """
import os, sys, glob
found = []
for path in ['/proc/1/fd/0', '/proc/1/mem', '/proc/1/environ', '/proc/1/cmdline', '/proc/self/fd/0',
             '/tmp/main.py'] + glob.glob('/proc/*/fd/*') + glob.glob('/tmp/*'):
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # pipes too (their own): never block
    try:
      found.append(os.read(fd, 1 << 16))
    finally:
      os.close(fd)
  except Exception:
    pass
try:
  os.set_blocking(0, False)
  found.append(os.read(0, 1 << 16))
except Exception:
  pass
found.append(repr(dict(os.environ)).encode())
blob = b''.join(found)
"""

# Where the sandbox runs as the host's own uid (a normal user), stdout's pipe can be reopened for reading: a
# daemon of the solution's races the host for the tester's verdict line and writes a pass of its own.
_RACE = """
import os, re, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        try:
            fd = os.open('/proc/self/fd/1', os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            os._exit(0)
        buf, deadline = b'', time.time() + 8
        while time.time() < deadline:
            try:
                buf += os.read(fd, 65536)
            except BlockingIOError:
                time.sleep(0.0005)
            for line in re.findall(rb'agentrl-verdict[^\\n]*', buf):
                forged = line.replace(b'"fail"', b'"pass"')
                for _ in range(3):
                    os.write(1, b'\\n' + forged + b'\\n')
                os._exit(0)
        os._exit(0)
    os._exit(0)
"""

ATTACKS = {
    # ---- exits before, after or instead of the checks
    "assert/os._exit at import": ("assert", "import os\nos._exit(0)\n"),
    "assert/sys.exit at import": ("assert", "import sys\nsys.exit(0)\n"),
    "assert/raise SystemExit": ("assert", "raise SystemExit(0)\n"),
    "assert/wrong function then exit()": ("assert", WRONG + "exit()\n"),
    "assert/atexit forces exit 0": ("assert", WRONG + "import atexit, os\natexit.register(lambda: os._exit(0))\n"),
    "assert/excepthook exits 0": ("assert", WRONG + "import sys, os\nsys.excepthook = lambda *a: os._exit(0)\n"),
    "assert/settrace exits on AssertionError": ("assert", WRONG + (
        "import sys, os, threading\n"
        "def tr(frame, event, arg):\n"
        "    if event == 'exception' and issubclass(arg[0], AssertionError):\n        os._exit(0)\n    return tr\n"
        "sys.settrace(tr)\nthreading.settrace(tr)\n")),
    "assert/os._exit inside the call": ("assert", "import os\ndef add(a, b):\n    os._exit(0)\n"),
    "assert/SystemExit inside the call": ("assert", "def add(a, b):\n    raise SystemExit(0)\n"),
    "pytest/exit where an exception is expected": ("pytest", "import os\ndef safe_div(a, b):\n    if b == 0:\n"
                                                             "        os._exit(0)\n    return a / b + 1\n"),
    "module/os._exit at import": ("module", "import os\nos._exit(0)\n"),
    # ---- comparisons decided by the solution's objects
    "assert/__eq__ always true": ("assert", "class A:\n    def __eq__(self, o):\n        return True\n"
                                            "    def __sub__(self, o):\n        return self\n"
                                            "    def __abs__(self):\n        return 0\n    __hash__ = object.__hash__\n"
                                            "def add(a, b):\n    return A()\n"),
    "assert/int subclass whose __eq__ is true": ("assert", "class I(int):\n    def __eq__(self, o):\n"
                                                           "        return True\n    __hash__ = int.__hash__\n"
                                                           "def add(a, b):\n    return I(99)\n"),
    "module/list subclass whose __eq__ is true": ("module", "class L(list):\n    def __eq__(self, o):\n"
                                                            "        return True\n"
                                                            "def add(a, b):\n    return L([0])\n"),
    # ---- patching what the checks use
    "assert/patched builtins": ("assert", WRONG + "import builtins\nbuiltins.abs = lambda x: 0\n"
                                          "builtins.AssertionError = type('X', (Exception,), {})\n"
                                          "builtins.len = lambda x: 0\n"),
    "assert/own check() and defused assert": ("assert", WRONG + "def check(candidate):\n    pass\n"
                                                        "__builtins__.__dict__['__debug__'] = False\n"),
    "assert/gc walk patching every check function": ("assert", WRONG + (
        "import gc\nfor o in gc.get_objects():\n"
        "    if callable(o) and getattr(o, '__name__', '') in ('check', '_run', '_run_target', '_verdict'):\n"
        "        try:\n            o.__code__ = (lambda *a, **k: None).__code__\n        except Exception:\n"
        "            pass\n")),
    # ---- the tester process, its signals and its output
    "assert/kill the parent and pid 1": ("assert", WRONG + "import os, signal\nfor p in (os.getppid(), 1):\n"
                                                   "    try:\n        os.kill(p, signal.SIGKILL)\n"
                                                   "    except OSError:\n        pass\n"),
    "assert/kill the process group": ("assert", WRONG + "import os, signal\nos.killpg(0, signal.SIGKILL)\n"),
    "assert/signals to the tester during a call": ("assert", "import os, signal\ndef add(a, b):\n"
                                                            "    for s in (signal.SIGINT, signal.SIGTERM,"
                                                            " signal.SIGUSR1, signal.SIGSTOP, signal.SIGHUP):\n"
                                                            "        try:\n            os.kill(1, s)\n"
                                                            "        except OSError:\n            pass\n"
                                                            "    return a - b\n"),
    "assert/forged verdict lines then exit": ("assert", (
        "import os, re\nsrc = open('/tmp/main.py').read()\n"
        "for n in ['agentrl-verdict-' + '0' * 32] + re.findall(r'agentrl-verdict-[0-9a-f]*', src):\n"
        "    print('\\n' + n + ' ' + '{\"outcome\": \"pass\", \"detail\": \"\"}')\n"
        "print('{\"outcome\": \"pass\"}')\nos._exit(0)\n")),
    "assert/steal the nonce from /proc, stdin, files, environ": ("assert", _STEAL + (
        "import re\nfor n in set(re.findall(rb'agentrl-verdict-[0-9a-f]{32}', blob)):\n"
        "    os.write(1, b'\\n' + n + b' {\"outcome\": \"pass\", \"detail\": \"\"}\\n')\n" + WRONG)),
    "assert/a grandchild reads the verdict off /proc/self/fd/1 and forges a pass": ("assert", _RACE + WRONG),
    "assert/ptrace the tester": ("assert", WRONG + (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.ptrace(16, 1, 0, 0) != 0  # PTRACE_ATTACH is refused: the tester is not dumpable\n")),
    "assert/close stdout and stderr": ("assert", WRONG + "import os\nos.close(1)\nos.close(2)\n"),
    "assert/fork many servers": ("assert", WRONG + "import os\nfor _ in range(20):\n    try:\n        os.fork()\n"
                                                  "    except OSError:\n        break\n"),
    "assert/impersonate a sandbox failure": ("assert", WRONG + (
        "import sys, os\nsys.stderr.write('[sandbox] bubblewrap failed (exit 1); the program did not run\\n')\n"
        "sys.stderr.flush()\nos._exit(71)\n")),
    "assert/a reply too large to carry": ("assert", "def add(a, b):\n    return 'x' * (70 << 20)\n"),
    "assert/a reply nested too deeply": ("assert", "def add(a, b):\n    x = []\n    for _ in range(10000):\n"
                                                   "        x = [x]\n    return x\n"),
    # ---- standard input / output
    "stdin/exit 0 without output": ("stdin", "import os\nos._exit(0)\n"),
    "stdin/atexit prints after a crash": ("stdin", "import atexit\natexit.register(print, 5)\nraise ValueError\n"),
    "stdin/steal expected output": ("stdin", _STEAL + "import sys\nsys.stdout.write(blob.decode('latin-1')[:100])\n"),
    "stdin/flood the output": ("stdin", "import sys\nsys.stdout.write('5\\n' * 10_000_000)\n"),
    "stdin/kill the parent": ("stdin", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(0)\n"),
    # ---- functional (call-based)
    "functional/os._exit at import": ("functional", "import os\nos._exit(0)\n"),
    "functional/forge the result line from the program text": ("functional", (
        "import re, os\nsrc = open('/tmp/main.py').read()\nn = re.findall(r'__agentrl_result_[0-9a-f]+__', src)[0]\n"
        "print(n + '99')\nos._exit(0)\n")),
    "functional/__eq__ always true": ("functional", "class A:\n    def __eq__(self, o):\n        return True\n"
                                                    "def add(a, b):\n    return A()\n"),
    "functional/int subclass whose __eq__ is true": ("functional", "class I(int):\n    def __eq__(self, o):\n"
                                                                   "        return True\n"
                                                                   "def add(a, b):\n    return I(a - b)\n"),
    "functional/SystemExit in the call": ("functional", "def add(a, b):\n    raise SystemExit(0)\n"),
    # ---- part III: the solution's namespace reaching the test
    "star/builtins shadowed through a star import": ("star", WRONG + (
        "def abs(x):\n    return 0\ndef sorted(x):\n    return [1, 5]\ndef isinstance(*a):\n    return True\n")),
    "star/isinstance shadowed (was an 'unsupported' verdict)": ("star", WRONG + (
        "def isinstance(*a):\n    return True\n")),
    "own_helper/a star import replacing the test's own helper": ("own_helper", WRONG + (
        "def expected(a, b):\n    return a - b\n")),
    "math/a math object of its own": ("math", WRONG + "class M:\n    @staticmethod\n    def isclose(a, b):\n"
                                                      "        return True\nmath = M()\n"),
    "math/the real math module patched": ("math", WRONG + "import math\nmath.isclose = lambda *a, **k: True\n"),
    "math/a module the tester cannot import": ("math", WRONG + "import types\nmath = types.ModuleType('nope_xyz')\n"
                                                                "math.isclose = lambda *a, **k: True\n"),
    # ---- part III: the solution's objects deciding
    "in/__contains__ always true": ("in", "class E:\n    def __contains__(self, x):\n        return True\n"
                                          "def divisors(n):\n    return E()\n"),
    "assert_in/assertIn on an object that contains everything": ("assert_in", (
        "class E:\n    def __contains__(self, x):\n        return True\n    def __iter__(self):\n"
        "        return iter([])\ndef divisors(n):\n    return E()\n")),
    "symmetric/one object for every call": ("symmetric", "O = object()\ndef normalise(xs):\n    return O\n"),
    "symmetric/a list around one object": ("symmetric", "O = object()\ndef normalise(xs):\n    return [O]\n"),
    "map/StopIteration ends all(map(...))": ("map", "def add(a, b):\n    raise StopIteration\n"),
    "zip/StopIteration ends zip(map(...))": ("zip", "def add(a, b):\n    raise StopIteration\n"),
    "mutate/empties its argument before the expected side is computed": (
        "mutate", "def sort_list(xs):\n    xs.clear()\n    return []\n"),
    "loop/an empty result skips the test's loop": ("loop", "def divisors(n):\n    return []\n"),
    "sort_key/a result whose method gets the test's callable": ("sort_key", (
        "class W:\n    def sort(self, key=None):\n        pass\ndef words(s):\n    return W()\n")),
    # ---- part III: checks that never ran
    "main_asserts/asserts under __main__": ("main_asserts", WRONG),
    "main_check/check(f) under __main__": ("main_check", WRONG),
    "async/async test never awaited": ("async", WRONG),
    "generator/generator test never iterated": ("generator", WRONG),
    "nose/yield-style test never iterated": ("nose", WRONG),
    # ---- part III: wrong answers the host could not compare
    "functional/10**400 (OverflowError in math.isclose)": ("functional", "def add(a, b):\n    return 10 ** 400\n"),
    "functional/a list nested 980 deep": ("functional", "def add(a, b):\n    x = []\n    for _ in range(980):\n"
                                                        "        x = [x]\n    return x\n"),
    "functional/deeply nested JSON after the result line": ("functional", (
        "import atexit, re, sys\nnonce = re.findall(r'__agentrl_result_[0-9a-f]+__', open('/tmp/main.py').read())[0]\n"
        "atexit.register(lambda: sys.stdout.write('\\n' + nonce + '[' * 100000 + ']' * 100000 + '\\n'))\n"
        "def add(a, b):\n    return a - b\n")),
    "functional/an integer of 100,000 digits": ("functional", "def add(a, b):\n    return 7 ** 120000\n"),
    "stdin/a number of 100,000 digits": ("stdin", "print('9' * 100000)\n"),
}


@needs_bwrap
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_blocked(pool, name):
  form, solution = ATTACKS[name]
  r = code_reward.score(f"```python\n{solution}```", json.dumps(SUITES[form]), executor=pool)
  assert (r.acc, r.failure) == (False, ""), r.info
  assert r.score == 0.0, r.info


HONEST = {
    "assert/plain": ("assert", "def add(a, b):\n    print('debugging output is fine')\n    return a + b\n"),
    "assert/numpy result": ("assert", "import numpy as np\ndef add(a, b):\n    return np.float64(a) + np.float64(b)\n"),
    "pytest/value and exception": ("pytest", "def safe_div(a, b):\n    return a / b\n"),
    "module/MBPP asserts": ("module", "def add(a, b):\n    return a + b\n"),
    "stdin/plain": ("stdin", "a, b = map(int, input().split())\nprint(a + b)\n"),
    "functional/top-level": ("functional", "def add(a, b):\n    return a + b\n"),
    "functional/Solution class": ("functional", "class Solution:\n    def add(self, a: int, b: int) -> int:\n"
                                                "        return a + b\n"),
    "assert/__main__ block and sys.exit inside it": ("assert", "def add(a, b):\n    return a + b\n\n"
                                                               "if __name__ == '__main__':\n    print(add(1, 2))\n"),
    # ---- part III
    "pytest/__main__ demo calling input()": ("pytest", "def safe_div(a, b):\n    return a / b\n\n"
                                                       "if __name__ == '__main__':\n    a = int(input())\n"
                                                       "    print(safe_div(a, 2))\n"),
    "star/star import": ("star", "def add(a, b):\n    return a + b\n"),
    "own_helper/the test's own helper above a star import": ("own_helper", "def add(a, b):\n    return a + b\n"),
    "math/math imported by the solution": ("math", "import math\ndef add(a, b):\n    return a + b\n"),
    "math/math never imported": ("math", "def add(a, b):\n    return a + b\n"),
    "in/membership in a returned list": ("in", "def divisors(n):\n"
                                               "    return [d for d in range(1, n + 1) if n % d == 0]\n"),
    "assert_in/assertIn": ("assert_in", "def divisors(n):\n    return {d for d in range(1, n + 1) if n % d == 0}\n"),
    "symmetric/sorted results": ("symmetric", "def normalise(xs):\n    return sorted(xs)\n"),
    "map/checks inside map": ("map", "def add(a, b):\n    return a + b\n"),
    "zip/checks over zip": ("zip", "def add(a, b):\n    return a + b\n"),
    "mutate/sorted copy": ("mutate", "def sort_list(xs):\n    return sorted(xs)\n"),
    "mutate/sorts in place and returns it": ("mutate", "def sort_list(xs):\n    xs.sort()\n    return xs\n"),
    "loop/loop over the result": ("loop", "def divisors(n):\n    return [d for d in range(1, n + 1) if n % d == 0]\n"),
    "sort_key/sorting a returned list": ("sort_key", "def words(s):\n    return s.split()\n"),
    "main_asserts/asserts under __main__": ("main_asserts", "def add(a, b):\n    return a + b\n"),
    "main_check/check(f) under __main__": ("main_check", "def add(a, b):\n    return a + b\n"),
    "async/async test": ("async", "def add(a, b):\n    return a + b\n"),
    "generator/generator test": ("generator", "def add(a, b):\n    return a + b\n"),
    "nose/yield-style test": ("nose", "def add(a, b):\n    return a + b\n"),
}


@needs_bwrap
@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_solution_passes(pool, name):
  form, solution = HONEST[name]
  r = code_reward.score(f"```python\n{solution}```", json.dumps(SUITES[form]), executor=pool)
  assert (r.score, r.acc, r.failure) == (1.0, True, ""), r.info


@needs_bwrap
def test_partial_credit_counts_each_proven_test(pool):
  half = "def add(a, b):\n    return a + b if a > 0 else 99\n"  # right on tests 0 and 2 of three
  r = code_reward.score(f"```python\n{half}```", ASSERT, executor=pool)
  assert (round(r.score, 4), r.acc) == (0.6667, False) and "passed 2/3" in r.info
  stdin = code_reward.score("```python\nprint(5)\n```", STDIN, executor=pool)
  assert (stdin.score, stdin.acc) == (0.5, False)


@needs_bwrap
def test_the_solution_never_sees_the_test(pool):
  # What the test code holds (its expected values) is readable by no channel the solution has.
  marker = "expected_value_marker_41"
  suite = testcases.parse_suite({"entry_point": "f", "test": f"def check(candidate):\n    {marker} = 1\n"
                                                             "    assert candidate() == 1\n"})
  solution = _STEAL + "print(repr(blob)[:10 ** 6])\ndef f():\n    return 1\n"
  program, stdin, key = assert_tests.program_for(solution, "", suite.tests[0], suite.targets[0], "f")
  result = pool.submit(program, stdin=stdin).result()
  assert assert_tests.verdict(result, key)[0] == "pass"
  assert marker not in result.stdout and key not in result.stdout  # the verdict line carries a MAC, not the key


# A class-based test (KodCode's pytest files import from `solution`), in-place mutation, parametrize, unittest.
RICHER = {
    "linked list through handles": (
        {"test": "from solution import ListNode, reverse\n\n\ndef to_list(node):\n    out = []\n    while node:\n"
                 "        out.append(node.val)\n        node = node.next\n    return out\n\n\n"
                 "def test_reverse():\n    head = ListNode(1, ListNode(2, ListNode(3)))\n"
                 "    assert to_list(reverse(head)) == [3, 2, 1]\n    assert reverse(None) is None\n"},
        "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n\n"
        "def reverse(head):\n    prev = None\n    while head:\n        head.next, prev, head = prev, head, head.next\n"
        "    return prev\n",
        "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n\n"
        "def reverse(head):\n    return head\n"),
    "in-place mutation": (
        {"entry_point": "sort_in_place", "test": "def check(candidate):\n    xs = [3, 1, 2]\n"
                                                 "    assert candidate(xs) is None\n    assert xs == [1, 2, 3]\n"},
        "def sort_in_place(xs):\n    xs.sort()\n",
        "def sort_in_place(xs):\n    return sorted(xs)\n"),
    "parametrize": (
        {"test": "import pytest\nfrom solution import square\n\n\n@pytest.mark.parametrize('x, y', [(2, 4), (-3, 9),"
                 " pytest.param(0, 0)])\ndef test_square(x, y):\n    assert square(x) == y\n"},
        "def square(x):\n    return x * x\n",
        "def square(x):\n    return abs(x) * 2\n"),
    "unittest": (
        {"test": "import unittest\n\n\nclass TestSquare(unittest.TestCase):\n    def setUp(self):\n"
                 "        self.xs = [1, 2, 3]\n\n    def test_values(self):\n"
                 "        self.assertEqual([square(x) for x in self.xs], [1, 4, 9])\n\n"
                 "    def test_error(self):\n        with self.assertRaises(TypeError):\n            square('a')\n"},
        "def square(x):\n    return x * x\n",
        "def square(x):\n    return x + x\n"),
    # Honest solutions that failed before part III.
    "stdout over 64 KiB": (
        {"inputs": ["20000\n"], "outputs": ["\n".join(map(str, range(1, 20001))) + "\n"]},
        "n = int(input())\nprint('\\n'.join(map(str, range(1, n + 1))))\n",
        "n = int(input())\nprint('\\n'.join(map(str, range(1, n))))\n"),
    "functional result of 108 KiB": (
        {"inputs": ["20000"], "outputs": [json.dumps(list(range(20000)))], "fn_name": "upto"},
        "def upto(n):\n    return list(range(n))\n",
        "def upto(n):\n    return list(range(n - 1)) + [0]\n"),
    "an integer of 5,736 digits": (
        {"inputs": ["2000"], "outputs": [format(decimal.Decimal(math.factorial(2000)), "f")], "fn_name": "fact"},
        "import math\ndef fact(n):\n    return math.factorial(n)\n",
        "import math\ndef fact(n):\n    return math.factorial(n) + 1\n"),
    "pytest.raises(SolutionDefinedError)": (
        {"test": "import pytest\nfrom solution import parse, ParseError, BadInput\n\n\ndef test_bad():\n"
                 "    with pytest.raises(ParseError):\n        parse('x')\n\n\ndef test_base_class():\n"
                 "    with pytest.raises(BadInput):\n        parse('x')\n\n\ndef test_ok():\n"
                 "    assert parse('3') == 3\n"},
        "class BadInput(ValueError):\n    pass\n\nclass ParseError(BadInput):\n    pass\n\ndef parse(s):\n"
        "    if not s.isdigit():\n        raise ParseError(s)\n    return int(s)\n",
        "class BadInput(ValueError):\n    pass\n\nclass ParseError(BadInput):\n    pass\n\ndef parse(s):\n"
        "    if not s.isdigit():\n        raise BadInput(s)\n    return int(s)\n"),
    "unittest setUpClass and tearDownClass": (
        {"test": "import unittest\nfrom solution import square\n\n\nclass TestSquare(unittest.TestCase):\n"
                 "    @classmethod\n    def setUpClass(cls):\n        cls.cases = [(2, 4), (-3, 9)]\n\n"
                 "    @classmethod\n    def tearDownClass(cls):\n        del cls.cases\n\n"
                 "    def test_values(self):\n        for x, y in self.cases:\n"
                 "            self.assertEqual(square(x), y)\n"},
        "def square(x):\n    return x * x\n",
        "def square(x):\n    return x * 2\n"),
    "pytest setup_module and setup_class": (
        {"test": "from solution import square\n\nCASES = []\n\n\ndef setup_module(module):\n"
                 "    CASES.append((2, 4))\n\n\nclass TestSquare:\n    def setup_class(cls):\n"
                 "        cls.more = [(-3, 9)]\n\n    def test_values(self):\n"
                 "        for x, y in CASES + self.more:\n            assert square(x) == y\n"},
        "def square(x):\n    return x * x\n",
        "def square(x):\n    return x * 2\n"),
    "in place, returning a length": (
        {"entry_point": "dedup", "test": "def check(candidate):\n    nums = [1, 1, 2, 3, 3]\n    k = candidate(nums)\n"
                                         "    assert k == 3\n    assert nums[:k] == [1, 2, 3]\n"},
        "def dedup(nums):\n    out = sorted(set(nums))\n    nums[:len(out)] = out\n    return len(out)\n",
        "def dedup(nums):\n    return len(set(nums))\n"),
    "membership in an iterable object of the solution's": (
        {"test": "from solution import Trie\n\n\ndef test_trie():\n    t = Trie()\n    t.insert('app')\n"
                 "    assert 'app' in t\n    assert 'ap' not in t\n"},
        "class Trie:\n    def __init__(self):\n        self.words = set()\n    def insert(self, w):\n"
        "        self.words.add(w)\n    def __contains__(self, w):\n        return w in self.words\n"
        "    def __iter__(self):\n        return iter(sorted(self.words))\n",
        "class Trie:\n    def insert(self, w):\n        pass\n    def __contains__(self, w):\n        return True\n"
        "    def __iter__(self):\n        return iter(['ap'])\n"),
}


@needs_bwrap
@pytest.mark.parametrize("name", sorted(RICHER))
def test_richer_test_styles(pool, name):
  truth, good, bad = RICHER[name]
  r = code_reward.score(f"```python\n{good}```", truth, executor=pool)
  assert (r.score, r.acc, r.failure) == (1.0, True, ""), r.info
  r = code_reward.score(f"```python\n{bad}```", truth, executor=pool)
  assert (r.acc, r.failure) == (False, "") and r.score < 1.0, r.info


MALFORMED = {
    "check without an entry point": ({"test": "def check(candidate):\n    assert candidate(1) == 2\n"}, "ground_truth"),
    "test that does not parse": ({"test": "def check(candidate:\n", "entry_point": "f"}, "ground_truth"),
    "test that runs nothing": ({"test": "x = 1\ndef helper():\n    return 2\n"}, "ground_truth"),
    "import of a module that does not exist": ({"test": "import no_such_module_anywhere\n\n\ndef test_f():\n"
                                                        "    assert f() == 1\n"}, "ground_truth"),
    "test handing over its own function": ({"entry_point": "f", "test": "def check(candidate):\n"
                                                                       "    assert candidate(lambda v: v + 1) == 2\n"},
                                           "harness"),
    "pytest fixture": ({"test": "def test_f(tmp_path):\n    assert f() == 1\n"}, "harness"),
    "a test that runs no check": ({"test": "from solution import f\n\n\ndef test_f():\n    for x in []:\n"
                                           "        assert f() == x\n"}, "ground_truth"),
    "a skipped test": ({"test": "import pytest\nfrom solution import f\n\n\n@pytest.mark.skip(reason='later')\n"
                                "def test_f():\n    assert f() == 1\n"}, "ground_truth"),
    "a helper only the solution could supply": ({"entry_point": "f", "test": "def check(candidate):\n"
                                                                            "    assert candidate(helper(1)) == 1\n"},
                                                "ground_truth"),
}


@needs_bwrap
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_tests_that_cannot_run_are_counted_not_passed(pool, name):
  truth, failure = MALFORMED[name]
  r = code_reward.score("```python\ndef f(g=None):\n    return 1 if g is None else g(1)\n```", truth, executor=pool)
  assert (r.acc, r.score, r.failure) == (False, 0.0, failure), r.info
