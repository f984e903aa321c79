"""grain pipelines: shuffle with seed, epochs, per-process shards, python-record batches, exact resume."""

from __future__ import annotations

import collections

import grain
import orbax.checkpoint as ocp
import pytest
import tfds_rows

from agentrl_jax.data import builders, pipeline, prompts
from agentrl_jax.data.records import Conversation, PromptRecord


@pytest.fixture(scope="module")
def rl_source(tmp_path_factory):
  """A prepared RL dataset of 10 rows (real ArrayRecord data source)."""
  tmp = tmp_path_factory.mktemp("rl")
  rows = [{"data_source": "orz_math" if i % 2 else "math_dapo", "prompt": [{"role": "user", "content": f"q{i}"}],
           "reward_model": {"ground_truth": str(i)}, "extra_info": {"i": i}} for i in range(10)]
  path = tfds_rows.write_parquet(tmp / "rl.parquet", rows)
  return builders.prepare(builders.SourceConfig(path=path, schema="rl", data_dir=str(tmp / "tfds"))).data_source


def _cfg(**kwargs):
  return pipeline.PipelineConfig(**{"batch_size": 2, "shard_index": 0, "shard_count": 1, **kwargs})


def _indices(batches):
  return [[r.index for r in batch] for batch in batches]


def test_tfds_pipeline_epochs_and_seeded_shuffle(rl_source):
  plain = _indices(pipeline.prompt_batches(rl_source, _cfg(shuffle=False, num_epochs=1)))
  assert plain == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
  shuffled = sum(_indices(pipeline.prompt_batches(rl_source, _cfg(seed=7, num_epochs=2))), [])
  epoch0, epoch1 = shuffled[:10], shuffled[10:]
  assert sorted(epoch0) == sorted(epoch1) == list(range(10))  # every epoch is a permutation ...
  assert epoch0 != epoch1 and epoch0 != list(range(10))  # ... reshuffled per epoch
  again = sum(_indices(pipeline.prompt_batches(rl_source, _cfg(seed=7, num_epochs=2))), [])
  assert again == shuffled  # same seed, same order
  other = sum(_indices(pipeline.prompt_batches(rl_source, _cfg(seed=8, num_epochs=2))), [])
  assert other != shuffled


def test_tfds_pipeline_batches_are_styled_python_records(rl_source):
  batch = next(iter(pipeline.prompt_batches(rl_source, _cfg(shuffle=False), style=prompts.PromptStyle())))
  assert isinstance(batch, list) and all(isinstance(r, PromptRecord) for r in batch)
  assert batch[0].prompt[0]["content"] == "q0" + prompts.NO_UNITS  # math_dapo row
  assert batch[1].prompt[0]["content"].startswith(prompts.MATH_PREAMBLE)  # orz_math row: default template


def test_tfds_pipeline_shards_per_process(rl_source):
  shards = [sum(_indices(pipeline.prompt_batches(rl_source, _cfg(batch_size=1, shard_index=i, shard_count=3,
                                                                    num_epochs=1))), [])
            for i in range(3)]
  assert [len(s) for s in shards] == [3, 3, 3]  # even_shards drops 10 % 3 = 1 record
  assert len(set(sum(shards, []))) == 9
  default = pipeline.PipelineConfig(batch_size=1)
  assert default.shard() == (0, 1)  # jax.process_index(), jax.process_count() in a single process
  uneven = [len(list(pipeline.prompt_batches(rl_source, _cfg(batch_size=1, shard_index=i, shard_count=3,
                                                                num_epochs=1, even_shards=False))))
            for i in range(3)]
  assert uneven == [4, 3, 3]


def test_tfds_pipeline_resume_from_state(rl_source):
  ds = pipeline.prompt_batches(rl_source, _cfg(batch_size=3, seed=3))  # infinite, crosses epochs
  it = iter(ds)
  for _ in range(4):
    next(it)
  state = it.get_state()
  expected = _indices([next(it) for _ in range(5)])
  resumed = iter(ds)
  resumed.set_state(state)
  assert _indices([next(resumed) for _ in range(5)]) == expected


def test_tfds_pipeline_resume_through_orbax(rl_source, tmp_path):
  ds = pipeline.prompt_batches(rl_source, _cfg(batch_size=3, seed=5))
  it = iter(ds)
  for _ in range(3):
    next(it)
  with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
    mngr.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
    expected = _indices([next(it) for _ in range(4)])
    fresh = iter(ds)
    mngr.restore(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  assert _indices([next(fresh) for _ in range(4)]) == expected


@pytest.mark.parametrize("kwargs", [
    {"num_epochs": 3, "batch_size": 4},
    {"num_epochs": 3, "batch_size": 4, "drop_remainder": False},
    {"num_epochs": 2, "batch_size": 2, "shard_index": 1, "shard_count": 3},
    {"num_epochs": 1, "batch_size": 1, "shard_index": 0, "shard_count": 3, "even_shards": False},
])
def test_tfds_pipeline_num_batches(rl_source, kwargs):
  config = _cfg(**kwargs)
  assert pipeline.num_batches(len(rl_source), config) == len(list(pipeline.prompt_batches(rl_source, config)))


def test_tfds_pipeline_conversations(tmp_path, source_file):
  prepared = builders.prepare(builders.SourceConfig(path=source_file("sft"), schema="sft",
                                                    data_dir=str(tmp_path / "tfds")))
  batches = list(pipeline.conversation_batches(prepared.data_source, _cfg(num_epochs=3, shuffle=False)))
  assert len(batches) == 3 and all(isinstance(c, Conversation) for b in batches for c in b)
  assert collections.Counter(c.index for b in batches for c in b) == {0: 3, 1: 3}


@pytest.mark.parametrize("kwargs, field", [
    ({"batch_size": 0}, "batch_size"),
    ({"num_epochs": 0}, "num_epochs"),
    ({"shard_index": 2, "shard_count": 2}, "shard_index"),
    ({"shard_index": 0}, "shard_count"),
    ({"seed": -1}, "seed"),
])
def test_tfds_pipeline_config_validates(kwargs, field):
  with pytest.raises(ValueError, match=field):
    pipeline.PipelineConfig(**{"batch_size": 1, **kwargs})


def test_tfds_pipeline_shard_smaller_than_batch(rl_source):
  with pytest.raises(ValueError, match="fewer than one batch"):
    pipeline.prompt_batches(rl_source, _cfg(batch_size=4, shard_index=0, shard_count=4))
