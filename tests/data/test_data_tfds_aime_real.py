"""The AIME loader on the real AIME 2024 copy in ../shared/data (never copied into the repo)."""

from __future__ import annotations

import json
import pathlib

import pytest

from agentrl_jax.data import builders, pipeline, prompts

AIME2024 = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "aime2024.jsonl"


@pytest.fixture
def aime_path():
  if not AIME2024.is_file():
    pytest.skip(f"real AIME 2024 data not found at {AIME2024} (the ../shared checkout is absent)")
  return str(AIME2024)


def test_tfds_aime2024_jsonl_real_file(aime_path, tmp_path):
  raw = [json.loads(line) for line in open(aime_path, encoding="utf-8") if line.strip()]
  prepared = builders.prepare(builders.SourceConfig(path=aime_path, schema="aime2024",
                                                    data_dir=str(tmp_path / "tfds")))
  assert (prepared.num_examples, prepared.num_skipped) == (30, 0)
  got = prepared.records()
  assert [r.index for r in got] == list(range(30))
  for row, record in zip(raw, got):
    assert record.data_source == "AIME2024"
    assert record.prompt == [{"role": "user", "content": row["problem"]}]
    assert record.ground_truth == str(int(row["answer"]))  # '025' -> '25'
    assert record.extra_info["raw_answer"] == row["answer"] and record.extra_info["url"] == row["url"]
  assert any(r["answer"].startswith("0") for r in raw)  # the zero-padded case is really exercised

  config = pipeline.PipelineConfig(batch_size=8, seed=0, num_epochs=1, drop_remainder=False)
  batches = list(pipeline.prompt_batches(prepared.data_source, config, style=prompts.PromptStyle()))
  styled = [r for batch in batches for r in batch]
  assert [len(b) for b in batches] == [8, 8, 8, 6]
  assert sorted(r.index for r in styled) == list(range(30))
  assert all(raw[r.index]["problem"] in r.prompt[0]["content"] and "\\boxed{" in r.prompt[0]["content"]
             for r in styled)
