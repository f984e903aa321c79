"""Evaluation metrics over n sampled responses per problem: avg@k, unbiased pass@k, maj@k, tool use, length.

    samples = [EvalSample("AIME2024", prompt_id=i, acc=r.acc, answer_key=rewards.answer_key("AIME2024", r.pred),
                          n_tool_calls=3, n_tool_ok=2, response_tokens=812) for ...]
    compute_metrics(samples, ks=(1, 8, 32))
    # {'AIME2024/avg@32': 0.41, 'AIME2024/pass@8': 0.7, 'AIME2024/maj@32': 0.53, 'AIME2024/tool_calls_mean': ...}

Definitions (per data source, averaged over its problems):
  avg@k   mean accuracy of the first k samples of a problem.
  pass@k  unbiased estimate from all n >= k samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021).
          The reference estimates it by bootstrap resampling with replacement, which repeats samples and so
          understates it.
  maj@k   accuracy of the most frequent normalised answer among the first k samples (ties: the answer seen
          first); samples without an answer do not vote. Not reported where answers are not comparable (code:
          `answer_key` None for every sample).
Tool use: tool calls per response, tool success rate (successful calls / calls), response length in tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Hashable, Iterable, Sequence
from fractions import Fraction


@dataclasses.dataclass(frozen=True)
class EvalSample:
  """One sampled response to one problem.

  Attributes:
    data_source: the benchmark, e.g. 'AIME2024'.
    prompt_id: identifies the problem; the samples of one problem share it.
    acc: whether the response is correct.
    score: its reward (reported as a mean).
    answer_key: normalised answer for majority voting (`rewards.answer_key`); None = no answer / not votable.
    n_tool_calls: tool calls the response made.
    n_tool_ok: of those, calls whose execution succeeded (status 'ok').
    response_tokens: response length in tokens (tool outputs included).
  """

  data_source: str
  prompt_id: Hashable
  acc: bool
  score: float = 0.0
  answer_key: str | None = None
  n_tool_calls: int = 0
  n_tool_ok: int = 0
  response_tokens: int = 0

  def __post_init__(self):
    if self.n_tool_calls < 0 or not 0 <= self.n_tool_ok <= self.n_tool_calls:
      raise ValueError(f"EvalSample: need 0 <= n_tool_ok <= n_tool_calls, got {self.n_tool_ok}, {self.n_tool_calls}")


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k), computed exactly.

  Raises:
    ValueError: unless 0 <= c <= n and 1 <= k <= n.
  """
  if not (0 <= c <= n and 1 <= k <= n):
    raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def avg_at_k(accs: Sequence[bool | float], k: int) -> float:
  """Mean accuracy of the first k samples of one problem."""
  if not 1 <= k <= len(accs):
    raise ValueError(f"avg_at_k needs 1 <= k <= {len(accs)} samples, got k={k}")
  return float(sum(float(a) for a in accs[:k]) / k)


def maj_at_k(answer_keys: Sequence[str | None], accs: Sequence[bool], k: int) -> float:
  """1.0 if the majority answer among the first k samples is correct, else 0.0.

  Votes go to non-empty keys; ties go to the answer seen first; the correctness of the winning answer is that
  of its first sample. No votes at all counts as wrong.
  """
  if len(answer_keys) != len(accs):
    raise ValueError(f"maj_at_k: {len(answer_keys)} answers but {len(accs)} accuracies")
  if not 1 <= k <= len(accs):
    raise ValueError(f"maj_at_k needs 1 <= k <= {len(accs)} samples, got k={k}")
  counts: collections.Counter[str] = collections.Counter()
  first: dict[str, int] = {}
  for i, key in enumerate(answer_keys[:k]):
    if key:
      counts[key] += 1
      first.setdefault(key, i)
  if not counts:
    return 0.0
  winner = max(counts, key=lambda key: (counts[key], -first[key]))
  return 1.0 if accs[first[winner]] else 0.0


def _mean(values: Sequence[float]) -> float:
  return float(sum(values) / len(values)) if values else 0.0


def compute_metrics(samples: Iterable[EvalSample], ks: Sequence[int] = (1,)) -> dict[str, float]:
  """All metrics per data source ('<source>/<metric>') and tool/length statistics over everything ('all/...').

  Args:
    samples: the evaluated responses, in sampling order within each problem (avg@k / maj@k use the first k).
    ks: the k values; a k larger than the fewest samples any problem of a source has is skipped for that source.

  Returns:
    A flat dict of floats, e.g. 'AIME2024/pass@8', 'AIME2024/maj@8', 'gpqa_diamond/tool_success_rate',
    'all/response_tokens_mean'. Counts are reported as 'n_problems' and 'n_samples'.
  """
  by_source: dict[str, dict[Hashable, list[EvalSample]]] = collections.defaultdict(dict)
  every: list[EvalSample] = []
  for s in samples:
    by_source[s.data_source].setdefault(s.prompt_id, []).append(s)
    every.append(s)
  out: dict[str, float] = {}
  for source in sorted(by_source):
    problems = list(by_source[source].values())
    flat = [s for group in problems for s in group]
    n_min = min(len(group) for group in problems)
    votable = any(s.answer_key is not None for s in flat)
    for k in sorted(set(ks)):
      if not 1 <= k <= n_min:
        continue
      out[f"{source}/avg@{k}"] = _mean([avg_at_k([s.acc for s in g], k) for g in problems])
      out[f"{source}/pass@{k}"] = _mean([pass_at_k(len(g), sum(s.acc for s in g), k) for g in problems])
      if votable:
        out[f"{source}/maj@{k}"] = _mean([maj_at_k([s.answer_key for s in g], [s.acc for s in g], k)
                                          for g in problems])
    out[f"{source}/n_problems"] = float(len(problems))
    out[f"{source}/n_samples"] = float(len(flat))
    out[f"{source}/score_mean"] = _mean([s.score for s in flat])
    out.update(_usage(f"{source}/", flat))
  if every:
    out.update(_usage("all/", every))
  return out


def _usage(prefix: str, samples: Sequence[EvalSample]) -> dict[str, float]:
  calls = sum(s.n_tool_calls for s in samples)
  out = {
      f"{prefix}tool_calls_mean": _mean([s.n_tool_calls for s in samples]),
      f"{prefix}response_tokens_mean": _mean([s.response_tokens for s in samples]),
      f"{prefix}response_tokens_max": float(max(s.response_tokens for s in samples)),
  }
  if calls:  # undefined without calls; omitted rather than reported as 0
    out[f"{prefix}tool_success_rate"] = sum(s.n_tool_ok for s in samples) / calls
  return out
