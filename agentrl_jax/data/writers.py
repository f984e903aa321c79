"""Writing SFT and RL rows: the recipe's parquet layouts, shared by the collection job, the stitched baseline and
the prompt filter."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agentrl_jax.data import records as rec
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.rollout.episode import Episode

log = logging.getLogger(__name__)


def sft_row(messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]], record: PromptRecord,
            **provenance: Any) -> dict[str, Any]:
  """A row of the SFT schema (`messages`, `tools` as JSON text) with the prompt's provenance columns
  (`data_source`, `ground_truth`, `prompt_index`, `extra_info` as JSON text, and `provenance`)."""
  return {"messages": messages, "tools": rec.to_json(list(tools)), "data_source": record.data_source,
          "ground_truth": record.ground_truth, "prompt_index": record.index,
          "extra_info": rec.to_json(record.extra_info), **provenance}


def write_parquet(path: str, rows: Sequence[dict[str, Any]], *, nested: Sequence[str]) -> str:
  """Writes rows to parquet with the `nested` columns as nested lists / structs (the recipe's published form).

  Parquet gives a column one type for all rows, so a nested column only holds values that agree in keys, key
  order and types (e.g. the arguments of every tool call); a nested column whose round trip would change any
  row is written as JSON text instead (the readers take both forms).
  """
  if not rows:
    raise ValueError(f"write_parquet: no rows for {path}")
  rows = [dict(r) for r in rows]
  for column in nested:
    try:
      restored = pa.array([r[column] for r in rows]).to_pylist()
      ok = all(json.dumps(rec.drop_nones(a)) == json.dumps(r[column]) for a, r in zip(restored, rows))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
      ok = False
    if not ok:
      log.warning("write_parquet: %s: column %r does not fit one nested type; writing it as JSON text", path,
                  column)
      for r in rows:
        r[column] = rec.to_json(r[column])
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows), path)
  return path


def write_sft_parquet(path: str, rows: Sequence[dict[str, Any]]) -> str:
  """Writes SFT rows (`sft_row`) with `messages` nested when the rows allow it (see `write_parquet`)."""
  return write_parquet(path, rows, nested=("messages",))


@dataclasses.dataclass
class CollectResult:
  """What `run` returns: the summary (also in `collect_summary.json`), the kept rows, and their episodes when
  asked for (`keep_episodes`; they hold every token and log-prob, too much to keep for a large collection)."""

  summary: dict[str, Any]
  rows: list[dict[str, Any]]
  episodes: list[Episode]


def output_path(workdir: str, name: str) -> str:
  """`name` inside `workdir` unless it is absolute or a URL."""
  return name if os.path.isabs(name) or "://" in name else os.path.join(workdir, name)
