"""Packing encoded conversations into fixed-shape rows, grouped into micro-batches.

Each conversation of L tokens becomes one segment of L - 1 (input, target) pairs: `inputs = tokens[:-1]`,
`targets = tokens[1:]`, `weights = loss_mask[1:]` (a token is trained where it is the *target*). Segments are
placed first-fit-decreasing into rows of `seq_len` slots; positions restart at 0 in each segment and
`segment_ids` (1, 2, ... per row; 0 = padding) keep attention inside a segment, so a packed row computes
exactly what the conversations would alone.

The row count is padded (with all-padding rows) up to `micro_rows * 2**k`, capped at the most a step can
need, so a run compiles its update for at most ~log2(batch / micro_rows) + 1 shapes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from agentrl_jax.sft.masking import EncodedConversation

FIELDS = ("inputs", "targets", "weights", "positions", "segment_ids")


@dataclasses.dataclass(frozen=True)
class PackedBatch:
  """One training step's conversations, packed. Arrays are `[M, R, T]`: M micro-batches of R rows of T slots.

  Attributes:
    inputs: int32 input tokens.
    targets: int32 next tokens.
    weights: float32 loss weights (1 on assistant targets, 0 elsewhere and on padding).
    positions: int32 RoPE positions, restarting per segment.
    segment_ids: int32 per-row segment ids (0 = padding).
    num_conversations: conversations packed.
    row_index: the source row index of every packed conversation (input order).
  """

  inputs: np.ndarray
  targets: np.ndarray
  weights: np.ndarray
  positions: np.ndarray
  segment_ids: np.ndarray
  num_conversations: int
  row_index: tuple[int, ...] = ()

  def arrays(self) -> dict[str, np.ndarray]:
    return {f: getattr(self, f) for f in FIELDS}

  @property
  def num_tokens(self) -> int:
    """Trained (assistant) target tokens."""
    return int(self.weights.sum())


def row_bucket(rows: int, micro_rows: int, max_rows: int) -> int:
  """Rows after padding: `micro_rows * 2**k >= rows`, capped at `max_rows` rounded up to `micro_rows`."""
  cap = math.ceil(max_rows / micro_rows) * micro_rows
  bucket = micro_rows * 2 ** math.ceil(math.log2(max(1, math.ceil(rows / micro_rows))))
  return max(min(bucket, cap), math.ceil(rows / micro_rows) * micro_rows)


def row_buckets(micro_rows: int, max_rows: int, fixed_rows: bool = False) -> tuple[int, ...]:
  """Every row count `pack` can pad a step to (`row_bucket` over 1..max_rows): the SFT step's shapes."""
  if fixed_rows:
    return (row_bucket(max_rows, micro_rows, max_rows),)
  return tuple(sorted({row_bucket(r, micro_rows, max_rows) for r in range(1, max_rows + 1)}))


def pack(conversations: Sequence[EncodedConversation], *, seq_len: int, micro_rows: int,
         max_rows: int, fixed_rows: bool = False) -> PackedBatch:
  """Packs conversations (each at most `seq_len + 1` tokens) into `[M, micro_rows, seq_len]` arrays.

  Args:
    conversations: encoded conversations of one step.
    seq_len: slots per row.
    micro_rows: rows per micro-batch.
    max_rows: the most rows any step needs (the step's conversation count): bounds the row buckets.
    fixed_rows: pad to the largest bucket always (one shape for every step; the step skips the empty
      micro-batches), instead of the smallest bucket that holds the rows.

  Raises:
    ValueError: a conversation longer than `seq_len + 1` tokens, or one with fewer than 2 tokens.
  """
  rows: list[list[int]] = []  # conversation ids per row
  free: list[int] = []
  order = sorted(range(len(conversations)), key=lambda i: -len(conversations[i]))
  for i in order:
    n = len(conversations[i]) - 1
    if not 1 <= n <= seq_len:
      raise ValueError(f"pack: conversation {conversations[i].index} has {n + 1} tokens; rows hold "
                       f"2..{seq_len + 1}")
    for r, space in enumerate(free):
      if space >= n:
        rows[r].append(i)
        free[r] -= n
        break
    else:
      rows.append([i])
      free.append(seq_len - n)
  num_rows = row_bucket(max_rows if fixed_rows else len(rows), micro_rows, max_rows)
  out = {f: np.zeros((num_rows, seq_len), np.float32 if f == "weights" else np.int32) for f in FIELDS}
  for r, ids in enumerate(rows):
    start = 0
    for seg, i in enumerate(ids, start=1):
      c = conversations[i]
      n = len(c) - 1
      sl = slice(start, start + n)
      out["inputs"][r, sl] = c.tokens[:-1]
      out["targets"][r, sl] = c.tokens[1:]
      out["weights"][r, sl] = c.loss_mask[1:]
      out["positions"][r, sl] = np.arange(n)
      out["segment_ids"][r, sl] = seg
      start += n
  shaped = {f: a.reshape(num_rows // micro_rows, micro_rows, seq_len) for f, a in out.items()}
  return PackedBatch(**shaped, num_conversations=len(conversations),
                     row_index=tuple(c.index for c in conversations))
