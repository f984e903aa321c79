"""The code_interpreter tool: schema rendering, code preparation (fences, final expression), output formatting."""

from __future__ import annotations

import ast

import hypothesis
import pytest
import transformers
from hypothesis import strategies as st
from tokenizers import Tokenizer, models

from agentrl_jax.models.tokenizer import CHAT_TEMPLATE
from agentrl_jax.tools import TOOL_SCHEMA, ExecResult, format_result, parse_arguments, prepare_code, truncate_middle
from tests.tools.sandbox_testing import needs_bwrap

FAST = hypothesis.settings(max_examples=200, deadline=None, derandomize=True)


def test_schema_renders_in_a_hf_chat_template():
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")), chat_template=CHAT_TEMPLATE)
  text = tok.apply_chat_template([{"role": "user", "content": "What is 2**100?"}], tools=[TOOL_SCHEMA],
                                 tokenize=False, add_generation_prompt=True)
  assert '"name": "code_interpreter"' in text and '"code": {"type": "string"' in text
  assert TOOL_SCHEMA["function"]["parameters"]["required"] == ["code"]


@pytest.mark.parametrize("code, expected", [
    ("1 + 1", "print(__agentrl_last__) if (__agentrl_last__ := (1 + 1)) is not None else None"),
    ("x = 5", "x = 5"),                                           # assignment: nothing to show
    ("for i in range(3):\n    i * 2", "for i in range(3):\n    i * 2"),   # indented last line is not top level
    ("print(3)", "print(3)"),
    ("def f(:", "def f(:"),                                       # unparsable: the model sees its SyntaxError
    ("x = 1; x", "x = 1; print(__agentrl_last__) if (__agentrl_last__ := (x)) is not None else None"),
])
def test_prepare_code_cases(code, expected):
  assert prepare_code(code) == expected


def test_prepare_code_strips_fences():
  assert prepare_code("```python\nimport math\nmath.sqrt(16)\n```") == (
      "import math\nprint(__agentrl_last__) if (__agentrl_last__ := (math.sqrt(16))) is not None else None\n")
  assert prepare_code("```py\nx = 2\n```\ntext\n```python\ny = 3\n```") == "x = 2\ny = 3\n"
  assert prepare_code("```python\nz = 1\nz") .endswith("(z)) is not None else None\n")  # unclosed fence
  assert prepare_code("plain = 1") == "plain = 1"


@needs_bwrap
def test_prepared_code_behaves_like_a_notebook_cell(pool):
  cases = {
      "import math\nmath.factorial(5)": "120\n",
      "d = {'a': 1}\nd['a'] + \\\n  41": "42\n",
      "def f():\n  return 7\nf(\n)": "7\n",
      "[].append(1)": "",                                           # None is not shown
      "'caf\u00e9'.upper()": "CAF\u00c9\n",
      "x = 3\nif x:\n  x * 2": "",                                  # indented last line: not a bare top-level expr
  }
  results = pool.run_batch([prepare_code(c) for c in cases])
  assert [r.stdout for r in results] == list(cases.values())
  # Line numbers of the model's code survive the rewrite.
  r = pool.submit(prepare_code("a = 1\nb = 0\na / b")).result()
  assert 'line 3' in r.stderr and "ZeroDivisionError" in r.stderr


@FAST
@hypothesis.given(st.text(max_size=300))
def test_prepare_code_never_raises_and_keeps_valid_code_valid(text):
  out = prepare_code(text)
  try:
    ast.parse(text)
  except (SyntaxError, ValueError):
    return
  if "```" not in text:
    ast.parse(out)


@FAST
@hypothesis.given(st.text(max_size=500), st.integers(0, 200))
def test_truncate_middle_bounds_and_keeps_ends(text, max_chars):
  out = truncate_middle(text, max_chars)
  assert len(out) <= max_chars
  if len(text) <= max_chars:
    assert out == text
  elif max_chars >= 60:
    assert "characters truncated" in out
    assert out.startswith(text[:10]) and out.endswith(text[-10:])


def test_truncate_middle_reports_the_dropped_count():
  out = truncate_middle("x" * 50 + "y" * 50, 60)
  dropped = int(out.split("[")[1].split(" ")[0])
  assert len(out) == 60 and out.count("x") + out.count("y") == 100 - dropped


def test_format_result_per_status():
  assert format_result(ExecResult("ok", "42\n", "", 0)) == "42"
  assert format_result(ExecResult("ok", "", "", 0)) == "(no output)"
  tb = "Traceback (most recent call last):\n  File \"/tmp/main.py\", line 1\nZeroDivisionError: division by zero\n"
  assert format_result(ExecResult("error", "partial\n", tb, 1)) == "partial\n" + tb.rstrip()
  assert format_result(ExecResult("error", "", "", 2)) == "Process exited with code 2."
  assert format_result(ExecResult("timeout", "", "[sandbox] wall-clock limit of 5 s exceeded")).endswith(
      "Execution stopped: time limit exceeded.")
  assert "memory limit" in format_result(ExecResult("memory", "", "MemoryError", 1))
  assert "(signal 11)" in format_result(ExecResult("killed", "", "", -11))
  assert "sandbox failure" in format_result(ExecResult("sandbox_error", "", "bwrap: boom"))
  long = format_result(ExecResult("ok", "x" * 10_000, "", 0), max_chars=500)
  assert len(long) <= 500 and "characters truncated" in long


def test_parse_arguments_turns_malformed_calls_into_messages():
  assert parse_arguments({"code": "print(1)"}) == ("print(1)", "")
  assert parse_arguments('{"code": "x = 1"}') == ("x = 1", "")
  for bad, fragment in [('{"code": ', "not valid JSON"), ("[1]", "JSON object"), ({"cod": "x"}, '"code"'),
                        ({"code": 5}, '"code"'), ({"code": "  "}, "empty"), (None, "JSON object")]:
    code, message = parse_arguments(bad)
    assert code is None and fragment in message and message.startswith("Tool error")
