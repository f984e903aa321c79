"""TFDS dataset builders: a local source file -> ArrayRecord, read back with `as_data_source()`.

    source = builders.SourceConfig(path='aime2024.jsonl', schema='aime2024', data_dir=workdir + '/tfds')
    prepared = builders.prepare(source)        # builds once, then reuses
    prepared.data_source[0]                    # a decoded TFDS example; records.prompt_from_features(...)

Each prepared dataset lives under `data_dir/<builder>/<schema>-<fingerprint>/1.0.0/`; the fingerprint covers
the source file's bytes and the build options, so editing the file or switching `skip_malformed` builds anew
instead of silently reusing stale data. Skipped rows are counted in the dataset's `metadata.json` and logged.
Builds need no TensorFlow (tensorflow-datasets writes ArrayRecord on its own). Builds are deterministic; on
several hosts give each its own local `data_dir`, or let process 0 build before the others open a shared one
(two concurrent builds of one dataset race on TFDS's final rename).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow_datasets as tfds

from agentrl_jax.data import readers
from agentrl_jax.data import records as rec

log = logging.getLogger(__name__)
_VERSION = "1.0.0"
_SPLIT = "train"


@dataclasses.dataclass(frozen=True)
class SourceConfig:
  """One local source file and how to build it.

  Attributes:
    path: parquet or JSONL file in a published schema.
    schema: one of `readers.SCHEMAS` ('sft', 'rl', 'aime2024', 'aime2025', 'gpqa_diamond',
      'livecodebench_v6').
    data_dir: root directory of the built TFDS datasets.
    skip_malformed: skip rows that do not fit the schema (counted and reported) instead of raising ValueError.
  """

  path: str
  schema: str
  data_dir: str
  skip_malformed: bool = False

  def __post_init__(self):
    if not self.path:
      raise ValueError("SourceConfig.path must be set")
    if self.schema not in readers.SCHEMAS:
      raise ValueError(f"SourceConfig.schema: unknown {self.schema!r}; known: {sorted(readers.SCHEMAS)}")
    if not self.data_dir:
      raise ValueError("SourceConfig.data_dir must be set")

  @property
  def kind(self) -> str:
    """'prompt' or 'conversation': which record type the schema produces."""
    return readers.SCHEMAS[self.schema].kind


def fingerprint(source: SourceConfig) -> str:
  """12 hex digits identifying the source bytes and build options."""
  if not os.path.isfile(source.path):
    raise ValueError(f"{source.path}: no such file")
  digest = hashlib.sha256(f"{_VERSION}|{source.schema}|{source.skip_malformed}|".encode())
  try:
    with open(source.path, "rb") as f:
      for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
  except OSError as e:
    raise ValueError(f"{source.path}: cannot read source file ({e})") from None
  return digest.hexdigest()[:12]


class _SourceBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Writes the records of one `SourceConfig` as a single 'train' split, in file order."""

  VERSION = tfds.core.Version(_VERSION)
  # tfds resolves code_path (only to find a checksums file next to the builder's code; ours download nothing)
  # through the `importlib_resources` backport, which it declares for Python < 3.9 only: without this it
  # fails with ModuleNotFoundError on 3.11.
  code_path = None
  FEATURES: tfds.features.FeaturesDict
  KIND: str

  def __init__(self, *, source: SourceConfig, **kwargs: Any):
    if source.kind != self.KIND:
      raise ValueError(f"SourceConfig.schema {source.schema!r} makes {source.kind} records, not {self.KIND}")
    self._source = source
    self._stats = readers.ReadStats()
    config = tfds.core.BuilderConfig(name=f"{source.schema}-{fingerprint(source)}", version=_VERSION)
    super().__init__(config=config, data_dir=source.data_dir, file_format="array_record", **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=f"agentrl_jax {self.KIND} records",
        features=self.FEATURES,
        metadata=tfds.core.MetadataDict(),
        # Keep file order: record i is row i (minus skipped rows); grain does the shuffling.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Iterator[Any]]:
    del dl_manager  # Sources are local files; nothing is downloaded.
    return {_SPLIT: self._generate_examples()}

  def _generate_examples(self) -> Iterator[tuple[int, dict[str, Any]]]:
    schema = readers.SCHEMAS[self._source.schema]
    records = readers.read_records(
        self._source.path, schema, skip_malformed=self._source.skip_malformed, stats=self._stats)
    sources: dict[str, int] = {}
    for record in records:
      if isinstance(record, rec.PromptRecord):
        sources.setdefault(record.data_source, record.index)
      yield record.index, self._encode(record)
    # Written to metadata.json with the dataset, so later readers see the count too.
    self.info.metadata.update({
        "source_path": self._source.path,
        "num_rows": self._stats.num_rows,
        "num_skipped": self._stats.num_skipped,
        "skipped": [list(s) for s in self._stats.skipped],
        "data_sources": sources,  # each data_source and the first row holding it (refused sources name it)
    })

  def _encode(self, record: Any) -> dict[str, Any]:
    raise NotImplementedError


class PromptBuilder(_SourceBuilder, skip_registration=True):
  """RL / evaluation prompts (`PromptRecord`) from the rl, aime, gpqa and livecodebench schemas."""

  FEATURES = rec.PROMPT_FEATURES
  KIND = "prompt"

  def _encode(self, record: rec.PromptRecord) -> dict[str, Any]:
    return rec.prompt_to_features(record)


class ConversationBuilder(_SourceBuilder, skip_registration=True):
  """SFT conversations (`Conversation`) from the sft schema."""

  FEATURES = rec.CONVERSATION_FEATURES
  KIND = "conversation"

  def _encode(self, record: rec.Conversation) -> dict[str, Any]:
    return rec.conversation_to_features(record)


class _LogStream(io.TextIOBase):
  """A text stream whose lines go to this module's log."""

  def write(self, text: str) -> int:
    if text.strip():
      log.info("tfds: %s", text.strip())
    return len(text)


@dataclasses.dataclass(frozen=True)
class PreparedDataset:
  """A built dataset and what its build skipped.

  Attributes:
    source: what was built.
    builder: the TFDS builder (its `data_dir` holds the ArrayRecord files).
    data_source: random-access `ArrayRecordDataSource` of decoded TFDS examples (input to `pipeline`).
    num_examples: records written.
    num_skipped: malformed rows skipped (always 0 unless `skip_malformed`).
    skipped: the first few `(row_index, reason)` pairs.
  """

  source: SourceConfig
  builder: _SourceBuilder
  data_source: Sequence[Any]
  num_examples: int
  num_skipped: int
  skipped: list[tuple[int, str]]

  def records(self) -> list[rec.PromptRecord] | list[rec.Conversation]:
    """All records, decoded, in file order (for small evaluation sets and tests)."""
    decode = rec.prompt_from_features if self.source.kind == "prompt" else rec.conversation_from_features
    return [decode(self.data_source[i]) for i in range(len(self.data_source))]

  def data_sources(self) -> dict[str, int]:
    """Each `data_source` of a prompt dataset and the first source-file row holding it ({} for conversations).
    Read from the build's metadata; a dataset built before it was recorded is scanned once."""
    if self.source.kind != "prompt":
      return {}
    recorded = (self.builder.info.metadata or {}).get("data_sources")
    if isinstance(recorded, dict):
      return {str(k): int(v) for k, v in recorded.items()}
    out: dict[str, int] = {}
    for i in range(len(self.data_source)):
      example = self.data_source[i]
      out.setdefault(rec.text_field(example["data_source"]), int(example["index"]))
    return out


def refuse_unknown_sources(prepared: PreparedDataset, check: Callable[[str], object]) -> None:
  """Calls `check(data_source)` for every data source of the dataset (e.g. `rewards.kind_for`, which raises
  ValueError for a source no reward handles), so a run refuses data it could not score before any work.

  Raises:
    ValueError: `'{path}: row {i}: {check's message}'` for the first refused source (by row).
  """
  for source, row in sorted(prepared.data_sources().items(), key=lambda kv: kv[1]):
    try:
      check(source)
    except ValueError as e:
      raise ValueError(f"{prepared.source.path}: row {row}: {e}") from None


def prepare(source: SourceConfig) -> PreparedDataset:
  """Builds `source` into ArrayRecord under `source.data_dir` unless already built, and opens it.

  Raises:
    ValueError: a malformed row (naming the file and row index) when not `skip_malformed`, no valid row at
      all, or an unreadable file.
  """
  cls = PromptBuilder if source.kind == "prompt" else ConversationBuilder
  builder = cls(source=source)
  if not builder.is_prepared():
    # TFDS prints its "Downloading and preparing dataset" notices to stdout and draws progress bars: into the
    # log instead (the console belongs to the job; nothing is downloaded anyway).
    tfds.display_progress_bar(False)  # a process-wide TFDS switch; this project's datasets never download
    with contextlib.redirect_stdout(_LogStream()):
      builder.download_and_prepare()
    log.info("%s: built %s in %s", source.path, builder.info.full_name, builder.data_dir)
  metadata = builder.info.metadata or {}
  num_skipped = int(metadata.get("num_skipped", 0))
  if num_skipped:
    log.warning("%s: skipped %d of %d malformed rows (schema %s); first: %s", source.path, num_skipped,
                    metadata.get("num_rows"), source.schema, metadata.get("skipped", [])[:3])
  return PreparedDataset(
      source=source,
      builder=builder,
      data_source=builder.as_data_source(split=_SPLIT),
      num_examples=builder.info.splits[_SPLIT].num_examples,
      num_skipped=num_skipped,
      skipped=[(int(i), str(r)) for i, r in metadata.get("skipped", [])],
  )
