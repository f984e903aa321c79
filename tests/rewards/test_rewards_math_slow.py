"""Slow property tests (run with `-m slow`): many more random answers through the math and choice rewards."""

from __future__ import annotations

import re
import time

import hypothesis
import pytest
from hypothesis import strategies as st

from agentrl_jax.rewards import latex
from agentrl_jax.rewards import math as math_reward
from agentrl_jax.rewards import multiple_choice

pytestmark = pytest.mark.slow
TOKENS = list("0123456789+-*/^_{}()[],.=!| xyeiab") + [
    "\\frac", "\\dfrac", "\\sqrt", "\\pi", "\\boxed", "\\fbox", "\\text{cm}", "\\infty", "\\cdot", "\\times", "\\",
    "\\{", "\\}", "\\left(", "\\right)", "\\sin", "\\log", "\\binom", "^{", "10^{", "\\$", "\\%", "^\\circ", "9" * 50]
ANSWER = st.lists(st.sampled_from(TOKENS), max_size=150).map("".join)


@hypothesis.settings(max_examples=5000, deadline=None, derandomize=True)
@hypothesis.given(ANSWER, ANSWER)
def test_many_random_answers_are_bounded(a, b):
  start = time.monotonic()
  for mode in ("strict", "equiv"):
    r = math_reward.score(f"so \\boxed{{{a}}}", b, mode=mode)
    assert r.score in (1.0, -1.0)
  if not re.search(r"\d,\d", a + b):  # only the comma readings depend on which side is the ground truth
    assert latex.equivalent(a, b) == latex.equivalent(b, a)
  latex.canonical(a)
  multiple_choice.score(f"\\boxed{{{a}}}", "C")
  assert time.monotonic() - start < 2.0
