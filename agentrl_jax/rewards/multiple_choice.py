"""Multiple-choice reward (GPQA): the option letter in the last boxed answer, +1 / -1.

    multiple_choice.score("... \\\\boxed{\\\\text{(B)}}", "B")   # RewardResult(1.0, True, 'B')

The letter is read tolerantly: `B`, `(B)`, `B.`, `B)`, `[B]`, `\\\\text{B}`, `\\\\textbf{(B)}`, `\\\\mathrm{B}`,
`B: 42 J`, `Option B`, `b`. Exactly one option letter, else wrong: a boxed answer naming none, or naming another
letter too (`B and C`, `(B) or (C)`, `B C D`, `B/C`), is wrong, and so are boxes that answer together
(`\\\\boxed{B} or \\\\boxed{C}`) unless they name the same letter.
"""

from __future__ import annotations

import re

from agentrl_jax.rewards.base import RewardResult
from agentrl_jax.rewards.math import boxed_answers, strip_tool_responses

_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox|textsf)\s*\{([^{}]*)\}")
_TOKEN_RE = re.compile(r"[A-Za-z]+|\d+(?:\.\d+)?|\S")
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
  if _names_another_letter(rest, letter):
    return None
  return letter.upper()


def _names_another_letter(rest: str, letter: str) -> bool:
  """Whether the text after the option letter names a second option (`and C`, `or (C)`, `C D`): a lone letter
  (upper case, or lower case when the answer's was) that does not follow a number (`42 J`, `5 A` are units)."""
  tokens = _TOKEN_RE.findall(rest)
  for i, tok in enumerate(tokens):
    if len(tok) == 1 and tok.isalpha() and tok.upper() != letter.upper() and (tok.isupper() or letter.islower()):
      prev = next((t for t in reversed(tokens[:i]) if t[0].isalnum()), "")
      if not prev[:1].isdigit():
        return True
  return False


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
    return RewardResult(0.0, False, "", f"ground truth {str(ground_truth)[:40]!r} is not an option letter",
                        failure="ground_truth")
  boxes = boxed_answers(strip_tool_responses(text))
  if not boxes:
    return RewardResult(-1.0, False, "", "no boxed answer")
  letters = {choice_letter(b) for b in boxes}
  if None in letters or len(letters) != 1:
    shown = " / ".join(b[:40] for b in boxes)
    return RewardResult(-1.0, False, "", f"boxed answer {shown!r} names no single option letter")
  pred = letters.pop()
  ok = pred == truth
  return RewardResult(1.0 if ok else -1.0, ok, pred)
