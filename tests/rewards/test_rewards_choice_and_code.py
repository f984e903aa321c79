"""Multiple-choice and code rewards."""

from __future__ import annotations

import time

import hypothesis
import pytest
from hypothesis import strategies as st

from agentrl_jax.rewards import code as code_reward
from agentrl_jax.rewards import multiple_choice
from tests.tools.sandbox_testing import needs_bwrap

PROPERTY = hypothesis.settings(max_examples=300, deadline=None, derandomize=True)


@pytest.mark.parametrize("boxed, letter", [
    ("B", "B"), ("(B)", "B"), ("B.", "B"), ("B)", "B"), ("[C]", "C"), ("\\text{B}", "B"), ("\\textbf{(D)}", "D"),
    ("\\mathrm{A}", "A"), ("\\text{\\textbf{C}}", "C"), ("B: 42 J", "B"), ("(A) 3.2 eV", "A"), ("Option C", "C"),
    ("answer: D", "D"), ("b", "B"), ("$C$", "C"),
    ("42", None), ("AB", None), ("a + b", None), ("x = 2", None), ("", None), ("\\frac{1}{2}", None),
    # Exactly one option letter: naming a second one is no answer.
    ("B and C", None), ("(B) or (C)", None), ("B C D", None), ("B, C", None), ("B/C", None), ("b and c", None),
    ("\\text{B or C}", None), ("C. 5 A", "C"), ("B and B", "B"),
])
def test_choice_letter(boxed, letter):
  assert multiple_choice.choice_letter(boxed) == letter


def test_multiple_choice_score():
  assert multiple_choice.score("Thus \\boxed{\\text{(B)}}.", "B") == multiple_choice.RewardResult(1.0, True, "B")
  assert multiple_choice.score("\\boxed{B}", "(B)").acc
  r = multiple_choice.score("\\boxed{C}", "B")
  assert (r.score, r.acc, r.pred) == (-1.0, False, "C")
  assert multiple_choice.score("I pick B", "B").score == -1.0           # the letter must be boxed
  assert multiple_choice.score("\\boxed{42}", "B").info.startswith("boxed answer")
  assert not multiple_choice.score("\\boxed{B} or \\boxed{C}", "B").acc  # boxes answering together: a hedge
  assert multiple_choice.score("First \\boxed{C}. On reflection the answer is \\boxed{B}", "B").acc
  bad = multiple_choice.score("\\boxed{B}", "forty-two")
  assert bad.score == 0.0 and "not an option letter" in bad.info         # a data error, not the model's
  assert bad.failure == "ground_truth"


@PROPERTY
@hypothesis.given(st.text(max_size=300), st.text(max_size=5))
def test_multiple_choice_never_raises(response, truth):
  start = time.monotonic()
  r = multiple_choice.score(response, truth)
  assert r.score in (1.0, -1.0, 0.0)
  r = multiple_choice.score("\\boxed{" + response + "}", truth)
  assert time.monotonic() - start < 2.0


def test_extract_code():
  text = "```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```"
  assert code_reward.extract_code(text) == "print(2)\n"
  assert code_reward.extract_code("<think>```python\nx=1\n```</think>no code") is None  # only after </think>
  assert code_reward.extract_code("<think>draft</think>```python\nx=2\n```") == "x=2\n"
  assert code_reward.extract_code("```\nprint(3)\n```") is None          # the recipe requires ```python
  assert code_reward.extract_code("```py\nprint(4)\n```") == "print(4)\n"
  assert code_reward.extract_code(None) is None


@needs_bwrap
def test_code_score_partial_credit_and_recipe_penalties(pool):
  tests = {"inputs": ["1\n", "2\n", "3\n", "4\n"], "outputs": ["1\n", "4\n", "9\n", "16\n"]}
  full = code_reward.score("```python\nn = int(input())\nprint(n * n)\n```", tests, executor=pool)
  assert (full.score, full.acc, full.info) == (1.0, True, "")
  half = code_reward.score("```python\nn = int(input())\nprint(n * n if n % 2 else n)\n```", tests, executor=pool)
  assert (half.score, half.acc) == (0.5, False) and "passed 2/4" in half.info
  none = code_reward.score("I would write a loop.", tests, executor=pool)
  assert (none.score, none.acc) == (-1.0, False)
  syntax = code_reward.score("```python\ndef f(:\n```", tests, executor=pool)
  assert (syntax.score, syntax.acc) == (-1.0, False) and "syntax error" in syntax.info
  crash = code_reward.score("```python\nraise SystemExit(1)\n```", tests, executor=pool)
  assert (crash.score, crash.acc) == (0.0, False)
  malformed = code_reward.score("```python\nprint(1)\n```", "{not json", executor=pool)
  assert malformed.score == 0.0 and "malformed ground truth" in malformed.info


@needs_bwrap
@hypothesis.settings(max_examples=12, deadline=None, derandomize=True)
@hypothesis.given(st.text(max_size=200))
def test_code_reward_never_raises_on_arbitrary_code(pool, body):
  start = time.monotonic()
  r = code_reward.score(f"```python\n{body}\n```", {"inputs": ["1\n"], "outputs": ["1\n"]}, executor=pool)
  assert -1.0 <= r.score <= 1.0
  assert time.monotonic() - start < pool.cfg.timeout_s + 3.0
