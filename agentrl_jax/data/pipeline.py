"""grain input pipelines over prepared datasets: shard -> shuffle -> repeat -> decode -> batch.

    prepared = builders.prepare(SourceConfig(path=..., schema='rl', data_dir=...))
    it = iter(pipeline.prompt_batches(prepared.data_source, PipelineConfig(batch_size=64, seed=0),
                                      style=prompts.PromptStyle()))
    batch = next(it)                           # list[PromptRecord], styled per row by data_source

The iterator is a `grain.DatasetIterator`: `it.get_state()` / `it.set_state(state)` resume exactly (the state
is the position in a deterministic order, a small JSON-able dict). With Orbax, save it next to the train state:

    mngr.save(step, args=ocp.args.Composite(state=..., data=grain.checkpoint.CheckpointSave(it)))
    mngr.restore(step, args=ocp.args.Composite(state=..., data=grain.checkpoint.CheckpointRestore(it)))

(grain writes one `process_<i>-of-<n>.json` per JAX process, so each host restores its own shard's position.)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import grain
import jax

from agentrl_jax.data import prompts as prompts_lib
from agentrl_jax.data import records as rec


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """How records are ordered, sharded and batched.

  Attributes:
    batch_size: records per batch (per process).
    seed: shuffle seed; each epoch is reshuffled deterministically from it.
    shuffle: shuffle globally (within this process's shard) every epoch.
    num_epochs: passes over the data; None repeats forever (RL), an int ends the iterator (SFT, eval).
    drop_remainder: drop the last incomplete batch (only reached when num_epochs is set).
    shard_index: this process's shard; None = `jax.process_index()`.
    shard_count: number of shards; None = `jax.process_count()`.
    even_shards: drop up to `shard_count - 1` records so every shard has the same length (hosts then step in
      lockstep; a host with one batch more would hang the others in a collective).
    read_threads: grain reader threads (decoding is light; records are small).
    prefetch: batches' worth of records grain reads ahead.
  """

  batch_size: int
  seed: int = 0
  shuffle: bool = True
  num_epochs: int | None = None
  drop_remainder: bool = True
  shard_index: int | None = None
  shard_count: int | None = None
  even_shards: bool = True
  read_threads: int = 2
  prefetch: int = 4

  def __post_init__(self):
    if self.batch_size < 1:
      raise ValueError(f"PipelineConfig.batch_size must be >= 1, got {self.batch_size}")
    if not 0 <= self.seed < 2**32:
      raise ValueError(f"PipelineConfig.seed must be in [0, 2**32), got {self.seed}")
    if self.num_epochs is not None and self.num_epochs < 1:
      raise ValueError(f"PipelineConfig.num_epochs must be >= 1 or None, got {self.num_epochs}")
    if self.shard_count is not None and self.shard_count < 1:
      raise ValueError(f"PipelineConfig.shard_count must be >= 1, got {self.shard_count}")
    if self.shard_index is not None and self.shard_index < 0:
      raise ValueError(f"PipelineConfig.shard_index must be >= 0, got {self.shard_index}")
    if (self.shard_index is None) != (self.shard_count is None):
      raise ValueError("PipelineConfig.shard_index and shard_count are set together (or both None)")
    if self.shard_count is not None and self.shard_index >= self.shard_count:
      raise ValueError(f"PipelineConfig.shard_index {self.shard_index} >= shard_count {self.shard_count}")
    if self.read_threads < 1:
      raise ValueError(f"PipelineConfig.read_threads must be >= 1, got {self.read_threads}")
    if self.prefetch < 0:
      raise ValueError(f"PipelineConfig.prefetch must be >= 0, got {self.prefetch}")

  def shard(self) -> tuple[int, int]:
    """(index, count) of this process's shard."""
    if self.shard_count is None:
      return jax.process_index(), jax.process_count()
    return self.shard_index, self.shard_count


def _shard_length(num_examples: int, config: PipelineConfig) -> int:
  index, count = config.shard()
  usable = num_examples // count * count if config.even_shards else num_examples
  return len(range(index, usable, count))


def num_batches(num_examples: int, config: PipelineConfig) -> int:
  """Batches this process's iterator yields in total (e.g. the SFT trainer's step count for its schedule).

  Batches run across epoch boundaries, so this is `ceil` or `floor` (drop_remainder) of
  `num_epochs * shard_length / batch_size`, not a per-epoch count times epochs.

  Raises:
    ValueError: `config.num_epochs` is None (the iterator never ends).
  """
  if config.num_epochs is None:
    raise ValueError("num_batches needs PipelineConfig.num_epochs (None repeats forever)")
  records = config.num_epochs * _shard_length(num_examples, config)
  return records // config.batch_size if config.drop_remainder else -(-records // config.batch_size)


def _batches(source: Sequence[Any], config: PipelineConfig,
             decode: Callable[[Any], Any]) -> grain.IterDataset:
  index, count = config.shard()
  ds = grain.MapDataset.source(source)
  # Fixed per-process subsets (not a re-split each epoch): a host's position then depends on its shard alone.
  usable = len(ds) // count * count if config.even_shards else len(ds)
  ds = ds[:usable][index::count]
  if len(ds) < (config.batch_size if config.drop_remainder else 1):
    raise ValueError(f"shard {index}/{count} has {len(ds)} records, fewer than one batch of "
                     f"{config.batch_size} (source has {len(source)})")
  if config.shuffle:
    ds = ds.shuffle(seed=config.seed)
  # After shuffle, so each epoch gets its own order.
  ds = ds.repeat(config.num_epochs).map(decode)
  ds = ds.batch(config.batch_size, drop_remainder=config.drop_remainder, batch_fn=list)
  read = grain.ReadOptions(num_threads=config.read_threads,
                           prefetch_buffer_size=config.prefetch * config.batch_size)
  return ds.to_iter_dataset(read)


def _decode_prompt(example: Any, style: prompts_lib.PromptStyle | None) -> rec.PromptRecord:
  record = rec.prompt_from_features(example)
  return record if style is None else prompts_lib.apply_prompt_style(record, style)


def prompt_batches(source: Sequence[Any], config: PipelineConfig,
                   style: prompts_lib.PromptStyle | None = None) -> grain.IterDataset:
  """Batches of `PromptRecord`s (python lists) from a prepared prompt dataset.

  Args:
    source: `PreparedDataset.data_source` of a prompt schema (or any sequence of TFDS-encoded examples).
    config: ordering, sharding and batching.
    style: wording applied per row by data_source; None keeps the bare problems.

  Returns:
    A `grain.IterDataset`; `iter()` of it is the checkpointable iterator.
  """
  return _batches(source, config, functools.partial(_decode_prompt, style=style))


def conversation_batches(source: Sequence[Any], config: PipelineConfig) -> grain.IterDataset:
  """Batches of `Conversation`s (python lists) from a prepared SFT dataset; see `prompt_batches`."""
  return _batches(source, config, rec.conversation_from_features)


def all_prompt_records(source: Sequence[Any], style: prompts_lib.PromptStyle | None = None,
                       limit: int | None = None) -> list[rec.PromptRecord]:
  """Every record of a prepared prompt dataset in file order (evaluation sets are small and read whole)."""
  n = len(source) if limit is None else min(limit, len(source))
  return [_decode_prompt(source[i], style) for i in range(n)]
