"""A sanity task for the RL machinery: the reward is the fraction of digits in the response text.

A randomly initialised model already scores above zero, every group of samples has unequal rewards, and any
working policy-gradient loop raises the score within a few steps. So a short seeded run on this task checks the
whole trainer (rollout -> reward -> advantages -> update -> checkpoint) in seconds on a CPU, without first
teaching a model a format. It says nothing about reasoning; the arithmetic task is the real embedded task.
"""

from __future__ import annotations

import re

from agentrl_jax import rewards
from agentrl_jax.rewards.base import RewardResult

DATA_SOURCE = "toy_digits"
KIND = "digit_fraction"
_MARKUP = re.compile(r"<\|[^|]*\|>|</?tool_call>|</?tool_response>|</?think>")


def score(response: str, ground_truth=None, extra_info=None, executor=None, cfg=None) -> RewardResult:
  """Fraction of the response's visible characters (chat markup removed) that are digits; acc = above 1/2."""
  del ground_truth, extra_info, executor, cfg
  text = _MARKUP.sub("", response)
  frac = sum(c.isdigit() for c in text) / max(len(text), 1)
  return RewardResult(frac, frac > 0.5, "")


def rl_rows(n: int) -> list[dict]:
  """n prompts in the recipe's RL parquet schema."""
  return [{"prompt": [{"role": "user", "content": f"Write digits ({i})."}], "data_source": DATA_SOURCE,
           "reward_model": {"style": "rule", "ground_truth": "digits"}, "extra_info": {"index": i}}
          for i in range(n)]


def write_rl_parquet(path: str, n: int) -> str:
  import pandas as pd

  pd.DataFrame(rl_rows(n)).to_parquet(path)
  return path


if KIND not in rewards.SCORERS:
  rewards.register(KIND, score)
