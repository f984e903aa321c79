"""Hermes tool-call parser: well-formed calls, every malformed kind, and never raising on arbitrary text."""

import json

from hypothesis import given, settings, strategies as st

from agentrl_jax.rollout.parser import ToolCall, parse_tool_calls


def block(obj) -> str:
  body = obj if isinstance(obj, str) else json.dumps(obj)
  return f"<tool_call>\n{body}\n</tool_call>"


def test_well_formed_calls():
  text = "Let me check.\n" + block({"name": "code_interpreter", "arguments": {"code": "print(1)"}})
  (c,) = parse_tool_calls(text)
  assert c.ok and c.name == "code_interpreter" and c.code == "print(1)"
  # arguments given as a JSON string (some models do this)
  (c,) = parse_tool_calls(block({"name": "code_interpreter", "arguments": json.dumps({"code": "x = 1"})}))
  assert c.ok and c.code == "x = 1"
  two = parse_tool_calls(block({"name": "code_interpreter", "arguments": {"code": "a"}}) + " and "
                         + block({"name": "code_interpreter", "arguments": {"code": "b"}}))
  assert [c.code for c in two] == ["a", "b"]
  assert parse_tool_calls("no tools here, just <b>html</b>") == []


def test_malformed_calls_have_messages():
  cases = {
      block('{"name": "code_interpreter", "arguments": {"code": "1"'): "not valid JSON",
      block("[1, 2]"): "must be a JSON object",
      block({"arguments": {"code": "1"}}): "no \"name\"",
      block({"name": "python", "arguments": {"code": "1"}}): "unknown tool 'python'",
      block({"name": "code_interpreter", "arguments": {}}): "requires the argument 'code'",
      block({"name": "code_interpreter", "arguments": {"code": 5}}): "must be a string",
      block({"name": "code_interpreter", "arguments": "{oops"}): "not valid JSON",
      block({"name": "code_interpreter", "arguments": [1]}): "must be a JSON object",
      "<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"1\"}}": "unterminated",
      "stray end</tool_call>": "without a matching",
  }
  for text, needle in cases.items():
    calls = parse_tool_calls(text)
    assert len(calls) == 1, text
    assert not calls[0].ok and needle in calls[0].error and calls[0].error.startswith("Error:"), (text, calls)
    assert calls[0].code == ""


def test_custom_tools_and_required_arguments():
  (c,) = parse_tool_calls(block({"name": "search", "arguments": {"q": "x"}}), tools=("search",),
                          required={"search": ("q",)})
  assert c.ok and c.arguments == {"q": "x"}


_FRAGMENTS = st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', ":", ",", '"code"',
                              '"arguments"', '"code_interpreter"', "\n", "\\", '"', "null", "1e999", "<|im_end|>"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_FRAGMENTS, st.text(max_size=20)), max_size=40))
def test_parser_never_raises(pieces):
  calls = parse_tool_calls("".join(pieces))
  assert isinstance(calls, list)
  for c in calls:
    assert isinstance(c, ToolCall)
    assert c.ok == (c.error is None)
    assert c.ok or c.error.startswith("Error:")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parser_never_raises_on_any_text(text):
  assert isinstance(parse_tool_calls(text), list)
  assert isinstance(parse_tool_calls("<tool_call>" + text + "</tool_call>"), list)


def test_deeply_nested_json_does_not_raise():
  (c,) = parse_tool_calls("<tool_call>" + "[" * 100000 + "]" * 100000 + "</tool_call>")
  assert not c.ok
