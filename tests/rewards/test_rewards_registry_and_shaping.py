"""Reward registry (data_source -> kind) and shaping (overlong penalty, tool-call shaping)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import rewards
from agentrl_jax.rewards import shaping
from agentrl_jax.rewards.registry import RewardConfig, compute_score, kind_for


@pytest.mark.parametrize("source, kind", [
    ("AIME2024", "math"), ("aime_2025", "math"), ("math", "math"), ("math_dapo", "math"), ("deepscaler", "math"),
    ("dapo", "math"), ("DAPO-Math-17k", "math"), ("mega-science", "math"), ("skywork_or1_math", "math"),
    ("gpqa_diamond", "multiple_choice"), ("GPQA", "multiple_choice"),
    ("LiveCodeBench_v6", "code"), ("livecodebench", "code"), ("skywork_or1_code", "code"), ("humaneval", "code"),
])
def test_data_source_to_kind(source, kind):
  assert kind_for(source) == kind


def test_unknown_source_raises_unless_default():
  with pytest.raises(ValueError, match="no reward for data_source 'wikitext'"):
    compute_score("wikitext", "\\boxed{1}", "1")
  cfg = RewardConfig(default_kind="math")
  assert compute_score("wikitext", "\\boxed{1}", "1", cfg=cfg).acc
  assert kind_for("special", RewardConfig(sources=(("special", "multiple_choice"),))) == "multiple_choice"
  with pytest.raises(ValueError, match="default_kind"):
    RewardConfig(default_kind="poetry")
  with pytest.raises(ValueError, match="math_mode"):
    RewardConfig(math_mode="loose")


def test_compute_score_dispatches_and_contains_scorer_crashes():
  assert compute_score("AIME2025", "so \\boxed{033}", "33") == rewards.RewardResult(1.0, True, "033")
  assert not compute_score("AIME2025", "\\boxed{\\frac{66}{2}}", "33", cfg=RewardConfig(math_mode="strict")).acc
  assert compute_score("gpqa_diamond", "\\boxed{(C)}", "C").acc

  def exploding(response, ground_truth, extra_info, executor, cfg):
    raise RuntimeError("scorer bug")

  rewards.register("exploding", exploding)
  try:
    r = compute_score("x", "y", "z", cfg=RewardConfig(default_kind="exploding"))
    assert (r.score, r.failure) == (0.0, "scorer") and "scorer bug" in r.info
    with pytest.raises(ValueError, match="already registered"):
      rewards.register("exploding", lambda *a: None)
  finally:
    rewards.SCORERS.pop("exploding")


def test_a_response_that_crashes_the_scorer_is_a_wrong_answer_not_an_infrastructure_failure():
  """A scorer that raises on one response but scores the probe responses (the ground truth itself, an empty
  response) is working: the response provoked it, and scores as the empty response does."""

  def fragile(response, ground_truth, extra_info, executor, cfg):
    if "((((" in response:
      raise RecursionError("maximum recursion depth exceeded")
    ok = response.strip() == f"\\boxed{{{ground_truth}}}"
    return rewards.RewardResult(1.0 if ok else -1.0, ok)

  rewards.register("fragile", fragile)
  try:
    cfg = RewardConfig(default_kind="fragile")
    assert compute_score("x", "\\boxed{7}", "7", cfg=cfg).acc
    r = compute_score("x", "\\boxed{" + "(" * 5000 + "}", "7", cfg=cfg)
    assert (r.score, r.acc, r.failure) == (-1.0, False, "") and "RecursionError" in r.info
  finally:
    rewards.SCORERS.pop("fragile")


def test_answer_keys_for_voting():
  assert rewards.answer_key("AIME2024", "\\frac{4}{2}") == rewards.answer_key("AIME2024", "2")
  assert rewards.answer_key("gpqa_diamond", " b ") == "B"
  assert rewards.answer_key("livecodebench", "print(1)") is None


def test_overlong_penalty_recipe_values():
  # Recipe: max response 20480 tokens, buffer 4096, factor 1.0 -> expected length 16384.
  for length, penalty in [(0, 0.0), (16384, 0.0), (17408, -0.25), (18432, -0.5), (20480, -1.0)]:
    assert shaping.overlong_penalty(length) == pytest.approx(penalty)
  assert shaping.overlong_penalty(150, max_response_tokens=200, buffer_tokens=100, factor=0.5) == pytest.approx(-0.25)
  assert shaping.overlong_penalty(10 ** 6, buffer_tokens=0) == 0.0
  lengths = np.array([100, 18432, 20480])
  np.testing.assert_allclose(shaping.overlong_penalty(lengths), [0.0, -0.5, -1.0])
  jitted = jax.jit(shaping.overlong_penalty)(jnp.array([16384, 19456]))
  np.testing.assert_allclose(np.asarray(jitted), [0.0, -0.75])


def test_tool_call_shaping_recipe_values():
  assert shaping.tool_call_shaping(-1.0, 0) == -1.0
  assert shaping.tool_call_shaping(-1.0, 2) == pytest.approx(-0.8)
  assert shaping.tool_call_shaping(-1.0, 4) == pytest.approx(-0.6)
  assert shaping.tool_call_shaping(-1.0, 50) == pytest.approx(-0.6)   # capped below any non-negative score
  assert shaping.tool_call_shaping(1.0, 5) == 1.0                     # correct: unchanged
  assert shaping.tool_call_shaping(0.5, 5) == 0.5                     # partial code credit: unchanged
  assert shaping.tool_call_shaping(-1.0, -3) == -1.0
  # The count matters: unlike the reference, the bonus is not silently constant.
  assert len({shaping.tool_call_shaping(-1.0, n) for n in range(5)}) == 5


def _reference_compute_score_shaping(score: float, extra_info: dict) -> float:
  """recipe/demystify/reward.py, lines 172-175 of Gen-Verse/Open-AgentRL, verbatim in effect."""
  num_turns = int(extra_info.get("num_turns", 0))
  if score < 0:
    tool_call_reward = (num_turns - 2) / 2 * 0.1
    score = float(min(-0.6, score + tool_call_reward))
  return score


def test_reference_tool_bonus_is_a_constant_and_ours_is_its_intent():
  # The dapo reward manager passes the row's extra_info without num_turns: every wrong answer gets -1.1.
  assert [_reference_compute_score_shaping(-1.0, {"index": i}) for i in range(5)] == pytest.approx([-1.1] * 5)
  # Had num_turns (user + assistant turns + 1 = 2k + 2 for k calls) arrived, it is 0.1 per call, capped: ours.
  for k in range(8):
    assert shaping.tool_call_shaping(-1.0, k) == pytest.approx(
        _reference_compute_score_shaping(-1.0, {"num_turns": 2 * k + 2}))


def test_shape_composes_tool_shaping_then_overlong():
  cfg = rewards.ShapingConfig()
  assert shaping.shape(-1.0, n_tool_calls=2, response_tokens=18432, cfg=cfg) == pytest.approx(-1.3)
  assert shaping.shape(1.0, n_tool_calls=2, response_tokens=100, cfg=cfg) == 1.0
  off = rewards.ShapingConfig(tool_call_bonus=0.0, overlong_buffer_tokens=0)
  assert shaping.shape(-1.0, n_tool_calls=9, response_tokens=10 ** 6, cfg=off) == -1.0
  with pytest.raises(ValueError, match="overlong_buffer_tokens"):
    rewards.ShapingConfig(max_response_tokens=100, overlong_buffer_tokens=100)
