"""Bootstrap intervals over problems: the metric tables, intervals of one policy and paired changes."""

import math

import numpy as np
import pytest

from agentrl_jax.evaluation import bootstrap, runner
from agentrl_jax.evaluation.metrics import EvalSample


def _binary(values):
  return {i: (float(v), 1.0) for i, v in enumerate(values)}


def test_problem_table_values():
  samples = [
      EvalSample("s", 0, True, answer_key="7", n_tool_calls=1, n_tool_ok=1, response_tokens=10),
      EvalSample("s", 0, False, answer_key="8", n_tool_calls=2, n_tool_ok=1, response_tokens=30),
      EvalSample("s", 0, True, answer_key="7", n_tool_calls=0, n_tool_ok=0, response_tokens=20),
      EvalSample("s", 1, False, answer_key=None, n_tool_calls=0, n_tool_ok=0, response_tokens=5),
      EvalSample("s", 1, False, answer_key="1", n_tool_calls=0, n_tool_ok=0, response_tokens=5),
      EvalSample("s", 1, False, answer_key="1", n_tool_calls=0, n_tool_ok=0, response_tokens=5),
  ]
  table = bootstrap.problem_table(samples, k=2)
  assert table["avg@2"] == {("s", 0): (0.5, 1.0), ("s", 1): (0.0, 1.0)}
  assert table["pass@2"][("s", 0)] == (1.0, 1.0)  # 2 of 3 right: every pair holds one
  assert table["maj@2"][("s", 0)] == (1.0, 1.0)  # a 1-1 tie goes to the answer seen first
  assert table["tool_calls_per_response"][("s", 0)] == (3.0, 3.0)
  assert table["tool_success_rate"] == {("s", 0): (2.0, 3.0), ("s", 1): (0.0, 0.0)}
  assert bootstrap.value(table["tool_success_rate"]) == pytest.approx(2 / 3)
  assert bootstrap.value(table["response_len_mean"]) == pytest.approx(75 / 6)
  rows = [{"data_source": s.data_source, "index": s.prompt_id, "acc": s.acc, "score": s.score,
           "answer_key": s.answer_key, "num_tool_calls": s.n_tool_calls,
           "num_failed_calls": s.n_tool_calls - s.n_tool_ok, "response_tokens": s.response_tokens} for s in samples]
  assert runner.samples_from_rows(rows) == samples


def test_interval_of_a_rate_matches_the_normal_approximation():
  rng = np.random.default_rng(1)
  values = rng.random(400) < 0.5
  p = values.mean()
  lo, hi = bootstrap.interval(_binary(values))
  half = 1.96 * math.sqrt(p * (1 - p) / 400)
  assert lo < p < hi
  assert lo == pytest.approx(p - half, abs=0.01) and hi == pytest.approx(p + half, abs=0.01)
  assert bootstrap.interval(_binary(values)) == [lo, hi]  # fixed seed: reproducible to the digit
  assert bootstrap.interval({}) is None


def test_paired_change_is_exact_for_equal_policies_and_narrower_than_unpaired():
  rng = np.random.default_rng(2)
  difficulty = rng.random(512)
  before = _binary(difficulty < 0.55)
  after = _binary((difficulty < 0.70) | (rng.random(512) < 0.02))  # mostly the same problems, some more
  c = bootstrap.paired_change(before, after)
  assert c["problems"] == 512 and c["change"] == pytest.approx(c["after"] - c["before"])
  lo, hi = c["ci95"]
  assert lo < c["change"] < hi and lo > 0
  # Unpaired, the two policies' problem-to-problem spread adds up: the interval is much wider.
  b_lo, b_hi = bootstrap.interval(before)
  a_lo, a_hi = bootstrap.interval(after)
  unpaired_half = math.hypot((b_hi - b_lo) / 2, (a_hi - a_lo) / 2)
  assert (hi - lo) / 2 < 0.7 * unpaired_half
  same = bootstrap.paired_change(before, before)
  assert same["change"] == 0.0 and same["ci95"] == [0.0, 0.0]


def test_paired_change_uses_the_common_problems_and_reports_undefined_rates():
  before = {0: (1.0, 1.0), 1: (0.0, 1.0), 2: (1.0, 1.0)}
  after = {1: (1.0, 1.0), 2: (1.0, 1.0), 3: (0.0, 1.0)}
  c = bootstrap.paired_change(before, after)
  assert c["problems"] == 2 and c["before"] == 0.5 and c["after"] == 1.0
  no_calls = {0: (0.0, 0.0), 1: (0.0, 0.0)}
  c = bootstrap.paired_change(no_calls, {0: (1.0, 2.0), 1: (2.0, 2.0)})
  assert c["before"] is None and c["change"] is None and c["ci95"] is None and c["after"] == 0.75
