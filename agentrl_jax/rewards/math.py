"""Math reward: the LAST boxed answer of a response against the ground truth, +1 / -1.

    from agentrl_jax.rewards import math as math_reward
    math_reward.score("... so the answer is \\\\boxed{\\\\dfrac{1}{2}}.", "0.5")             # score 1.0, acc True
    math_reward.score("... \\\\boxed{0.5}", "\\\\frac12", mode="strict")                    # score -1.0

Modes:
  strict  the recipe (verl `math_dapo`, strict box): the boxed text must equal the ground truth as a string
          (surrounding whitespace ignored). The recipe only looks at the last 100 characters of the response;
          here the last boxed answer anywhere counts, so a correct answer followed by a closing sentence is not lost.
  equiv   LaTeX-aware equivalence (`latex.equivalent`): `\\\\frac`/`\\\\dfrac`, roots, thousands separators,
          `^\\\\circ`, `\\\\$`, `\\\\text{}` and units, tuples and intervals, `x=5` -> 5, leading zeros, numeric value.
A response without a boxed answer is wrong. Text inside `<tool_response>...</tool_response>` is ignored: an
answer printed by the code tool is not the model's answer. Every call is bounded (see `latex`), whatever the input.
"""

from __future__ import annotations

import re

from agentrl_jax.rewards import latex
from agentrl_jax.rewards.base import RewardResult

MODES = ("strict", "equiv")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_TOOL_RESPONSE_RE = re.compile(r"<tool_response>.*?(?:</tool_response>|\Z)", re.DOTALL)


def strip_tool_responses(text: str) -> str:
  """Removes tool outputs (hermes `<tool_response>` blocks) so only the model's own text is graded."""
  if "<tool_response>" not in text:
    return text
  return _TOOL_RESPONSE_RE.sub("", text)


def last_boxed(text: str) -> str | None:
  """Content of the last `\\\\boxed{...}` / `\\\\fbox{...}` (brace-balanced) or `\\\\boxed 5`; None if absent.

  Only the last occurrence is considered: if it is unterminated (a truncated response), there is no answer.
  """
  if not isinstance(text, str):
    return None
  start = None
  for m in _BOX_RE.finditer(text):
    start = m.end()
  if start is None:
    return None
  i = start
  while i < len(text) and text[i] in " \t":
    i += 1
  if i >= len(text):
    return None
  if text[i] != "{":
    m = re.match(r"[^\s$]+", text[i:i + 1000])
    return m.group(0).rstrip(".,;") or None if m else None
  depth, j = 0, i
  while j < len(text):
    c = text[j]
    if c == "\\":
      j += 2  # an escaped brace (\{ \}) does not count
      continue
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return text[i + 1:j]
    j += 1
  return None


def score(response: str, ground_truth: str, mode: str = "equiv") -> RewardResult:
  """Scores a response's last boxed answer against `ground_truth`.

  Args:
    response: the model's response text (tool outputs inside it are ignored).
    ground_truth: the reference answer (a number or LaTeX); non-strings are converted with `str`.
    mode: 'strict' (exact string, the recipe) or 'equiv' (LaTeX equivalence).

  Returns:
    RewardResult(score=+1 or -1, acc, pred=the boxed text or '').

  Raises:
    ValueError: unknown `mode` (a configuration error, not a bad input).
  """
  if mode not in MODES:
    raise ValueError(f"math reward mode must be one of {MODES}, got {mode!r}")
  text = response if isinstance(response, str) else "" if response is None else str(response)
  truth = ground_truth if isinstance(ground_truth, str) else "" if ground_truth is None else str(ground_truth)
  pred = last_boxed(strip_tool_responses(text))
  if pred is None:
    return RewardResult(-1.0, False, "", "no boxed answer")
  if mode == "strict":
    ok = pred.strip() == truth.strip()
  else:
    ok = latex.equivalent(pred, truth)
  return RewardResult(1.0 if ok else -1.0, ok, pred)


def answer_key(pred: str) -> str:
  """Key for majority voting: equivalent answers usually share it (`latex.canonical`)."""
  return latex.canonical(pred) if pred else ""
