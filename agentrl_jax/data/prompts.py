"""Per-source prompt wording: a prefix and suffix around the problem, chosen per ROW by `data_source`.

The recipe wraps each problem in task instructions (a careful-reasoner preamble, a note that the code tool may
be used for computation and checking, "stop calling tools once sure", and the answer format: `\\boxed{}` for
math, the option letter in `\\boxed{}` for GPQA, a fenced Python program reading stdin for code). Its
reference picks one mapping per FILE from the first row's `data_source`; here the style is applied per row, so
mixed files get the right wording for each row.

The default wording below follows the structure of the reference's prompts (Open-AgentRL's
`recipe/demystify/reward.py`) in our own words; to reproduce the paper exactly, pass its strings as a custom
`PromptStyle`. Everything here is config: templates are plain strings with two placeholders, `{domain}`
(`extra_info['domain']`, GPQA) and `{examples}` (test cases from a code row's ground truth). Other braces
(e.g. `\\boxed{}`) are left alone.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping

from agentrl_jax.data import records as rec

_PLACEHOLDERS = ("{domain}", "{examples}")

MATH_PREAMBLE = (
    "You are a careful and accurate reasoning assistant for math problems.\n"
    "Work through the problem below step by step, and explain your reasoning before any calculation.\n\n"
)
TOOL_HINT = (
    "A code tool is available: use it for exact, efficient computation, or to check intermediate and final "
    "results before you conclude.\n\n"
)
AGENT_NOTE = (
    "\n\nNote: call the tool only when a computation or a check needs it. Once you are confident in the final "
    "answer, stop calling tools and give the answer in the required format."
)
BOXED = "\nWhen the answer is final, do not call the tool again; write it as \\boxed{your final answer}."
NO_UNITS = "\nPut only the numerical value of the final answer inside \\boxed{}, without units."
SCIENCE_PREFIX = "Solve the following {domain} problem step by step.\n\n"
OPTION_LETTER = "\nInside \\boxed{} put only the uppercase letter of the correct option."
CODE_PREFIX = (
    "You are given a problem specification. Write a correct Python program that meets it and passes all "
    "tests.\n\n"
)
CODE_EXAMPLES = "\n\nExample inputs and their expected outputs:\n{examples}"
CODE_STDIN = (
    "\n\nRead the input from stdin, solve the problem and write the answer to stdout; do not hard-code the "
    "sample inputs."
)
CODE_SUBMIT = (
    "\nBefore submitting you may use the tool to test your code. Once you are sure it is correct, stop calling "
    "tools and submit the final program in one block:\n```python\n# YOUR CODE HERE\n```"
)


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
  """Text placed before and after the problem (the content of the last user message)."""

  prefix: str = ""
  suffix: str = ""

  def __post_init__(self):
    for field in ("prefix", "suffix"):
      for placeholder in re.findall(r"\{[a-z_]+\}", getattr(self, field)):
        if placeholder not in _PLACEHOLDERS:
          raise ValueError(f"PromptTemplate.{field}: unknown placeholder {placeholder} (use {_PLACEHOLDERS})")


DEFAULT_TEMPLATES: dict[str, PromptTemplate] = {
    "plain": PromptTemplate(),
    # Evaluation math (AIME): the row is a bare problem.
    "math": PromptTemplate(MATH_PREAMBLE + TOOL_HINT, AGENT_NOTE + BOXED),
    # RL math from mixed sources: answers must be bare numbers for the verifier.
    "math_units": PromptTemplate(MATH_PREAMBLE + TOOL_HINT, AGENT_NOTE + BOXED + NO_UNITS),
    # RL rows whose prompt already carries the instructions (DAPO-Math, MegaScience): only the units rule.
    "units_only": PromptTemplate("", NO_UNITS),
    "science": PromptTemplate(SCIENCE_PREFIX + TOOL_HINT, AGENT_NOTE + BOXED + OPTION_LETTER),
    "code_stdin": PromptTemplate(CODE_PREFIX, CODE_EXAMPLES + AGENT_NOTE + CODE_STDIN + CODE_SUBMIT),
    "code": PromptTemplate("", AGENT_NOTE + CODE_SUBMIT),
}

# (case-insensitive substring of data_source, template name); the first match wins.
DEFAULT_RULES: tuple[tuple[str, str], ...] = (
    ("aime", "math"),
    ("math_dapo", "units_only"),
    ("mega-science", "units_only"),
    ("gpqa", "science"),
    ("livecodebench", "code_stdin"),
    ("code", "code"),
)


@dataclasses.dataclass(frozen=True)
class PromptStyle:
  """Which template wraps which row.

  Attributes:
    templates: template name -> PromptTemplate.
    rules: `(substring, template name)` pairs tried in order against the lower-cased `data_source`.
    default: template for rows no rule matches (the reference treats them as math).
    max_examples: at most this many test cases rendered into `{examples}`; None renders all of them, as the
      reference does (long test inputs then make the prompt overlong, and the trainer filters it out).
  """

  templates: Mapping[str, PromptTemplate] = dataclasses.field(default_factory=lambda: dict(DEFAULT_TEMPLATES))
  rules: tuple[tuple[str, str], ...] = DEFAULT_RULES
  default: str = "math_units"
  max_examples: int | None = None

  def __post_init__(self):
    for pattern, name in self.rules:
      if not pattern or name not in self.templates:
        raise ValueError(f"PromptStyle.rules: ({pattern!r}, {name!r}) needs a non-empty pattern and a known "
                         f"template ({sorted(self.templates)})")
    if self.default not in self.templates:
      raise ValueError(f"PromptStyle.default: unknown template {self.default!r}")
    if self.max_examples is not None and self.max_examples < 1:
      raise ValueError(f"PromptStyle.max_examples must be >= 1 or None, got {self.max_examples}")

  def template_for(self, data_source: str) -> PromptTemplate:
    """The template a row with this `data_source` gets."""
    lowered = data_source.lower()
    for pattern, name in self.rules:
      if pattern.lower() in lowered:
        return self.templates[name]
    return self.templates[self.default]


def _render_examples(ground_truth: str, max_examples: int | None) -> str:
  try:
    tests = json.loads(ground_truth)
    pairs = list(zip(tests["inputs"], tests["outputs"]))
  except (ValueError, KeyError, TypeError):
    return ""
  return "\n".join(f"Input:\n{i}\nOutput:\n{o}" for i, o in pairs[:max_examples])


def apply_prompt_style(record: rec.PromptRecord, style: PromptStyle) -> rec.PromptRecord:
  """Wraps the last user message of `record` in the template its `data_source` selects.

  Args:
    record: a record as built (its last user message is the bare problem).
    style: the wording config.

  Returns:
    A new record; the input is not modified.
  """
  template = style.template_for(record.data_source)
  if not template.prefix and not template.suffix:
    return record
  fill = {"{domain}": str(record.extra_info.get("domain", "science"))}
  if "{examples}" in template.prefix + template.suffix:
    fill["{examples}"] = _render_examples(record.ground_truth, style.max_examples)

  def render(text: str) -> str:
    for placeholder, value in fill.items():
      text = text.replace(placeholder, value)
    return text

  prompt = [dict(m) for m in record.prompt]
  users = [i for i, m in enumerate(prompt) if m["role"] == "user"]
  if not users:
    raise ValueError(f"record {record.index} ({record.data_source}) has no user message to style")
  last_user = users[-1]
  prompt[last_user]["content"] = render(template.prefix) + prompt[last_user]["content"] + render(template.suffix)
  return dataclasses.replace(record, prompt=prompt)
