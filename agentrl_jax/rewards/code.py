"""Code reward: the last ```python block of a response, run against the test cases in the sandbox.

    code.score(response, ground_truth_json, executor=executor)
    # RewardResult(score=passed/total, acc=all passed, pred=the code); -1 without code or with a syntax error

Test-case forms: see `agentrl_jax.tools.testcases` (LiveCodeBench stdin/stdout and functional, HumanEval-style
asserts). As in the recipe, only the text after `</think>` is searched when the response has one.
"""

from __future__ import annotations

import atexit
import logging
import re
import threading

from agentrl_jax.rewards.base import RewardResult
from agentrl_jax.tools import testcases
from agentrl_jax.tools.base import Executor, ToolConfig
from agentrl_jax.tools.executors import make_executor
from agentrl_jax.tools import pyast

logger = logging.getLogger(__name__)
_BLOCK_RE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_default_lock = threading.Lock()
_default_executor: Executor | None = None


def extract_code(response: str) -> str | None:
  """The last fenced Python block (after `</think>` when present), or None."""
  if not isinstance(response, str):
    return None
  text = response.rsplit("</think>", 1)[-1] if "</think>" in response else response
  blocks = _BLOCK_RE.findall(text)
  return blocks[-1] if blocks else None


def default_executor() -> Executor:
  """A process-wide local sandbox pool (10 s per test, 1 GiB), built on first use; pass your own to `score`."""
  global _default_executor
  with _default_lock:
    if _default_executor is None:
      _default_executor = make_executor(ToolConfig(backend="local", timeout_s=10.0, memory_mb=1024))
      atexit.register(_default_executor.close)
    return _default_executor


def score(response: str, ground_truth, executor: Executor | None = None) -> RewardResult:
  """Runs the response's code against the ground truth's test cases.

  Args:
    response: the model's response.
    ground_truth: the test cases, a dict or its JSON text (`testcases.parse_suite` forms).
    executor: where to run; None = `default_executor()`.

  Returns:
    RewardResult(score, acc, pred, info, failure): score = passed/total (partial credit, the recipe: every test
    is a separate run whose pass the harness proves), or -1.0 when there is no code block or it does not parse.
    When the reward cannot be computed for a reason outside the response, `failure` says which ('ground_truth':
    malformed tests, or tests that cannot run here; 'sandbox': the executor failed; 'harness': the harness
    cannot run the test) and score is 0.0 with the reason in `info`.
  """
  code = extract_code(response)
  if code is None or not code.strip():
    return RewardResult(-1.0, False, "", "no ```python code block")
  try:
    pyast.parse(code)
  except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
    return RewardResult(-1.0, False, code, f"syntax error: {e}")
  try:
    suite = testcases.parse_suite(ground_truth)
  except ValueError as e:
    logger.warning("code reward: malformed ground truth: %s", e)
    return RewardResult(0.0, False, code, f"malformed ground truth: {e}", failure="ground_truth")
  report = testcases.run_suite(code, suite, executor if executor is not None else default_executor())
  if report.infra:
    kind, _, detail = report.infra.partition(": ")
    return RewardResult(0.0, False, code, f"reward not computed ({kind}): {detail}", failure=kind)
  info = "" if report.all_passed else f"passed {report.passed}/{report.total}; {report.first_failure}"
  return RewardResult(report.passed / report.total, report.all_passed, code, info)
