"""Each TFDS builder builds from a small file in its published schema and reads back the expected records."""

from __future__ import annotations

import json
import os
import re

import pytest
import tfds_rows

from agentrl_jax.data import builders
from agentrl_jax.data.records import Conversation, PromptRecord


def _prepare(tmp_path, path, schema, **kwargs):
  return builders.prepare(builders.SourceConfig(path=path, schema=schema, data_dir=str(tmp_path / "tfds"), **kwargs))


def test_tfds_sft_builder_reads_back_conversations(tmp_path, source_file):
  prepared = _prepare(tmp_path, source_file("sft"), "sft")
  got = prepared.records()
  assert prepared.num_examples == 2 and prepared.num_skipped == 0
  # The ArrayRecord file is really there (one split, file order kept).
  assert any(".array_record-" in f for f in os.listdir(prepared.builder.data_dir))
  first = got[0]
  assert isinstance(first, Conversation) and first.index == 0 and first.tools == [tfds_rows.TOOL_SCHEMA]
  # Parquet's null struct members (tool_calls=None) are dropped, not kept as explicit nulls.
  assert first.messages[0] == {"role": "system", "content": "You can run Python."}
  assert first.messages[2]["tool_calls"][0]["function"]["name"] == "code_interpreter"
  assert [m["role"] for m in first.messages] == ["system", "user", "assistant", "tool", "assistant"]
  assert got[1] == Conversation(
      messages=[{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}],
      tools=[tfds_rows.TOOL_SCHEMA], index=1)


def test_tfds_sft_builder_accepts_nested_tools(tmp_path, source_file):
  rows = [dict(r, tools=[tfds_rows.TOOL_SCHEMA]) for r in tfds_rows.sft_rows()]
  prepared = _prepare(tmp_path, source_file("sft", rows), "sft")
  assert [c.tools for c in prepared.records()] == [[tfds_rows.TOOL_SCHEMA], [tfds_rows.TOOL_SCHEMA]]


def test_tfds_rl_builder_reads_back_prompts(tmp_path, source_file):
  got = _prepare(tmp_path, source_file("rl"), "rl").records()
  assert got[0] == PromptRecord(
      prompt=[{"role": "user", "content": "Compute 1+1."}], data_source="math_dapo", ground_truth="2",
      extra_info={"index": 0, "split": "train", "ability": "MATH"}, index=0)
  assert got[1].prompt[0] == {"role": "system", "content": "Be brief."}
  assert json.loads(got[1].ground_truth) == {"inputs": ["a\n"], "outputs": ["a\n"]}
  assert [r.data_source for r in got] == ["math_dapo", "skywork_code", "orz_math"]


@pytest.mark.parametrize("schema, data_source, expected", [
    ("aime2024", "AIME2024", [("Find 204.", "204"), ("Find 25.", "25")]),
    ("aime2025", "AIME2025", [("Find 70.", "70"), ("Find 5.", "5")]),  # '005' -> '5'
])
def test_tfds_aime_builders(tmp_path, source_file, schema, data_source, expected):
  got = _prepare(tmp_path, source_file(schema), schema).records()
  assert [(r.prompt, r.ground_truth, r.data_source) for r in got] == [
      ([{"role": "user", "content": p}], a, data_source) for p, a in expected]
  if schema == "aime2024":
    assert got[0].extra_info == {"ID": "2024-I-1", "Solution": "It is 204.", "raw_answer": "204"}


def test_tfds_gpqa_builder(tmp_path, source_file):
  got = _prepare(tmp_path, source_file("gpqa_diamond"), "gpqa_diamond").records()
  assert [(r.ground_truth, r.extra_info["domain"], r.data_source) for r in got] == [
      ("A", "Chemistry", "gpqa_diamond"), ("B", "Physics", "gpqa_diamond")]
  assert got[0].prompt[0]["content"].startswith("Which is a noble gas?")


def test_tfds_livecodebench_builder(tmp_path, source_file):
  (got,) = _prepare(tmp_path, source_file("livecodebench_v6"), "livecodebench_v6").records()
  assert got.data_source == "LiveCodeBench_v6"
  assert json.loads(got.ground_truth) == {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}
  assert got.extra_info == {"question_id": "abc001_a", "difficulty": "easy", "ability": "code"}


def _bad_rows(schema):
  rows = tfds_rows.ROWS[schema]()
  rows = rows + [dict(rows[0])]  # at least 2 good rows around the bad one
  bad = dict(rows[0])
  if schema == "sft":
    bad["messages"] = [{"role": "user", "content": "no reply", "tool_calls": None}]
  elif schema == "rl":
    bad["reward_model"] = {"ground_truth": None, "style": "rule"}
  elif schema == "aime2024":
    bad["Answer"] = None
  elif schema == "aime2025":
    bad["answer"] = "1000"
  elif schema == "gpqa_diamond":
    bad["solution"] = "maybe"
  else:
    bad["reward_model"] = "{not json"
  return [rows[0], bad] + rows[1:], len(rows)


@pytest.mark.parametrize("schema", ["sft", "rl", "aime2024", "aime2025", "gpqa_diamond", "livecodebench_v6"])
def test_tfds_malformed_row_raises_naming_file_and_row(tmp_path, source_file, schema):
  rows, _ = _bad_rows(schema)
  path = source_file(schema, rows)
  with pytest.raises(ValueError, match=re.escape(f"{path}: row 1: ")):
    _prepare(tmp_path, path, schema)


@pytest.mark.parametrize("schema", ["sft", "livecodebench_v6"])
def test_tfds_malformed_rows_skipped_and_counted(tmp_path, source_file, schema):
  rows, num_good = _bad_rows(schema)
  path = source_file(schema, rows)
  prepared = _prepare(tmp_path, path, schema, skip_malformed=True)
  assert (prepared.num_examples, prepared.num_skipped) == (num_good, 1)
  assert prepared.skipped[0][0] == 1
  assert 1 not in [r.index for r in prepared.records()]  # indices still name source rows
  # The count is stored with the dataset: a second prepare (reusing the build) reports it too.
  again = _prepare(tmp_path, path, schema, skip_malformed=True)
  assert again.builder.data_dir == prepared.builder.data_dir and again.num_skipped == 1


def test_tfds_all_rows_malformed_is_an_error(tmp_path, source_file):
  path = source_file("gpqa_diamond", [dict(r, solution="?") for r in tfds_rows.gpqa_rows()])
  with pytest.raises(ValueError, match="no valid rows"):
    _prepare(tmp_path, path, "gpqa_diamond", skip_malformed=True)


def test_tfds_jsonl_bad_line_and_missing_file(tmp_path):
  path = tmp_path / "aime.jsonl"
  path.write_text(json.dumps({"problem": "Find 1.", "answer": "001"}) + "\n{oops\n")
  with pytest.raises(ValueError, match=re.escape(f"{path}: row 1: line 2 is not valid JSON")):
    _prepare(tmp_path, str(path), "aime2024")
  with pytest.raises(ValueError, match="no such file"):
    _prepare(tmp_path, str(tmp_path / "absent.parquet"), "rl")


def test_tfds_source_change_rebuilds(tmp_path, source_file):
  path = source_file("aime2025")
  first = _prepare(tmp_path, path, "aime2025")
  tfds_rows.write_parquet(path, tfds_rows.aime2025_rows()[:1])
  second = _prepare(tmp_path, path, "aime2025")
  assert second.builder.data_dir != first.builder.data_dir and second.num_examples == 1


def test_tfds_source_config_validates():
  with pytest.raises(ValueError, match="schema"):
    builders.SourceConfig(path="x.parquet", schema="imagenet", data_dir="/tmp")
  with pytest.raises(ValueError, match="data_dir"):
    builders.SourceConfig(path="x.parquet", schema="rl", data_dir="")


def test_unknown_data_source_is_refused_at_load_naming_file_and_row(tmp_path, source_file):
  from agentrl_jax import rewards

  rows = tfds_rows.rl_rows()
  rows.insert(2, dict(rows[0], data_source="my_new_benchmark"))
  path = source_file("rl", rows)
  prepared = _prepare(tmp_path, path, "rl")
  assert prepared.data_sources() == {"math_dapo": 0, "skywork_code": 1, "my_new_benchmark": 2, "orz_math": 3}
  known = lambda source: rewards.kind_for(source)  # noqa: E731
  with pytest.raises(ValueError, match=re.escape(path) + r": row 2: no reward for data_source 'my_new_benchmark'"):
    builders.refuse_unknown_sources(prepared, known)
  builders.refuse_unknown_sources(_prepare(tmp_path, source_file("rl", name="ok"), "rl"), known)
  # A dataset built before the sources were recorded is scanned instead.
  prepared.builder.info.metadata.pop("data_sources")
  assert prepared.data_sources()["my_new_benchmark"] == 2
