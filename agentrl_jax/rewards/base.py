"""`RewardResult`, the return type of every reward function, and the kinds of reward that could not be computed."""

from __future__ import annotations

import dataclasses

# Why a reward could not be computed, for reasons outside the response (`RewardResult.failure`):
#   sandbox       the executor could not run the program (down, erroring, a worker died)
#   harness       the test harness broke or cannot run this test (a test handing over its own objects)
#   ground_truth  the row's reference is malformed (unparsable tests, tests that run nothing, a test importing a
#                 module that does not exist, a multiple-choice answer that is no option letter)
#   scorer        the reward function raised
FAILURES = ("sandbox", "harness", "ground_truth", "scorer")


@dataclasses.dataclass(frozen=True)
class RewardResult:
  """Outcome reward of one response.

  Attributes:
    score: the reward (math / multiple choice: +1 or -1; code: passed/total, or -1 without runnable code).
    acc: whether the response is fully correct (all tests passed for code).
    pred: the extracted answer (boxed text, option letter or code); '' when none was found.
    info: a short human-readable note (why it failed, a malformed ground truth...); '' when nothing to say.
    failure: '' when the reward was computed; else one of `FAILURES`: the reward could not be computed for a
      reason outside the response, `score` (0) means nothing, and the trainer leaves the response out of its
      group's advantage and counts it (`reward/infra_failures`).
  """

  score: float
  acc: bool
  pred: str = ""
  info: str = ""
  failure: str = ""

  def __post_init__(self):
    if self.failure and self.failure not in FAILURES:
      raise ValueError(f"RewardResult.failure must be '' or one of {FAILURES}, got {self.failure!r}")
