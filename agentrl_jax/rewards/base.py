"""`RewardResult`, the return type of every reward function."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RewardResult:
  """Outcome reward of one response.

  Attributes:
    score: the reward (math / multiple choice: +1 or -1; code: passed/total, or -1 without runnable code).
    acc: whether the response is fully correct (all tests passed for code).
    pred: the extracted answer (boxed text, option letter or code); '' when none was found.
    info: a short human-readable note (why it failed, a malformed ground truth...); '' when nothing to say.
  """

  score: float
  acc: bool
  pred: str = ""
  info: str = ""
