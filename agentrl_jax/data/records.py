"""The two normalised record types every dataset builder produces, and their ArrayRecord encoding.

Every RL / evaluation source (the recipe's RL parquet, AIME, GPQA, LiveCodeBench) becomes a `PromptRecord`;
every SFT source becomes a `Conversation`. Trainers consume only these two forms.

On disk (TFDS features, one ArrayRecord file per split) nested fields are JSON text, so the schema stays fixed
whatever the source's message or tool layout is. In memory they are plain Python lists and dicts, ready for
`tokenizer.apply_chat_template(record.prompt, tools=...)`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

ROLES = ("system", "user", "assistant", "tool")


class MalformedRow(ValueError):
  """A source row that does not fit its schema; the reader adds the file and row index to the message."""


@dataclasses.dataclass(frozen=True)
class PromptRecord:
  """One RL / evaluation prompt.

  Attributes:
    prompt: chat messages `[{'role': ..., 'content': ...}, ...]`; the last user message holds the problem.
    data_source: the row's source name (e.g. `'AIME2024'`); selects the prompt wording and the reward.
    ground_truth: what the reward compares against: an answer string for math / multiple choice, JSON text of
      `{'inputs': [...], 'outputs': [...]}` for code.
    extra_info: free-form metadata from the source row (ids, urls, GPQA domain, ...).
    index: the row's 0-based index in its source file (skipped rows leave gaps).
  """

  prompt: list[dict[str, Any]]
  data_source: str
  ground_truth: str
  extra_info: dict[str, Any]
  index: int


@dataclasses.dataclass(frozen=True)
class Conversation:
  """One SFT conversation.

  Attributes:
    messages: chat messages (system / user / assistant / tool); assistant messages may carry `tool_calls`.
    tools: JSON tool schemas offered to the model (OpenAI function format); empty if none.
    index: the row's 0-based index in its source file.
  """

  messages: list[dict[str, Any]]
  tools: list[dict[str, Any]]
  index: int


PROMPT_FEATURES = tfds.features.FeaturesDict({
    "prompt": tfds.features.Text(),
    "data_source": tfds.features.Text(),
    "ground_truth": tfds.features.Text(),
    "extra_info": tfds.features.Text(),
    "index": np.int64,
})

CONVERSATION_FEATURES = tfds.features.FeaturesDict({
    "messages": tfds.features.Text(),
    "tools": tfds.features.Text(),
    "index": np.int64,
})


def to_json(value: Any) -> str:
  """JSON text with non-ASCII kept readable; values JSON cannot hold (dates, bytes) become strings."""
  return json.dumps(value, ensure_ascii=False, default=str)


def prompt_to_features(record: PromptRecord) -> dict[str, Any]:
  """Encodes a `PromptRecord` as a TFDS example (`PROMPT_FEATURES`)."""
  return {
      "prompt": to_json(record.prompt),
      "data_source": record.data_source,
      "ground_truth": record.ground_truth,
      "extra_info": to_json(record.extra_info),
      "index": record.index,
  }


def conversation_to_features(record: Conversation) -> dict[str, Any]:
  """Encodes a `Conversation` as a TFDS example (`CONVERSATION_FEATURES`)."""
  return {"messages": to_json(record.messages), "tools": to_json(record.tools), "index": record.index}


def text_field(value: Any) -> str:
  """A Text feature read back: TFDS decodes Text features to bytes when read without TensorFlow."""
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)



def prompt_from_features(example: Mapping[str, Any]) -> PromptRecord:
  """Decodes an example read back from ArrayRecord (`builder.as_data_source()`) into a `PromptRecord`."""
  return PromptRecord(
      prompt=json.loads(text_field(example["prompt"])),
      data_source=text_field(example["data_source"]),
      ground_truth=text_field(example["ground_truth"]),
      extra_info=json.loads(text_field(example["extra_info"])),
      index=int(example["index"]),
  )


def conversation_from_features(example: Mapping[str, Any]) -> Conversation:
  """Decodes an example read back from ArrayRecord into a `Conversation`."""
  return Conversation(
      messages=json.loads(text_field(example["messages"])),
      tools=json.loads(text_field(example["tools"])),
      index=int(example["index"]),
  )


# ------------------------------------------------------------------------------------------------------------
# Validation shared by the schema readers. Each raises MalformedRow with a short reason.
# ------------------------------------------------------------------------------------------------------------


def drop_nones(value: Any) -> Any:
  """Recursively removes None-valued keys.

  Parquet stores a list of structs with the union of all keys, so a message without `tool_calls` comes back
  with `tool_calls=None`; chat templates treat a present-but-None key differently from a missing one.
  """
  if isinstance(value, Mapping):
    return {k: drop_nones(v) for k, v in value.items() if v is not None}
  if isinstance(value, (list, tuple, np.ndarray)):
    return [drop_nones(v) for v in value]
  return value


def parse_json_field(value: Any, field: str) -> Any:
  """A field that sources store either as JSON text or as an already nested value."""
  if isinstance(value, str):
    try:
      return json.loads(value)
    except json.JSONDecodeError as e:
      raise MalformedRow(f"field {field!r} is not valid JSON ({e})") from None
  return value


def require_str(row: Mapping[str, Any], *names: str) -> str:
  """The first of `names` present in `row` as a non-empty string (alternatives cover column casings)."""
  for name in names:
    value = row.get(name)
    if value is None:
      continue
    if not isinstance(value, str) or not value.strip():
      raise MalformedRow(f"field {name!r} must be a non-empty string, got {value!r:.80}")
    return value
  raise MalformedRow(f"missing field {' / '.join(repr(n) for n in names)}")


def check_messages(value: Any, field: str, *, need_role: str) -> list[dict[str, Any]]:
  """Validates a chat message list and returns it as plain dicts without None keys.

  Args:
    value: the raw column value (list of dicts, or JSON text of one).
    field: column name, for error messages.
    need_role: a role that must occur at least once ('user' for prompts, 'assistant' for SFT).

  Returns:
    The messages; an assistant message whose content is None (tool call only) gets content ''.
  """
  messages = drop_nones(parse_json_field(value, field))
  if not isinstance(messages, list) or not messages:
    raise MalformedRow(f"field {field!r} must be a non-empty list of messages")
  for i, message in enumerate(messages):
    if not isinstance(message, dict) or message.get("role") not in ROLES:
      raise MalformedRow(f"{field}[{i}] needs a role in {ROLES}, got {message!r:.120}")
    if message["role"] == "assistant" and "content" not in message:
      message["content"] = ""
    if not isinstance(message.get("content"), str):
      raise MalformedRow(f"{field}[{i}] ({message['role']}) needs string content")
    for call in message.get("tool_calls", []):
      _check_tool_call(call, f"{field}[{i}].tool_calls")
  if not any(m["role"] == need_role for m in messages):
    raise MalformedRow(f"field {field!r} has no {need_role} message")
  return messages


def _check_tool_call(call: Any, where: str) -> None:
  function = call.get("function") if isinstance(call, dict) else None
  if not isinstance(function, dict) or not isinstance(function.get("name"), str):
    raise MalformedRow(f"{where}: each tool call needs function.name")
  arguments = function.get("arguments", {})
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments)
    except json.JSONDecodeError:
      raise MalformedRow(f"{where}: arguments of {function['name']!r} are not valid JSON") from None
  if not isinstance(arguments, dict):
    raise MalformedRow(f"{where}: arguments of {function['name']!r} must be a JSON object")


def check_tools(value: Any) -> list[dict[str, Any]]:
  """Validates the `tools` column: a list of OpenAI-style function schemas (or JSON text of one)."""
  if value is None:
    return []
  tools = drop_nones(parse_json_field(value, "tools"))
  if not isinstance(tools, list):
    raise MalformedRow("field 'tools' must be a list of tool schemas")
  for i, tool in enumerate(tools):
    spec = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
      raise MalformedRow(f"tools[{i}] needs a name (or function.name)")
  return tools


def check_object(value: Any, field: str) -> dict[str, Any]:
  """An optional JSON-object field (`extra_info`): None becomes {}."""
  if value is None:
    return {}
  obj = drop_nones(parse_json_field(value, field))
  if not isinstance(obj, dict):
    raise MalformedRow(f"field {field!r} must be a JSON object")
  return obj
