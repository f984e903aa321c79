"""Multiple-choice reward (GPQA): the option letter in the last boxed answer, +1 / -1.

    multiple_choice.score("... \\\\boxed{\\\\text{(B)}}", "B")   # RewardResult(1.0, True, 'B')

The letter is read tolerantly: `B`, `(B)`, `B.`, `B)`, `[B]`, `\\\\text{B}`, `\\\\textbf{(B)}`, `\\\\mathrm{B}`,
`B: 42 J`, `Option B`, `b`. A boxed answer that names no single option letter is wrong.
"""

from __future__ import annotations

import re

from agentrl_jax.rewards.base import RewardResult
from agentrl_jax.rewards.math import last_boxed, strip_tool_responses

_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox|textsf)\s*\{([^{}]*)\}")
_LETTER_RE = re.compile(r"^(?:(?:option|answer|choice)\s*:?\s*)?[(\[{]?\s*([A-Za-z])\s*[)\]}]?(?:[.:)]|\s|$)(.*)$",
                        re.IGNORECASE | re.DOTALL)


def choice_letter(answer: str | None) -> str | None:
  """The option letter an answer names (upper case), or None."""
  if not answer:
    return None
  text = answer[:2000]
  for _ in range(3):  # nested wrappers: \textbf{\text{B}}
    text = _WRAPPER_RE.sub(r"\1", text)
  text = text.replace("$", "").replace("\\", " ").strip()
  m = _LETTER_RE.match(text)
  if m is None:
    return None
  letter, rest = m.group(1), m.group(2).strip()
  # 'a' alone is a letter; 'a + b' or 'x = 2' are not option answers.
  if rest and not re.match(r"^[-:.)\s]*[A-Za-z0-9\\(]", rest):
    return None
  return letter.upper()


def score(response: str, ground_truth: str) -> RewardResult:
  """Scores the option letter of the last boxed answer against the ground-truth letter.

  Args:
    response: the model's response (tool outputs inside it are ignored).
    ground_truth: the correct option, e.g. 'B' or '(B)'.

  Returns:
    RewardResult(score=+1 or -1, acc, pred=the letter or '').
  """
  text = response if isinstance(response, str) else "" if response is None else str(response)
  truth = choice_letter(str(ground_truth).strip()) if ground_truth is not None else None
  if truth is None:
    return RewardResult(0.0, False, "", f"ground truth {str(ground_truth)[:40]!r} is not an option letter")
  boxed = last_boxed(strip_tool_responses(text))
  if boxed is None:
    return RewardResult(-1.0, False, "", "no boxed answer")
  pred = choice_letter(boxed)
  if pred is None:
    return RewardResult(-1.0, False, "", f"boxed answer {boxed[:40]!r} names no option letter")
  ok = pred == truth
  return RewardResult(1.0 if ok else -1.0, ok, pred)
