"""Rollout limits and scheduling settings (defaults: the recipe's)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Multi-turn agent loop settings.

  Attributes:
    batch_size: B, row slots decoded together; a finished episode frees its slot for the next prompt group.
    max_turns: assistant turns per episode (recipe: 16); a tool call in the last turn is not executed.
    max_response_len: response tokens per episode, tool-response tokens included (recipe: 20480).
    max_prompt_len: longest prompt accepted (a longer one is a ValueError naming it).
    max_tool_output_chars: a tool result longer than this keeps its head and tail (default 2048; the reference's
      256 hides most tracebacks).
    max_calls_per_turn: tool calls executed per assistant turn (default 1: the turn pauses at the first
      `</tool_call>`; with more, turns run to `<|im_end|>` and up to this many of their calls run).
    end_on_failed_call: end the episode at a malformed tool call (the reference's behaviour) instead of answering
      with an error message the model can recover from.
    overlap_tools: keep decoding the rows that are not waiting while tools run, resuming rows as their tools
      return; False (default) decodes until every row has stopped, runs all their tools at once, resumes them in
      one batched extend. bench/rollout.py measures both (64 episodes x 4 tool turns, 50 ms tools, bench_5m,
      2 CPU cores): pause 4.2 episodes/s, overlap 3.0 (overlap saves 11% of decode steps but pays ~185 small
      extend calls and host round trips instead of ~43). With 1 s tools: pause 3.3, overlap 3.0; pause pays
      the tool latency once per turn, so overlap should win from roughly 1.5 s per call on this workload.
    segment_len: most decode steps per compiled decode call (the host checks for paused rows in between).
    min_tool_stops: with `overlap_tools`, a decode call returns early once this many rows paused at a tool call,
      so their tools start sooner.
    min_resume_rows: with `overlap_tools`, rows whose tools returned are resumed (one extend call) once this many
      are ready, or when no row is decoding.
    groups_per_prefill: most prompt groups prefilled by one call (their count is bucketed to a power of two).
    pad_prefill_groups: pad every prefill call to `groups_per_prefill` groups: one prefill program per prompt
      bucket instead of one per power of two up to it (on an accelerator the padding rows cost little next to
      the compile; `agentrl_jax.aot` counts the programs).
    prompt_bucket_min: smallest prompt-length bucket (buckets: x2 and x1.5 steps).
    chunk_len: tokens per extend call and row: a tool response (plus the pending token) is appended in chunks
      of this length, so extend compiles once per cache capacity.
    extend_rows: rows per extend call (default None: batch_size // 8, at least 1); more resuming rows take more
      calls. 0: every row slot in each call, the cache extended in place (rows that do not resume append
      nothing): no rows of the cache are gathered and scattered back, which a sharded cache of long contexts
      cannot afford (the gathered rows land on every device).
    cache_bucket_min: smallest KV cache capacity; the cache grows in buckets as rows get longer (not with
      attention_impl="ragged_paged", whose cache is allocated at its largest capacity once: Sampler.fixed_capacity).
    tool_names: tools the model may call.
  """

  batch_size: int = 64
  max_turns: int = 16
  max_response_len: int = 20480
  max_prompt_len: int = 4096
  max_tool_output_chars: int = 2048
  max_calls_per_turn: int = 1
  end_on_failed_call: bool = False
  overlap_tools: bool = False
  segment_len: int = 64
  min_tool_stops: int = 1
  min_resume_rows: int = 1
  groups_per_prefill: int = 8
  pad_prefill_groups: bool = False
  prompt_bucket_min: int = 64
  chunk_len: int = 64
  extend_rows: int | None = None
  cache_bucket_min: int = 256
  tool_names: tuple[str, ...] = ("code_interpreter",)

  def __post_init__(self):
    for name in ("batch_size", "max_turns", "max_response_len", "max_prompt_len", "max_calls_per_turn", "segment_len",
                 "min_tool_stops", "min_resume_rows", "groups_per_prefill", "prompt_bucket_min", "chunk_len", "cache_bucket_min"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"RolloutConfig.{name}: must be an int >= 1, got {value!r}")
    if self.extend_rows is not None and not (isinstance(self.extend_rows, int) and 0 <= self.extend_rows
                                             <= self.batch_size):
      raise ValueError(f"RolloutConfig.extend_rows: must be None or an int in [0, batch_size], got {self.extend_rows!r}")
    if not isinstance(self.max_tool_output_chars, int) or self.max_tool_output_chars < 64:
      raise ValueError(f"RolloutConfig.max_tool_output_chars: must be an int >= 64, got {self.max_tool_output_chars!r}")
    if not self.tool_names or not all(isinstance(t, str) and t for t in self.tool_names):
      raise ValueError(f"RolloutConfig.tool_names: must be a non-empty tuple of names, got {self.tool_names!r}")

  @property
  def rows_per_extend(self) -> int:
    """Rows of one extend call: `extend_rows` (0: the whole batch), default batch_size // 8."""
    if self.extend_rows is None:
      return max(1, self.batch_size // 8)
    return self.extend_rows or self.batch_size

  def replace(self, **kw) -> RolloutConfig:
    return dataclasses.replace(self, **kw)
