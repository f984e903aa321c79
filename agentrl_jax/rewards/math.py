"""Math reward: the boxed answer of a response against the ground truth, +1 / -1.

    from agentrl_jax.rewards import math as math_reward
    math_reward.score("... so the answer is \\\\boxed{\\\\dfrac{1}{2}}.", "0.5")             # score 1.0, acc True
    math_reward.score("... \\\\boxed{0.5}", "\\\\frac12", mode="strict")                    # score -1.0

Modes:
  strict  the recipe's compare, exactly (verl `math_dapo.compute_score(..., strict_box_verify=True)`, called by
          the recipe's reward, Gen-Verse/Open-AgentRL recipe/demystify/reward.py:171): the response is cut to its
          last 300 characters (verl/utils/reward_score/math_dapo.py:260), then to the last 100
          (`is_correct_strict_box`, :211); the last `\\boxed{` in them is read with its braces counted as they
          come (`last_boxed_only_string`, :20-47, and `remove_boxed`, :50-62), and its content must equal the
          ground truth string exactly (:217): no normalisation at all, so `\\boxed{999999.5}` is not 1000000,
          `\\boxed{33.00001}` is not 33 and `\\boxed{3 = 5 = 7}` is not 7. As there, control tokens (`<|im_end|>`)
          are not part of the response (the reference decodes with `skip_special_tokens=True`).
  equiv   equivalence at the level of Math-Verify (`latex.equivalent`): fractions, roots, decimals, thousands
          separators, units and percent words, labelled answers, equations and inequalities, intervals and the
          inequalities of the same set, sums and products in any order, matrices; integers exact, a decimal as a
          rounding of the value to its own last place (three significant digits or more), a chain only when
          all its members are equal, a list of answers as a multiset (any order, no answer missing, extra or
          repeated), one tuple in order. The answer is the last box, joined with the boxes just before it when
          only separators (or the next box's label) stand between them (`\\boxed{(2,2)} \\text{ and }
          \\boxed{(6,2)}`), so several boxes answer together and a hedge (`\\boxed{3} or \\boxed{5}`) is a list,
          never its last item.
A response without a boxed answer is wrong. The text scored is what the model generated (`rl.batch.model_text`
reads only its own tokens: a tool's output is never its answer); `<tool_response>` blocks found in a text are
dropped as well. Every call is bounded (see `latex`), whatever the input.
"""

from __future__ import annotations

import re

from agentrl_jax.rewards import latex
from agentrl_jax.rewards.base import RewardResult

MODES = ("strict", "equiv")
STRICT_WINDOW_CHARS = 100  # the reference's `solution_str[-300:]` then `pred[-100:]` (math_dapo.py:260, :211)
MAX_JOINED_BOXES = 16
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_TOOL_RESPONSE_RE = re.compile(r"<tool_response>.*?(?:</tool_response>|\Z)", re.DOTALL)
_CONTROL_TOKEN_RE = re.compile(r"<\|[a-z_]{1,40}\|>")
# What may stand between boxes that answer together: whitespace, commas, semicolons, 'and' / 'or', math
# delimiters, spacing commands, \text{ and }, the label of the next box (`y_2 = \boxed{..}`).
_JOINER_RE = re.compile(r"(?:\s|[,;.&]|\$|\\[()\[\]]|\\\\|\\[,;:! ]|\\q?quad|\band\b|\bor\b"
                        r"|\\text\s*\{\s*(?:and|or|,)?\s*\})*(?:(?<![A-Za-z])[A-Za-z](?:_\{?\w{1,3}\}?)?\s*=\s*)?")
_MAX_JOINER_CHARS = 40


def strip_tool_responses(text: str) -> str:
  """Removes tool outputs (hermes `<tool_response>` blocks) so only the model's own text is graded."""
  if "<tool_response>" not in text:
    return text
  return _TOOL_RESPONSE_RE.sub("", text)


def _box_span(text: str, start: int) -> tuple[str, int] | None:
  """(content, end) of the box whose command ends at `start`: brace-balanced `{...}`, or `\\\\boxed 5`."""
  i = start
  while i < len(text) and text[i] in " \t":
    i += 1
  if i >= len(text):
    return None
  if text[i] != "{":
    m = re.match(r"[^\s$]+", text[i:i + 1000])
    content = m.group(0).rstrip(".,;") if m else ""
    return (content, i + len(content)) if content else None
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
        return text[i + 1:j], j + 1
    j += 1
  return None


def last_boxed(text: str) -> str | None:
  """Content of the last `\\\\boxed{...}` / `\\\\fbox{...}` (brace-balanced) or `\\\\boxed 5`; None if absent.

  Only the last occurrence is considered: if it is unterminated (a truncated response), there is no answer.
  """
  boxes = boxed_answers(text, max_boxes=1)
  return boxes[-1] if boxes else None


def boxed_answers(text: str, max_boxes: int = MAX_JOINED_BOXES) -> list[str]:
  """The last box and the boxes just before it that only separators divide from it, in order; [] if none."""
  if not isinstance(text, str):
    return []
  starts = [m for m in _BOX_RE.finditer(text)]
  out: list[str] = []
  next_start = None
  for m in reversed(starts):
    span = _box_span(text, m.end())
    if span is None or (next_start is not None and span[1] > next_start):
      break  # unterminated, or nested inside the box after it
    if next_start is not None:
      gap = text[span[1]:next_start]
      if len(gap) > _MAX_JOINER_CHARS or not _JOINER_RE.fullmatch(gap):
        break
    out.append(span[0])
    next_start = m.start()
    if len(out) >= max_boxes:
      break
  return out[::-1]


def _reference_last_boxed(text: str) -> str | None:
  """verl math_dapo's `remove_boxed(last_boxed_only_string(text))`: the last `\\\\boxed{`, braces counted as is."""
  idx = text.rfind("\\boxed{")
  if idx < 0:
    return None
  depth = 0
  for i in range(idx, len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        return text[idx + len("\\boxed{"):i]
  return None


def score(response: str, ground_truth: str, mode: str = "equiv") -> RewardResult:
  """Scores a response's boxed answer against `ground_truth`.

  Args:
    response: the model's response text (tool outputs inside it are ignored).
    ground_truth: the reference answer (a number or LaTeX); non-strings are converted with `str`.
    mode: 'strict' (exact string in the reference's window, the recipe) or 'equiv' (equivalence).

  Returns:
    RewardResult(score=+1 or -1, acc, pred=the boxed text (equiv: boxes answering together joined by ', ') or '').

  Raises:
    ValueError: unknown `mode` (a configuration error, not a bad input).
  """
  if mode not in MODES:
    raise ValueError(f"math reward mode must be one of {MODES}, got {mode!r}")
  text = response if isinstance(response, str) else "" if response is None else str(response)
  truth = ground_truth if isinstance(ground_truth, str) else "" if ground_truth is None else str(ground_truth)
  text = strip_tool_responses(text)
  if mode == "strict":
    # math_dapo.py:260 keeps the last 300 characters and :211 the last 100 of those: the last 100.
    pred = _reference_last_boxed(_CONTROL_TOKEN_RE.sub("", text)[-300:][-STRICT_WINDOW_CHARS:])
    if pred is None:
      return RewardResult(-1.0, False, "", "no boxed answer in the last 100 characters")
    ok = pred == truth
    return RewardResult(1.0 if ok else -1.0, ok, pred)
  boxes = boxed_answers(text)
  if not boxes:
    return RewardResult(-1.0, False, "", "no boxed answer")
  pred = ", ".join(b.strip() for b in boxes)
  ok = latex.equivalent(pred, truth)
  return RewardResult(1.0 if ok else -1.0, ok, pred)


def answer_key(pred: str) -> str:
  """Key for majority voting: equivalent answers usually share it (`latex.canonical`)."""
  return latex.canonical(pred) if pred else ""
