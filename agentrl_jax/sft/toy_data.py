"""Tiny SFT conversations generated locally (the `:smoke` config and the tests): arithmetic with a code tool.

Every conversation is one end-to-end tool-use episode in the recipe's SFT schema (`messages`, `tools`): the user
asks for a product, the assistant calls `code_interpreter`, the tool prints the result, the assistant answers
in `\\boxed{}`. Deterministic for a seed. `malformed` extra rows (a tool turn before any assistant turn, an
empty assistant turn) exercise the trainer's skip-and-count path.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

from agentrl_jax.tools.code_interpreter import TOOL_SCHEMA


def conversation(a: int, b: int) -> list[dict[str, Any]]:
  """One tool-use episode computing `a * b`."""
  code = f"print({a} * {b})"
  call = {"type": "function", "function": {"name": "code_interpreter", "arguments": json.dumps({"code": code})}}
  return [
      {"role": "system", "content": "You can run Python."},
      {"role": "user", "content": f"What is {a} * {b}?"},
      {"role": "assistant", "content": "Let me compute it.", "tool_calls": [call]},
      {"role": "tool", "content": f"{a * b}\n"},
      {"role": "assistant", "content": f"The answer is \\boxed{{{a * b}}}."},
  ]


def malformed_conversations() -> list[list[dict[str, Any]]]:
  """Rows that pass the dataset schema but that SFT must skip (with a message), never crash on."""
  return [
      [{"role": "user", "content": "Hi."}, {"role": "tool", "content": "1\n"},
       {"role": "assistant", "content": "Hello."}],
      [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": ""}],
  ]


def rows(num: int, *, seed: int = 0, malformed: int = 0, tools: bool = True) -> list[dict[str, Any]]:
  """`num` well-formed rows (+ `malformed` bad ones at fixed places) in the SFT schema.

  `tools=False` leaves the tool schema out of the rows (the calls and results stay): the template's tool
  instructions are most of a short conversation's tokens, so tests that train long drop them.
  """
  rng = random.Random(seed)
  schemas = [TOOL_SCHEMA] if tools else []
  out = [{"messages": conversation(rng.randint(2, 99), rng.randint(2, 99)), "tools": schemas} for _ in range(num)]
  bad = malformed_conversations()
  for i in range(malformed):
    out.insert((i * 7 + 3) % (len(out) + 1), {"messages": bad[i % len(bad)], "tools": schemas})
  return out


def write_jsonl(path: str | os.PathLike, num: int, *, seed: int = 0, malformed: int = 0, tools: bool = True) -> str:
  """Writes `rows(...)` as JSONL (readable by `data.prepare(SourceConfig(schema="sft", ...))`)."""
  path = os.fspath(path)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    for row in rows(num, seed=seed, malformed=malformed, tools=tools):
      f.write(json.dumps(row) + "\n")
  return path
