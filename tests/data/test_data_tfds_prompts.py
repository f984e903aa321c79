"""Per-source prompt wording is config and is chosen per ROW by data_source (also within one mixed file)."""

from __future__ import annotations

import json

import pytest

from agentrl_jax.data import prompts
from agentrl_jax.data.records import PromptRecord


def _record(data_source, problem="PROBLEM", ground_truth="1", extra_info=None, prompt=None):
  return PromptRecord(prompt=prompt or [{"role": "user", "content": problem}], data_source=data_source,
                      ground_truth=ground_truth, extra_info=extra_info or {}, index=0)


def _content(record, style=prompts.PromptStyle()):
  return prompts.apply_prompt_style(record, style).prompt[-1]["content"]


def test_tfds_prompt_style_per_row_by_data_source():
  style = prompts.PromptStyle()
  aime = _content(_record("AIME2024"), style)
  assert aime.startswith(prompts.MATH_PREAMBLE) and "PROBLEM" in aime and aime.endswith(prompts.BOXED)
  assert _content(_record("math_dapo")) == "PROBLEM" + prompts.NO_UNITS
  assert _content(_record("orz_math")).endswith(prompts.NO_UNITS)  # default: math with the units rule
  gpqa = _content(_record("gpqa_diamond", extra_info={"domain": "Physics"}))
  assert gpqa.startswith("Solve the following Physics problem") and gpqa.endswith(prompts.OPTION_LETTER)
  assert _content(_record("skywork_code")).endswith("# YOUR CODE HERE\n```")


def test_tfds_prompt_style_code_examples_and_limit():
  tests = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
  lcb = _content(_record("LiveCodeBench_v6", ground_truth=tests))
  assert lcb.startswith(prompts.CODE_PREFIX + "PROBLEM")
  assert "Input:\n1 2\n\nOutput:\n3\n" in lcb and "3 4" in lcb
  one = _content(_record("LiveCodeBench_v6", ground_truth=tests), prompts.PromptStyle(max_examples=1))
  assert "1 2" in one and "3 4" not in one


def test_tfds_prompt_style_wraps_last_user_message_only():
  prompt = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "PROBLEM"}]
  record = _record("math_dapo", prompt=prompt)
  styled = prompts.apply_prompt_style(record, prompts.PromptStyle())
  assert styled.prompt[0] == {"role": "system", "content": "SYS"}
  assert record.prompt[1]["content"] == "PROBLEM"  # the input record is untouched


def test_tfds_prompt_style_is_config():
  custom = prompts.PromptStyle(templates={"mine": prompts.PromptTemplate("<", "> \\boxed{}")}, rules=(),
                               default="mine")
  assert _content(_record("AIME2024"), custom) == "<PROBLEM> \\boxed{}"


@pytest.mark.parametrize("kwargs, field", [
    ({"rules": (("aime", "nope"),)}, "rules"),
    ({"default": "nope"}, "default"),
    ({"max_examples": 0}, "max_examples"),
])
def test_tfds_prompt_style_validates(kwargs, field):
  with pytest.raises(ValueError, match=field):
    prompts.PromptStyle(**kwargs)
  with pytest.raises(ValueError, match="placeholder"):
    prompts.PromptTemplate(prefix="{problem}")
