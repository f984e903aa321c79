"""Sampling settings and the length buckets that bound how often the sampler compiles."""

from __future__ import annotations

import dataclasses
import enum
import math


class StopReason(enum.IntEnum):
  """Why a row stopped decoding (stored per row as int32 in `SamplingState.stop_reason`)."""

  RUNNING = 0
  END = 1  # sampled an end-of-turn token (`<|im_end|>`, EOS)
  TOOL = 2  # sampled the end of a tool call (`</tool_call>`): the row waits for the tool's output
  LENGTH = 3  # used up its token budget


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How tokens are drawn and when a row stops. Static: a change recompiles the sampler.

  Attributes:
    temperature: softmax temperature (> 0); ignored when `greedy`.
    top_p: nucleus sampling mass in (0, 1]; 1 disables it.
    top_k: keep the k most likely tokens; 0 disables it.
    greedy: argmax decoding (log-probs of the sampling distribution are then 0).
    end_token_ids: tokens that end the turn (`<|im_end|>`, EOS).
    tool_end_token_ids: tokens that end a tool call (`</tool_call>`); the row pauses for the tool.
    segment_len: most decode steps one `decode` call runs (its output buffer length).
  """

  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  greedy: bool = False
  end_token_ids: tuple[int, ...] = ()
  tool_end_token_ids: tuple[int, ...] = ()
  segment_len: int = 64

  def __post_init__(self):
    if not (isinstance(self.temperature, (int, float)) and self.temperature > 0 and math.isfinite(self.temperature)):
      raise ValueError(f"SamplingConfig.temperature: must be a finite number > 0, got {self.temperature!r}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"SamplingConfig.top_p: must lie in (0, 1], got {self.top_p!r}")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"SamplingConfig.top_k: must be an int >= 0 (0 = off), got {self.top_k!r}")
    for name in ("end_token_ids", "tool_end_token_ids"):
      ids = getattr(self, name)
      if not isinstance(ids, tuple) or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"SamplingConfig.{name}: must be a tuple of non-negative ints, got {ids!r}")
    if set(self.end_token_ids) & set(self.tool_end_token_ids):
      raise ValueError("SamplingConfig.tool_end_token_ids: overlaps end_token_ids "
                       f"({sorted(set(self.end_token_ids) & set(self.tool_end_token_ids))})")
    if not isinstance(self.segment_len, int) or self.segment_len < 1:
      raise ValueError(f"SamplingConfig.segment_len: must be an int >= 1, got {self.segment_len!r}")

  @property
  def filters(self) -> bool:
    """True when the sampling distribution differs from the tempered policy (top-k or top-p active)."""
    return not self.greedy and (self.top_k > 0 or self.top_p < 1)

  def replace(self, **kw) -> SamplingConfig:
    return dataclasses.replace(self, **kw)


def bucket(n: int, minimum: int = 16, maximum: int | None = None) -> int:
  """Smallest bucket >= n among {minimum * 2^i} and {1.5 * minimum * 2^i} (at most 33% padding), capped.

  Buckets grow geometrically, so any range of lengths compiles O(log(max / min)) shapes.

  Raises:
    ValueError: n exceeds `maximum`.
  """
  if maximum is not None and n > maximum:
    raise ValueError(f"bucket: length {n} exceeds the maximum {maximum}")
  b = max(1, minimum)
  while True:
    if b >= n:
      break
    if b * 3 // 2 >= n and (b * 3) % 2 == 0:
      b = b * 3 // 2
      break
    b *= 2
  return b if maximum is None else min(b, maximum)


def bucket_values(minimum: int, maximum: int) -> tuple[int, ...]:
  """Every value `bucket(n, minimum, maximum)` takes for 1 <= n <= maximum, ascending."""
  values, b = {maximum}, max(1, minimum)
  while b < maximum:
    values.add(b)
    if (b * 3) % 2 == 0:
      values.add(b * 3 // 2)
    b *= 2
  return tuple(sorted(v for v in values if v <= maximum))


def pow2_bucket(n: int, minimum: int = 1) -> int:
  """Smallest power of two >= max(n, minimum)."""
  return 1 << max(0, (max(n, minimum) - 1).bit_length())
