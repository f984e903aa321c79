"""Reward registry: a row's `data_source` picks the reward kind (math, multiple choice, code).

    compute_score("AIME2024", response, "33")                      # math
    compute_score("gpqa_diamond", response, "B")                   # multiple choice
    compute_score("LiveCodeBench_v6", response, tests_json, executor=executor)   # code

Matching is on the lower-cased source name: an exact entry of `RewardConfig.sources` first, then the first rule
of `RewardConfig.rules` whose substring occurs in the name (so 'skywork_code' is code, 'skywork_math' math).
An unknown source raises ValueError unless `RewardConfig.default_kind` is set.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from agentrl_jax.rewards import code as code_reward
from agentrl_jax.rewards import math as math_reward
from agentrl_jax.rewards import multiple_choice
from agentrl_jax.rewards.base import RewardResult
from agentrl_jax.tools.base import Executor

logger = logging.getLogger(__name__)

# (substring of the lower-cased data_source, kind); first match wins, so more specific names come first.
DEFAULT_RULES: tuple[tuple[str, str], ...] = (
    ("gpqa", "multiple_choice"),
    ("mmlu", "multiple_choice"),
    ("multiple_choice", "multiple_choice"),
    ("livecodebench", "code"),
    ("humaneval", "code"),
    ("mbpp", "code"),
    ("codecontests", "code"),
    ("codeforces", "code"),
    ("leetcode", "code"),
    ("taco", "code"),
    ("code", "code"),
    ("toy_arith", "math"),  # the embedded CPU task (agentrl_jax/tasks/arithmetic.py)
    ("aime", "math"),
    ("amc", "math"),
    ("hmmt", "math"),
    ("math", "math"),  # math, math500, math_dapo, deepmath, openr1-math, ...
    ("dapo", "math"),
    ("deepscaler", "math"),
    ("olympiad", "math"),
    ("omni", "math"),
    ("minerva", "math"),
    ("gsm8k", "math"),
    ("numina", "math"),
    ("skywork", "math"),
    ("mega-science", "math"),
    ("megascience", "math"),
    ("still", "math"),
    ("orz", "math"),
)

Scorer = Callable[..., RewardResult]


def _math(response, ground_truth, extra_info, executor, cfg):
  del extra_info, executor
  return math_reward.score(response, ground_truth, mode=cfg.math_mode)


def _multiple_choice(response, ground_truth, extra_info, executor, cfg):
  del extra_info, executor, cfg
  return multiple_choice.score(response, ground_truth)


def _code(response, ground_truth, extra_info, executor, cfg):
  del extra_info, cfg
  return code_reward.score(response, ground_truth, executor=executor)


SCORERS: dict[str, Scorer] = {"math": _math, "multiple_choice": _multiple_choice, "code": _code}


def register(kind: str, scorer: Scorer) -> None:
  """Adds a reward kind: `scorer(response, ground_truth, extra_info, executor, cfg) -> RewardResult`."""
  if kind in SCORERS and SCORERS[kind] is not scorer:
    raise ValueError(f"reward kind {kind!r} is already registered")
  SCORERS[kind] = scorer


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """How `compute_score` picks and runs a reward.

  Attributes:
    math_mode: 'equiv' (LaTeX equivalence) or 'strict' (the recipe's exact string compare).
    default_kind: kind for sources no rule matches; None = raise ValueError.
    sources: exact lower-cased source name -> kind, checked before `rules`.
    rules: (substring, kind) pairs tried in order.
  """

  math_mode: str = "equiv"
  default_kind: str | None = None
  sources: tuple[tuple[str, str], ...] = ()
  rules: tuple[tuple[str, str], ...] = DEFAULT_RULES

  def __post_init__(self):
    if self.math_mode not in math_reward.MODES:
      raise ValueError(f"RewardConfig.math_mode must be one of {math_reward.MODES}, got {self.math_mode!r}")
    for field, kinds in (("default_kind", [self.default_kind] if self.default_kind else []),
                         ("sources", [k for _, k in self.sources]), ("rules", [k for _, k in self.rules])):
      for kind in kinds:
        if kind not in SCORERS:
          raise ValueError(f"RewardConfig.{field}: unknown reward kind {kind!r} (known: {sorted(SCORERS)})")


def kind_for(data_source: str, cfg: RewardConfig = RewardConfig()) -> str:
  """The reward kind for a data source.

  Raises:
    ValueError: no rule matches and `cfg.default_kind` is None.
  """
  name = str(data_source or "").strip().lower()
  exact = dict(cfg.sources)
  if name in exact:
    return exact[name]
  for sub, kind in cfg.rules:
    if sub in name:
      return kind
  if cfg.default_kind is not None:
    return cfg.default_kind
  raise ValueError(f"no reward for data_source {data_source!r}: add it to RewardConfig.sources or rules, or set "
                   f"RewardConfig.default_kind (known kinds: {sorted(SCORERS)})")


def compute_score(data_source: str, response: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None,
                  executor: Executor | None = None, cfg: RewardConfig = RewardConfig()) -> RewardResult:
  """Outcome reward of one response (no shaping; see `shaping.shape`).

  Args:
    data_source: the row's data source, e.g. 'AIME2024', 'gpqa_diamond', 'LiveCodeBench_v6', 'math_dapo'.
    response: the decoded response text.
    ground_truth: the row's reference (answer text, option letter, or test cases).
    extra_info: the row's extra info (passed to custom scorers).
    executor: code sandbox for code rewards; None = a default local pool.
    cfg: reward settings.

  Returns:
    The `RewardResult`. When the scorer raises, it is tried on two probe responses for the same ground truth
    (the ground truth itself as the answer, and an empty response): if either raises too, the scorer or the
    ground truth is broken, and the result is score 0 with `failure='scorer'` and an `info` message (the
    trainer leaves such responses out of the advantage and counts them); otherwise the response provoked the
    exception and scores as the empty response does (a wrong answer), so no response can escape its reward by
    crashing the scorer.

  Raises:
    ValueError: unknown `data_source` (unless `cfg.default_kind`).
  """
  kind = kind_for(data_source, cfg)
  scorer = SCORERS[kind]

  def run(text: str) -> RewardResult:
    result = scorer(text, ground_truth, extra_info, executor, cfg)
    if not isinstance(result, RewardResult) or not math.isfinite(result.score):
      raise TypeError(f"the scorer returned {result!r}, not a RewardResult with a finite score")
    return result

  try:
    return run(response)
  except Exception as e:  # pylint: disable=broad-except
    error = f"{type(e).__name__}: {str(e)[:300]}"
  try:
    run(_reference_probe(kind, ground_truth))
    empty = run("")
  except Exception:  # pylint: disable=broad-except
    logger.exception("reward %s failed for data_source %r (on a probe response too)", kind, data_source)
    return RewardResult(0.0, False, "", f"reward {kind} failed: {error}", failure="scorer")
  logger.info("reward %s raised on a response of %r (%s); scored as a wrong answer", kind, data_source, error)
  return RewardResult(empty.score, False, "", f"the response made the {kind} reward raise {error}; scored as "
                      "an empty response (the scorer works on probe responses)")


def _reference_probe(kind: str, ground_truth: Any) -> str:
  """A response that makes the scorer read the ground truth: the truth itself boxed, or for code a program."""
  if kind == "code":
    return "```python\npass\n```"
  return f"\\boxed{{{str(ground_truth)[:10000]}}}"


def answer_key(data_source: str, pred: str, cfg: RewardConfig = RewardConfig()) -> str | None:
  """Key for majority voting over predictions of this source; None where voting does not apply (code)."""
  kind = kind_for(data_source, cfg)
  if kind == "code":
    return None
  if kind == "math":
    return math_reward.answer_key(pred)
  return (pred or "").strip().upper()
