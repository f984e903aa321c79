"""The `code_interpreter` tool: its schema, how a call's code is prepared, and the text the model sees back.

    tokenizer.apply_chat_template(messages, tools=[TOOL_SCHEMA], ...)        # advertise the tool
    code, error = parse_arguments(call["arguments"])                         # None + message if malformed
    result = executor.submit(prepare_code(code)).result()                    # fence strip + show last value
    tool_text = format_result(result, max_chars=4096)                       # goes in <tool_response>
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from agentrl_jax.tools.base import ExecResult
from agentrl_jax.tools import pyast

TOOL_NAME = "code_interpreter"
# The recipe's schema (sandbox_fusion_tool_config.yaml), as HF chat templates expect it in `tools=[...]`.
TOOL_SCHEMA: dict = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The code to execute."},
            },
            "required": ["code"],
        },
    },
}

_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_LAST_VALUE = "__agentrl_last__"
_NO_OUTPUT = "(no output)"


def parse_arguments(arguments: Any) -> tuple[str | None, str]:
  """The `code` of a tool call's arguments (a dict or its JSON text).

  Returns:
    (code, '') for a well-formed call, else (None, a message telling the model what was wrong) so a malformed
    call becomes a tool response instead of an exception.
  """
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments)
    except ValueError as e:
      return None, f"Tool error: the arguments of {TOOL_NAME} are not valid JSON ({e})."
  if not isinstance(arguments, dict):
    return None, f'Tool error: {TOOL_NAME} takes a JSON object like {{"code": "print(1)"}}.'
  code = arguments.get("code")
  if not isinstance(code, str):
    return None, f'Tool error: {TOOL_NAME} needs a string argument "code".'
  if not code.strip():
    return None, f"Tool error: the code passed to {TOOL_NAME} is empty."
  return code, ""


def strip_fences(code: str) -> str:
  """Returns the code inside ```python fences (all blocks joined, an unclosed last one included), or `code`."""
  blocks = _FENCE_RE.findall(code)
  if not blocks:
    return code
  return "\n".join(b.rstrip() for b in blocks) + "\n"


def prepare_code(code: str) -> str:
  """Makes a tool call's code runnable as a script that shows its result like a notebook cell.

  Strips Markdown fences; if the last top-level statement is a bare expression (decided with `ast`, so an
  indented last line, an assignment or a multi-line call is handled correctly), its value is printed unless it
  is None. The rewrite stays on the expression's own lines, so traceback line numbers still match the code the
  model wrote. Code that does not parse is returned fence-stripped but otherwise unchanged: running it shows the
  model its SyntaxError.

  Args:
    code: the `code` argument of a tool call.

  Returns:
    The program to execute.
  """
  if not isinstance(code, str):
    code = str(code)
  code = strip_fences(code)
  try:
    tree = pyast.parse(code)
  except (SyntaxError, ValueError, MemoryError, RecursionError):
    return code
  if not tree.body or not isinstance(tree.body[-1], ast.Expr):
    return code
  node = tree.body[-1].value
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
    return code  # already shows itself; leave the model's line as written
  lines = code.splitlines(keepends=True)
  # ast offsets are UTF-8 byte columns; convert the start/end (line, col) into string offsets.
  starts = [0]
  for line in lines:
    starts.append(starts[-1] + len(line))

  def offset(lineno: int, col: int) -> int:
    line = lines[lineno - 1]
    return starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))

  begin, end = offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)
  expr = code[begin:end]
  shown = f"print({_LAST_VALUE}) if ({_LAST_VALUE} := ({expr})) is not None else None"
  new = code[:begin] + shown + code[end:]
  try:
    pyast.parse(new)
  except (SyntaxError, ValueError, MemoryError, RecursionError):
    return code
  return new


def truncate_middle(text: str, max_chars: int) -> str:
  """Shortens `text` to at most `max_chars` characters by replacing its middle with a marker.

  The head and tail are kept because both matter to the model: the first results and the last lines (where a
  traceback or a final answer is).
  """
  if max_chars <= 0:
    return ""
  if len(text) <= max_chars:
    return text
  marker = f"\n... [{len(text) - max_chars} characters truncated] ...\n"
  if len(marker) >= max_chars:
    return text[:max_chars]
  # Recompute with the exact number dropped once the marker's own length is known.
  keep = max_chars - len(marker)
  marker = f"\n... [{len(text) - keep} characters truncated] ...\n"
  keep = max(0, max_chars - len(marker))
  head = (keep + 1) // 2
  return text[:head] + marker + text[len(text) - (keep - head):]


def format_result(result: ExecResult, max_chars: int = 4096) -> str:
  """The text the model reads for one execution (the content of its tool response).

  stdout first, then stderr (tracebacks, warnings, the sandbox's `[sandbox] ...` note of what it did), then a
  line naming the outcome when it was not a normal exit: time limit, memory limit, killed, sandbox failure.

  Args:
    result: the execution.
    max_chars: cap on the returned text; longer text keeps its head and tail.
  """
  parts = []
  if result.stdout:
    parts.append(result.stdout.rstrip("\n"))
  if result.stderr.strip():
    parts.append(result.stderr.rstrip("\n"))
  status_line = {
      "timeout": "Execution stopped: time limit exceeded.",
      "memory": "Execution stopped: memory limit exceeded.",
      "killed": "Execution stopped: the process was killed"
                + (f" (signal {-result.exit_code})." if result.exit_code is not None and result.exit_code < 0
                   else "."),
      "sandbox_error": "Tool error: the code could not be executed (sandbox failure); this is not a bug in the code.",
  }.get(result.status)
  if status_line:
    parts.append(status_line)
  elif result.status == "error" and not result.stderr.strip():
    parts.append(f"Process exited with code {result.exit_code}.")
  text = "\n".join(parts) if parts else _NO_OUTPUT
  return truncate_middle(text, max_chars)
