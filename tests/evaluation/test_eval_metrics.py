"""avg@k, unbiased pass@k, maj@k and tool/length statistics against hand-computed values and brute force."""

from __future__ import annotations

import itertools
import math
import random

import hypothesis
import pytest
from hypothesis import strategies as st

from agentrl_jax.evaluation.metrics import EvalSample, avg_at_k, compute_metrics, maj_at_k, pass_at_k


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),          # c / n
    (5, 2, 2, 0.7),          # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 3, 0.9),          # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (5, 2, 4, 1.0),          # n - c < k
    (5, 0, 3, 0.0),
    (4, 4, 4, 1.0),
    (10, 1, 5, 0.5),         # 1 - C(9,5)/C(10,5) = 1 - 126/252
    (32, 3, 8, 1 - math.comb(29, 8) / math.comb(32, 8)),
])
def test_pass_at_k_hand_values(n, c, k, expected):
  assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
@hypothesis.given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_correct_sample(nck):
  n, c, k = nck
  outcomes = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(outcomes, k))
  assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets), abs=1e-12)


def test_pass_at_k_rejects_bad_counts():
  for n, c, k in [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)]:
    with pytest.raises(ValueError):
      pass_at_k(n, c, k)


def test_bootstrap_with_replacement_understates_pass_at_k():
  # The reference resamples k of n with replacement; repeats lower the chance of drawing a correct sample.
  n, c, k = 8, 1, 4
  rng = random.Random(0)
  outcomes = [True] + [False] * 7
  boot = sum(any(rng.choice(outcomes) for _ in range(k)) for _ in range(20000)) / 20000
  assert boot < pass_at_k(n, c, k) - 0.05  # ~0.41 vs exactly 0.5


def test_avg_and_maj_hand_values():
  assert avg_at_k([True, False, True, True], 4) == 0.75
  assert avg_at_k([True, False, True, True], 2) == 0.5
  assert maj_at_k(["1/2", "3", "1/2", None], [True, False, True, False], 4) == 1.0
  assert maj_at_k(["3", "3", "1/2", "1/2"], [False, False, True, True], 4) == 0.0   # tie: first seen ("3") wins
  assert maj_at_k(["3", "1/2", "1/2", "3"], [False, True, True, False], 3) == 1.0   # first k only
  assert maj_at_k([None, "", None], [False, False, False], 3) == 0.0                # no votes
  assert maj_at_k([None, None, "7"], [False, False, True], 3) == 1.0                # abstainers do not vote
  with pytest.raises(ValueError):
    maj_at_k(["a"], [True, False], 1)
  with pytest.raises(ValueError):
    avg_at_k([True], 2)


def test_compute_metrics_per_source():
  samples = []
  # AIME: problem 0 -> 2 of 4 correct (majority answer "5" correct); problem 1 -> 0 of 4 correct.
  for i, (acc, key) in enumerate([(True, "5"), (False, "6"), (True, "5"), (False, None)]):
    samples.append(EvalSample("AIME2024", 0, acc, 1.0 if acc else -1.0, key, n_tool_calls=i, n_tool_ok=i // 2,
                              response_tokens=100 * (i + 1)))
  for acc, key in [(False, "1"), (False, "2"), (False, "2"), (False, "3")]:
    samples.append(EvalSample("AIME2024", 1, acc, -1.0, key, response_tokens=50))
  # Code: no votable answers -> no maj@k; one problem with 2 samples -> k=4 skipped.
  samples += [EvalSample("livecodebench", "p", True, 1.0, None, 2, 2, 300),
              EvalSample("livecodebench", "p", False, 0.5, None, 0, 0, 500)]
  m = compute_metrics(samples, ks=(1, 2, 4))
  assert m["AIME2024/avg@4"] == pytest.approx((0.5 + 0.0) / 2)
  assert m["AIME2024/avg@1"] == pytest.approx((1.0 + 0.0) / 2)
  assert m["AIME2024/pass@2"] == pytest.approx((1 - math.comb(2, 2) / math.comb(4, 2) + 0.0) / 2)
  assert m["AIME2024/pass@4"] == pytest.approx(0.5)
  assert m["AIME2024/maj@4"] == pytest.approx(0.5)
  assert m["AIME2024/n_problems"] == 2 and m["AIME2024/n_samples"] == 8
  assert m["AIME2024/tool_calls_mean"] == pytest.approx((0 + 1 + 2 + 3) / 8)
  assert m["AIME2024/tool_success_rate"] == pytest.approx((0 + 0 + 1 + 1) / 6)
  assert m["AIME2024/response_tokens_mean"] == pytest.approx((100 + 200 + 300 + 400 + 4 * 50) / 8)
  assert m["AIME2024/response_tokens_max"] == 400
  assert m["livecodebench/pass@2"] == 1.0 and m["livecodebench/avg@2"] == 0.5
  assert "livecodebench/maj@2" not in m and "livecodebench/pass@4" not in m
  assert m["livecodebench/score_mean"] == 0.75
  assert m["all/tool_success_rate"] == pytest.approx((2 + 2) / (6 + 2))
  assert m["all/tool_calls_mean"] == pytest.approx(8 / 10)


def test_tool_success_rate_omitted_without_calls_and_sample_validation():
  m = compute_metrics([EvalSample("gpqa_diamond", 0, True, 1.0, "A")], ks=(1,))
  assert "gpqa_diamond/tool_success_rate" not in m and m["gpqa_diamond/maj@1"] == 1.0
  assert compute_metrics([]) == {}
  with pytest.raises(ValueError, match="n_tool_ok"):
    EvalSample("x", 0, True, n_tool_calls=1, n_tool_ok=2)
