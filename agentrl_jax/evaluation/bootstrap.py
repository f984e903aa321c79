"""95% bootstrap intervals over problems for evaluation metrics, alone and as a paired before/after change.

Each metric is a ratio of sums over problems, `sum(num) / sum(den)`, from one `(num, den)` pair per problem:

    avg@k                 (mean accuracy of the problem's first k samples, 1)
    pass@k                (unbiased pass@k of the problem, 1)
    maj@k                 (1 if the majority answer of the first k samples is right, 1)
    tool_calls_per_response, response_len_mean
                          (calls / tokens summed over the problem's samples, its number of samples)
    tool_success_rate     (successful calls, calls)

so a metric's mean over problems and its pooled rates are both covered. Resampling problems (not samples)
with replacement keeps the samples of one problem together: the interval describes what another draw of
problems from the same family would give. A change between two policies evaluated on the same problems
resamples the same problems for both (paired), which removes the problem-to-problem spread the two share:

    table = problem_table(samples, k=4)                 # {metric: {problem id: (num, den)}}
    interval(table["avg@4"])                            # (lo, hi) of avg@4
    paired_change(sft_table["avg@4"], rl_table["avg@4"]) # {"before", "after", "change", "ci95": [lo, hi]}

Resampling uses a fixed seed, so a report is reproducible to the digit.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from agentrl_jax.evaluation import metrics as metrics_lib

RESAMPLES = 5000
LEVEL = 0.95

Stats = Mapping[Hashable, tuple[float, float]]  # problem id -> (num, den)


def problem_table(samples: Iterable[metrics_lib.EvalSample], k: int) -> dict[str, dict[Hashable, tuple[float, float]]]:
  """Per problem `(num, den)` of every metric in the module docstring (samples in sampling order per problem;
  a problem with fewer than k samples has no avg@k / pass@k / maj@k entry)."""
  groups: dict[Hashable, list[metrics_lib.EvalSample]] = collections.defaultdict(list)
  for s in samples:
    groups[(s.data_source, s.prompt_id)].append(s)
  out: dict[str, dict[Hashable, tuple[float, float]]] = collections.defaultdict(dict)
  for pid, g in groups.items():
    accs = [s.acc for s in g]
    if len(g) >= k:
      out[f"avg@{k}"][pid] = (metrics_lib.avg_at_k(accs, k), 1.0)
      out[f"pass@{k}"][pid] = (metrics_lib.pass_at_k(len(g), sum(accs), k), 1.0)
      out[f"maj@{k}"][pid] = (metrics_lib.maj_at_k([s.answer_key for s in g], accs, k), 1.0)
    out["tool_calls_per_response"][pid] = (float(sum(s.n_tool_calls for s in g)), float(len(g)))
    out["tool_success_rate"][pid] = (float(sum(s.n_tool_ok for s in g)), float(sum(s.n_tool_calls for s in g)))
    out["response_len_mean"][pid] = (float(sum(s.response_tokens for s in g)), float(len(g)))
  return dict(out)


def _arrays(stats: Stats, ids: Sequence[Hashable]) -> tuple[np.ndarray, np.ndarray]:
  return (np.array([stats[i][0] for i in ids], np.float64), np.array([stats[i][1] for i in ids], np.float64))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray | float:
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _resample(n: int, resamples: int, seed: int) -> np.ndarray:
  """`[resamples, n]` problem indices drawn with replacement."""
  return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _percentiles(values: np.ndarray, level: float) -> list[float] | None:
  values = values[np.isfinite(values)]
  if not len(values):
    return None
  tail = (1.0 - level) / 2 * 100
  lo, hi = np.percentile(values, [tail, 100 - tail])
  return [float(lo), float(hi)]


def value(stats: Stats) -> float | None:
  """The metric over all problems: `sum(num) / sum(den)` (None when the denominator is 0 or no problems)."""
  num, den = _arrays(stats, list(stats))
  return float(num.sum() / den.sum()) if den.sum() > 0 else None


def interval(stats: Stats, *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> list[float] | None:
  """The `level` percentile bootstrap interval `[lo, hi]` of the metric over problems (None: no problems or a
  zero denominator in every resample)."""
  ids = list(stats)
  if not ids:
    return None
  num, den = _arrays(stats, ids)
  idx = _resample(len(ids), resamples, seed)
  return _percentiles(_ratio(num[idx].sum(1), den[idx].sum(1)), level)


def paired_change(before: Stats, after: Stats, *, resamples: int = RESAMPLES, level: float = LEVEL,
                  seed: int = 0) -> dict[str, float | list[float] | int | None]:
  """The change `after - before` on the problems both evaluated, with its paired bootstrap interval.

  Returns:
    `{"before", "after", "change", "ci95": [lo, hi], "problems"}`; a value is None where its denominator is 0
    (e.g. the tool success rate of a policy that never called the tool).
  """
  ids = [i for i in before if i in after]
  out: dict[str, float | list[float] | int | None] = {"before": None, "after": None, "change": None, "ci95": None,
                                                       "problems": len(ids)}
  if not ids:
    return out
  b_num, b_den = _arrays(before, ids)
  a_num, a_den = _arrays(after, ids)
  if b_den.sum() > 0:
    out["before"] = float(b_num.sum() / b_den.sum())
  if a_den.sum() > 0:
    out["after"] = float(a_num.sum() / a_den.sum())
  if out["before"] is None or out["after"] is None:
    return out
  out["change"] = out["after"] - out["before"]
  idx = _resample(len(ids), resamples, seed)
  diff = _ratio(a_num[idx].sum(1), a_den[idx].sum(1)) - _ratio(b_num[idx].sum(1), b_den[idx].sum(1))
  out["ci95"] = _percentiles(diff, level)
  return out
