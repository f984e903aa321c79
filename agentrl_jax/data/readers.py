"""Source readers: rows of a local parquet / JSONL file in a published schema -> normalised records.

One normaliser per schema turns a row (a plain dict) into a `PromptRecord` or `Conversation`, or raises
`MalformedRow` with a short reason; `read_records` adds the file and row index and either raises `ValueError`
or, with `skip_malformed`, skips and counts the row.

Schemas (the recipe's files and the evaluation sets in their published forms):
  sft:              `messages` (system/user/assistant/tool), `tools` (tool schemas, nested or JSON text).
  rl:               `prompt` (messages), `data_source`, `reward_model.ground_truth`, `extra_info`.
  aime2024/aime2025: `Problem`/`problem`, `Answer`/`answer` (int or string, leading zeros allowed); JSONL rows
                    may also carry `id`, `solution`, `url`, which go to `extra_info`.
  gpqa_diamond:     `problem` (question with lettered options), `solution` (the letter), `domain`.
  livecodebench_v6: `problem`, `reward_model` (JSON text: `{'ground_truth': {'inputs': [...], 'outputs':
                    [...]}}`), `extra_info` (JSON text).
A `data_source` column, when present, wins over the schema's default name (the prompt wording and the reward
are chosen per row by it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agentrl_jax.data import records as rec

Record = rec.PromptRecord | rec.Conversation
Normaliser = Callable[[Mapping[str, Any], int, str], Record]


@dataclasses.dataclass(frozen=True)
class Schema:
  """How to read one published format.

  Attributes:
    name: schema name used in configs.
    kind: 'prompt' (-> PromptRecord) or 'conversation' (-> Conversation).
    default_data_source: data_source of rows that carry none ('' = the column is required).
    normalise: `(row, index, default_data_source) -> record`, raising MalformedRow.
  """

  name: str
  kind: str
  default_data_source: str
  normalise: Normaliser


# ------------------------------------------------------------------------------------------------------------
# Row iteration
# ------------------------------------------------------------------------------------------------------------


def iter_rows(path: str) -> Iterator[tuple[int, Mapping[str, Any] | rec.MalformedRow]]:
  """Yields `(row_index, row)` from a parquet or JSONL file; an unparsable JSONL line yields a MalformedRow.

  Raises:
    ValueError: the file is missing, has an unknown extension or is not readable as parquet.
  """
  if not os.path.isfile(path):
    raise ValueError(f"{path}: no such file")
  if path.endswith(".parquet"):
    yield from _iter_parquet(path)
  elif path.endswith(".jsonl"):
    yield from _iter_jsonl(path)
  else:
    raise ValueError(f"{path}: unknown file type (expected .parquet or .jsonl)")


def _iter_parquet(path: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
  try:
    file = pq.ParquetFile(path)
  except (pa.ArrowException, OSError) as e:
    raise ValueError(f"{path}: not a readable parquet file ({e})") from None
  index = 0
  # Batches keep memory flat on the 30K-row RL file; to_pylist gives plain Python values (no numpy arrays).
  for batch in file.iter_batches(batch_size=512):
    for row in batch.to_pylist():
      yield index, row
      index += 1


def _iter_jsonl(path: str) -> Iterator[tuple[int, Mapping[str, Any] | rec.MalformedRow]]:
  index = 0
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        row = rec.MalformedRow(f"line {line_number} is not valid JSON ({e})")
      if not isinstance(row, (dict, rec.MalformedRow)):
        row = rec.MalformedRow(f"line {line_number} is not a JSON object")
      yield index, row
      index += 1


@dataclasses.dataclass
class ReadStats:
  """What `read_records` skipped: `num_skipped` and the first few `(row_index, reason)`."""

  num_rows: int = 0
  num_skipped: int = 0
  skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)
  max_kept_reasons: int = 20


def read_records(path: str, schema: Schema, *, skip_malformed: bool, stats: ReadStats) -> Iterator[Record]:
  """Normalised records of `path` in file order.

  Args:
    path: local parquet or JSONL file.
    schema: its published format.
    skip_malformed: skip rows that do not fit (counted in `stats`) instead of raising.
    stats: filled in while iterating.

  Raises:
    ValueError: `'{path}: row {i}: {reason}'` for the first malformed row (unless skipped), or when no row of
      the file is valid.
  """
  for index, row in iter_rows(path):
    stats.num_rows += 1
    try:
      if isinstance(row, rec.MalformedRow):
        raise row
      record = schema.normalise(row, index, schema.default_data_source)
    except rec.MalformedRow as e:
      if not skip_malformed:
        raise ValueError(f"{path}: row {index}: {e} (schema {schema.name!r})") from None
      stats.num_skipped += 1
      if len(stats.skipped) < stats.max_kept_reasons:
        stats.skipped.append((index, str(e)))
      continue
    yield record
  if stats.num_rows == stats.num_skipped:
    first = f"; first: row {stats.skipped[0][0]}: {stats.skipped[0][1]}" if stats.skipped else ""
    raise ValueError(f"{path}: no valid rows for schema {schema.name!r} ({stats.num_rows} rows{first})")


# ------------------------------------------------------------------------------------------------------------
# Normalisers
# ------------------------------------------------------------------------------------------------------------


def _data_source(row: Mapping[str, Any], default: str) -> str:
  if row.get("data_source") is None and default:
    return default
  return rec.require_str(row, "data_source")


def _user_prompt(problem: str) -> list[dict[str, Any]]:
  return [{"role": "user", "content": problem}]


def _extra(row: Mapping[str, Any], *names: str) -> dict[str, Any]:
  return {name: row[name] for name in names if row.get(name) is not None}


def _sft(row: Mapping[str, Any], index: int, default: str) -> rec.Conversation:
  del default
  messages = rec.check_messages(row.get("messages"), "messages", need_role="assistant")
  return rec.Conversation(messages=messages, tools=rec.check_tools(row.get("tools")), index=index)


def _ground_truth_text(value: Any) -> str:
  if value is None or (isinstance(value, str) and not value.strip()):
    raise rec.MalformedRow("reward_model.ground_truth is missing or empty")
  # Code sources keep their test cases nested; the record holds them as JSON text.
  return value if isinstance(value, str) else rec.to_json(value)


def _rl(row: Mapping[str, Any], index: int, default: str) -> rec.PromptRecord:
  prompt = rec.check_messages(row.get("prompt"), "prompt", need_role="user")
  reward_model = rec.parse_json_field(row.get("reward_model"), "reward_model")
  if not isinstance(reward_model, Mapping):
    raise rec.MalformedRow("field 'reward_model' must hold a ground_truth")
  extra_info = rec.check_object(row.get("extra_info"), "extra_info")
  if row.get("ability") is not None:
    extra_info.setdefault("ability", row["ability"])
  return rec.PromptRecord(
      prompt=prompt,
      data_source=_data_source(row, default),
      ground_truth=_ground_truth_text(reward_model.get("ground_truth")),
      extra_info=extra_info,
      index=index,
  )


def _aime(row: Mapping[str, Any], index: int, default: str) -> rec.PromptRecord:
  problem = rec.require_str(row, "Problem", "problem", "question")
  answer = row.get("Answer", row.get("answer"))
  text = str(answer).strip() if isinstance(answer, (int, str)) and not isinstance(answer, bool) else ""
  # AIME answers are integers 0..999; JSONL copies write them zero-padded ('025'), parquet ones as ints.
  if not re.fullmatch(r"\d{1,3}", text):
    raise rec.MalformedRow(f"AIME answer must be an integer 0..999, got {answer!r}")
  extra_info = _extra(row, "id", "ID", "url", "solution", "Solution", "year")
  extra_info["raw_answer"] = text
  return rec.PromptRecord(
      prompt=_user_prompt(problem),
      data_source=_data_source(row, default),
      ground_truth=str(int(text)),
      extra_info=extra_info,
      index=index,
  )


def _gpqa(row: Mapping[str, Any], index: int, default: str) -> rec.PromptRecord:
  problem = rec.require_str(row, "problem")
  solution = rec.require_str(row, "solution").strip()
  letter = re.fullmatch(r"\(?([A-Z])\)?\.?", solution)
  if letter is None:
    raise rec.MalformedRow(f"GPQA solution must be an option letter, got {solution!r:.40}")
  extra_info = {"domain": rec.require_str(row, "domain"), **_extra(row, "id", "ability")}
  return rec.PromptRecord(
      prompt=_user_prompt(problem),
      data_source=_data_source(row, default),
      ground_truth=letter.group(1),
      extra_info=extra_info,
      index=index,
  )


def _livecodebench(row: Mapping[str, Any], index: int, default: str) -> rec.PromptRecord:
  problem = rec.require_str(row, "problem")
  reward_model = rec.parse_json_field(row.get("reward_model"), "reward_model")
  tests = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
  tests = rec.parse_json_field(tests, "reward_model.ground_truth")
  if not isinstance(tests, Mapping):
    raise rec.MalformedRow("reward_model.ground_truth must hold 'inputs' and 'outputs'")
  inputs, outputs = tests.get("inputs"), tests.get("outputs")
  if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
    raise rec.MalformedRow("reward_model.ground_truth needs equally long, non-empty 'inputs' and 'outputs'")
  extra_info = rec.check_object(row.get("extra_info"), "extra_info")
  if row.get("ability") is not None:
    extra_info.setdefault("ability", row["ability"])
  return rec.PromptRecord(
      prompt=_user_prompt(problem),
      data_source=_data_source(row, default),
      ground_truth=rec.to_json(dict(tests)),
      extra_info=extra_info,
      index=index,
  )


SCHEMAS: dict[str, Schema] = {
    s.name: s
    for s in (
        Schema("sft", "conversation", "", _sft),
        Schema("rl", "prompt", "", _rl),
        Schema("aime2024", "prompt", "AIME2024", _aime),
        Schema("aime2025", "prompt", "AIME2025", _aime),
        Schema("gpqa_diamond", "prompt", "gpqa_diamond", _gpqa),
        Schema("livecodebench_v6", "prompt", "LiveCodeBench_v6", _livecodebench),
    )
}
