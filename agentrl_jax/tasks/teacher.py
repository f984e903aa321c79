"""Scripted teacher for the embedded arithmetic task: real end-to-end tool-use trajectories for SFT.

The teacher writes the code a good agent would write, the code runs in the real sandbox (the executor), and
the answer is read from the real output, as the recipe asks of SFT data: nothing is stitched in afterwards.
Some trajectories contain a deliberate mistake (a syntax error or an undefined name) followed by a fix, so
the model also sees how to recover from a failed call.
"""

from __future__ import annotations

import json
import random

from agentrl_jax.tasks.arithmetic import Problem
from agentrl_jax.tools.code_interpreter import TOOL_SCHEMA, format_result

TOOL_NAME = "code_interpreter"


def tool_call_text(expression: str) -> str:
  """The hermes tool-call text for `print(expression)`, exactly as the chat template renders it."""
  args = json.dumps({"code": f"print({expression})"}, ensure_ascii=False)  # as HF's `tojson` renders it
  return f'<tool_call>\n{{"name": "{TOOL_NAME}", "arguments": {args}}}\n</tool_call>'


def call(code: str) -> dict:
  """A structured `tool_calls` entry running `code` (what the chat template renders as a hermes call)."""
  return {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": code}}}


def _buggy(rng: random.Random, expression: str) -> str:
  if rng.random() < 0.5:
    return f"print({expression}"  # SyntaxError: '(' was never closed
  return f"print({expression} + offset)"  # NameError


STYLES = ("deliberative", "frequent")


def steps(problem: Problem, style: str) -> list[str]:
  """The expressions the teacher evaluates with the tool, in order (empty: it answers directly).

  deliberative: one call with the whole expression for levels >= 2 (level 1 in `conversation`, by chance).
  frequent: a call for every problem, and one call per operation of a compound expression; later steps use
  the numbers the earlier calls printed, so every intermediate result is read back from the tool.
  """
  if style == "deliberative":
    return [problem.expression] if problem.level >= 2 else []
  if problem.level == 3:
    left, right = problem.expression[1:-1].split(")*(")
    return [left, right, "{0}*{1}"]
  return [problem.expression]


def conversation(problem: Problem, executor, rng: random.Random, *, p_direct: float = 0.5,
                 p_mistake: float = 0.15, style: str = "deliberative") -> dict | None:
  """One SFT conversation `{'messages': [...], 'tools': [TOOL_SCHEMA]}` for `problem`, or None on a tool failure.

  With the deliberative style, level 0 is answered directly, harder levels call the tool once for the whole
  expression, except that an addition (level 1) is answered from the teacher's own arithmetic with probability
  `p_direct`: exact for the teacher, out of reach of a small student, which has to learn in RL that the tool
  is needed there. The frequent style calls the tool for every
  problem and once per operation. A call is preceded by a deliberate mistake (a real failing run, then the
  fix) with probability `p_mistake`.
  """
  if style not in STYLES:
    raise ValueError(f"teacher.conversation: style must be one of {STYLES}, got {style!r}")
  messages = [{"role": "user", "content": problem.question}]
  plan = steps(problem, style)
  if style == "deliberative" and problem.level == 1 and rng.random() >= p_direct:
    plan = [problem.expression]
  if not plan:
    messages.append({"role": "assistant", "content": f"The answer is \\boxed{{{problem.answer}}}."})
    return {"messages": messages, "tools": [TOOL_SCHEMA]}
  outputs: list[str] = []
  for step in plan:
    expression = step.format(*outputs)
    codes = [f"print({expression})"]
    if problem.level >= 2 and rng.random() < p_mistake:
      codes.insert(0, _buggy(rng, expression))
    results = executor.run_batch(codes)
    for i, (code, result) in enumerate(zip(codes, results)):
      last = i == len(codes) - 1
      if last and (result.status != "ok" or not result.stdout.strip()):
        return None  # the sandbox failed on correct code: do not teach from a broken trajectory
      if not last and result.status == "ok":
        return None  # the deliberate mistake did not fail; skip rather than teach a confusing transcript
      messages.append({"role": "assistant", "content": "Let me fix the code." if i else "",
                       "tool_calls": [call(code)]})
      messages.append({"role": "tool", "content": format_result(result, 2048)})
    outputs.append(results[-1].stdout.strip().splitlines()[-1])
  messages.append({"role": "assistant", "content": f"The answer is \\boxed{{{outputs[-1]}}}."})
  return {"messages": messages, "tools": [TOOL_SCHEMA]}


def conversations(problems: list[Problem], executor, *, seed: int = 0, **kwargs) -> list[dict]:
  """Teacher conversations for `problems` (those whose tool call failed in the sandbox are dropped)."""
  rng = random.Random(seed)
  out = [conversation(p, executor, rng, **kwargs) for p in problems]
  return [c for c in out if c is not None]


def write_sft_parquet(path: str, convs: list[dict]) -> str:
  """Writes conversations in the recipe's SFT parquet schema (`messages`, `tools` as JSON text)."""
  import pandas as pd

  rows = [{"messages": c["messages"], "tools": json.dumps(c["tools"])} for c in convs]
  pd.DataFrame(rows).to_parquet(path)
  return path
