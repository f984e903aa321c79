"""Rows in the recipe's published schemas, written to parquet by the data tests (the real sets live on a hub)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python code and return its stdout.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}


def write_parquet(path, rows):
  """Writes rows (dicts) as parquet; pyarrow infers nested list/struct columns as the hub files have them."""
  pq.write_table(pa.Table.from_pylist(rows), path)
  return str(path)


def sft_rows():
  call = {"type": "function", "function": {"name": "code_interpreter", "arguments": json.dumps({"code": "print(6*7)"})}}
  return [
      {
          "messages": [
              {"role": "system", "content": "You can run Python.", "tool_calls": None},
              {"role": "user", "content": "What is 6*7?", "tool_calls": None},
              {"role": "assistant", "content": "Let me compute.", "tool_calls": [call]},
              {"role": "tool", "content": "42\n", "tool_calls": None},
              {"role": "assistant", "content": "The answer is \\boxed{42}.", "tool_calls": None},
          ],
          "tools": json.dumps([TOOL_SCHEMA]),
      },
      {
          "messages": [
              {"role": "user", "content": "Say hi.", "tool_calls": None},
              {"role": "assistant", "content": "hi", "tool_calls": None},
          ],
          "tools": json.dumps([TOOL_SCHEMA]),
      },
  ]


def rl_rows():
  return [
      {
          "data_source": "math_dapo",
          "prompt": [{"role": "user", "content": "Compute 1+1."}],
          "ability": "MATH",
          "reward_model": {"ground_truth": "2", "style": "rule"},
          "extra_info": {"index": 0, "split": "train"},
      },
      {
          "data_source": "skywork_code",
          "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Echo the input."}],
          "ability": "CODE",
          "reward_model": {"ground_truth": json.dumps({"inputs": ["a\n"], "outputs": ["a\n"]}), "style": "rule"},
          "extra_info": {"index": 1, "split": "train"},
      },
      {
          "data_source": "orz_math",
          "prompt": [{"role": "user", "content": "Compute 2+2."}],
          "ability": "MATH",
          "reward_model": {"ground_truth": "4", "style": "rule"},
          "extra_info": {"index": 2, "split": "train"},
      },
  ]


def aime2024_rows():
  return [
      {"ID": "2024-I-1", "Problem": "Find 204.", "Solution": "It is 204.", "Answer": 204},
      {"ID": "2024-I-8", "Problem": "Find 25.", "Solution": "It is 25.", "Answer": 25},
  ]


def aime2025_rows():
  return [
      {"id": 0, "problem": "Find 70.", "answer": "70"},
      {"id": 1, "problem": "Find 5.", "answer": "005"},
  ]


def gpqa_rows():
  return [
      {"problem": "Which is a noble gas?\nA) Ne\nB) Na\nC) N\nD) Ni", "solution": "A", "domain": "Chemistry",
       "data_source": "gpqa_diamond"},
      {"problem": "Unit of force?\nA) J\nB) N\nC) W\nD) Pa", "solution": "B", "domain": "Physics",
       "data_source": "gpqa_diamond"},
  ]


def lcb_rows():
  tests = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}
  return [
      {"problem": "Read two integers and print their sum.", "data_source": "LiveCodeBench_v6", "ability": "code",
       "reward_model": json.dumps({"ground_truth": tests, "style": "rule"}),
       "extra_info": json.dumps({"question_id": "abc001_a", "difficulty": "easy"})},
  ]


ROWS = {
    "sft": sft_rows,
    "rl": rl_rows,
    "aime2024": aime2024_rows,
    "aime2025": aime2025_rows,
    "gpqa_diamond": gpqa_rows,
    "livecodebench_v6": lcb_rows,
}
