"""Hermes tool-call parser: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks in model text.

Never raises: every malformed call becomes a `ToolCall` with `error` set, whose message is what the model reads
back in its tool response (so it can correct itself).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection

from agentrl_jax.models.tokenizer import TOOL_CALL, TOOL_CALL_END

_BLOCK_RE = re.compile(re.escape(TOOL_CALL) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)
_MAX_ECHO = 200  # characters of offending text quoted back in an error message


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One `<tool_call>` block of a turn.

  Attributes:
    name: the tool's name ("" when it could not be read).
    arguments: the parsed arguments (empty when malformed).
    error: None for a well-formed call of a known tool with its required arguments, else a message for the
      model saying what is wrong.
    raw: the block's text between the tags.
  """

  name: str
  arguments: dict
  error: str | None
  raw: str

  @property
  def ok(self) -> bool:
    return self.error is None

  @property
  def code(self) -> str:
    return self.arguments.get("code", "") if self.ok else ""


def _echo(text: str) -> str:
  text = text.strip()
  return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."


def _parse_block(raw: str, tools: Collection[str], required: dict[str, tuple[str, ...]]) -> ToolCall:
  body = raw.strip()
  try:
    obj = json.loads(body)
  except (ValueError, RecursionError) as e:
    return ToolCall("", {}, f"Error: the tool call is not valid JSON ({e}). Write it as "
                    '{"name": "<tool>", "arguments": {...}}. Got: ' + _echo(body), raw)
  if not isinstance(obj, dict):
    return ToolCall("", {}, "Error: the tool call must be a JSON object with \"name\" and \"arguments\". Got: "
                    + _echo(body), raw)
  name = obj.get("name")
  if not isinstance(name, str) or not name:
    return ToolCall("", {}, "Error: the tool call has no \"name\" string. Got: " + _echo(body), raw)
  if name not in tools:
    return ToolCall(name, {}, f"Error: unknown tool {_echo(name)!r}; available tools: {', '.join(sorted(tools))}.",
                    raw)
  args = obj.get("arguments", {})
  if isinstance(args, str):  # some models emit the arguments as a JSON string
    try:
      args = json.loads(args)
    except (ValueError, RecursionError) as e:
      return ToolCall(name, {}, f"Error: the \"arguments\" string of {name} is not valid JSON ({e}).", raw)
  if not isinstance(args, dict):
    return ToolCall(name, {}, f"Error: \"arguments\" of {name} must be a JSON object.", raw)
  for arg in required.get(name, ()):
    if arg not in args:
      return ToolCall(name, {}, f"Error: {name} requires the argument {arg!r} (a string).", raw)
    if not isinstance(args[arg], str):
      return ToolCall(name, {}, f"Error: the argument {arg!r} of {name} must be a string, got "
                      f"{type(args[arg]).__name__}.", raw)
  return ToolCall(name, args, None, raw)


def parse_tool_calls(text: str, tools: Collection[str] = ("code_interpreter",),
                     required: dict[str, tuple[str, ...]] | None = None) -> list[ToolCall]:
  """Every tool call in an assistant turn's text, in order, malformed ones included.

  Args:
    text: the turn's text.
    tools: names of the known tools.
    required: required string arguments per tool (default: `code` for code_interpreter).

  Returns:
    A list of `ToolCall`s: one per complete `<tool_call>...</tool_call>` block, plus an error entry for an
    unterminated `<tool_call>` at the end or a `</tool_call>` without an opening tag. Empty when the text holds
    no tool-call markup.
  """
  if required is None:
    required = {"code_interpreter": ("code",)}
  try:
    calls: list[ToolCall] = []
    pos = 0
    for m in _BLOCK_RE.finditer(text):
      if TOOL_CALL_END in text[pos:m.start()]:
        calls.append(ToolCall("", {}, f"Error: found {TOOL_CALL_END} without a matching {TOOL_CALL}.", ""))
      calls.append(_parse_block(m.group(1), tools, required))
      pos = m.end()
    rest = text[pos:]
    if TOOL_CALL_END in rest:
      calls.append(ToolCall("", {}, f"Error: found {TOOL_CALL_END} without a matching {TOOL_CALL}.", ""))
    elif TOOL_CALL in rest:
      tail = rest[rest.index(TOOL_CALL) + len(TOOL_CALL):]
      calls.append(ToolCall("", {}, f"Error: unterminated tool call: {TOOL_CALL} was not closed with "
                            f"{TOOL_CALL_END}.", tail))
    return calls
  except Exception as e:  # pylint: disable=broad-except  # the loop must survive any text
    return [ToolCall("", {}, f"Error: could not parse the tool call ({type(e).__name__}).", "")]
