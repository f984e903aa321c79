"""Episode records of the agent loop and `collate`, which pads a list of them into fixed-shape trainer arrays."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from agentrl_jax.sampling.config import bucket

# Episode.stop_reason values.
STOP_END = "end"  # the model ended its turn without a tool call
STOP_LENGTH = "max_response_len"  # the response (tool tokens included) reached its budget
STOP_TURNS = "max_turns"  # the last allowed turn ended with a tool call
STOP_FAILED_CALL = "failed_call"  # a malformed call with `end_on_failed_call`
STOP_REASONS = (STOP_END, STOP_LENGTH, STOP_TURNS, STOP_FAILED_CALL)

# CallInfo.status values of calls whose program the executor ran (whatever its outcome). Not counted: malformed,
# skipped and not_run calls (never submitted) and sandbox_error (the sandbox failed; the program may not have run).
EXECUTED_STATUSES = ("ok", "error", "timeout", "memory", "killed")
# Which calls `Episode.counted_calls` counts: executed (default), ok (executed and exited 0), answered (every call
# the model was answered for, malformed and skipped ones included: the count before tool shaping was hardened).
CALL_COUNTS = ("executed", "ok", "answered")


@dataclasses.dataclass
class CallInfo:
  """One tool call of a turn.

  Attributes:
    name: tool name ("" when unreadable).
    code: the code run ("" when not run).
    status: an `ExecResult.status` when it ran, "malformed" for a parse error, "skipped" beyond
      `max_calls_per_turn`, "not_run" when the episode ended at this turn (max_turns, end_on_failed_call).
    output: the text the model read back (already truncated).
    wall_s: execution time reported by the executor.
  """

  name: str
  code: str
  status: str
  output: str
  wall_s: float = 0.0

  @property
  def failed(self) -> bool:
    return self.status != "ok"

  @property
  def executed(self) -> bool:
    """The executor ran this call's program (see `EXECUTED_STATUSES`)."""
    return self.status in EXECUTED_STATUSES


@dataclasses.dataclass
class TurnInfo:
  """One assistant turn: response tokens `[start, start + num_generated)` were drawn by the model, followed by
  `num_tool_tokens` tool-response tokens (loss mask 0) when it called tools."""

  start: int
  num_generated: int
  stop: str  # "end" | "tool" | "length"
  calls: list[CallInfo] = dataclasses.field(default_factory=list)
  num_tool_tokens: int = 0


@dataclasses.dataclass
class Episode:
  """A finished episode.

  Attributes:
    group: index of its prompt; sample: its index among the prompt's n samples.
    prompt_ids: `[P]` prompt tokens.
    response_ids: `[R]` everything after the prompt: model tokens and tool-response tokens.
    loss_mask: `[R]` 1 on tokens the model drew, 0 on tool-response tokens.
    logp_raw: `[R]` log-probs of drawn tokens under the policy at temperature 1 (0 on tool tokens).
    logp_sample: `[R]` log-probs under the sampling distribution (0 on tool tokens).
    num_tool_calls: tool calls answered (malformed and skipped ones included; the calls of a turn that ended the
      episode unanswered, at max_turns, are not counted). Tool-call shaping counts `num_executed_calls` instead.
    num_failed_calls: calls that were malformed, skipped, or whose execution did not end with status "ok".
    num_malformed_calls: calls that could not be parsed or named an unknown tool / lacked arguments.
    stop_reason: one of `STOP_REASONS`.
    transcript: prompt and response decoded (special tokens kept).
    turns: per-turn details.
    versions: `[R]` the policy version whose params drew each token (-1 on tool-response tokens); all 0 for a
      rollout that did not stamp versions. An episode whose weights changed while it ran (a partial rollout of
      asynchronous RL) holds several.
  """

  group: int
  sample: int
  prompt_ids: np.ndarray
  response_ids: np.ndarray
  loss_mask: np.ndarray
  logp_raw: np.ndarray
  logp_sample: np.ndarray
  num_tool_calls: int
  num_failed_calls: int
  num_malformed_calls: int
  stop_reason: str
  transcript: str
  turns: list[TurnInfo]
  versions: np.ndarray | None = None

  @property
  def version_first(self) -> int:
    """Version of the policy that drew the episode's first token (0 when not stamped)."""
    drawn = self._drawn_versions()
    return int(drawn.min()) if drawn.size else 0

  @property
  def version_last(self) -> int:
    """Version of the policy that drew the episode's last token (0 when not stamped)."""
    drawn = self._drawn_versions()
    return int(drawn.max()) if drawn.size else 0

  def _drawn_versions(self) -> np.ndarray:
    if self.versions is None:
      return np.zeros((0,), np.int32)
    return self.versions[self.versions >= 0]

  @property
  def num_turns(self) -> int:
    return len(self.turns)

  @property
  def response_len(self) -> int:
    return int(self.response_ids.shape[0])

  @property
  def num_executed_calls(self) -> int:
    """Calls whose program the executor ran: what tool-call shaping rewards (a malformed, skipped or unrun
    `<tool_call>` costs nothing to emit, so it must not raise a reward)."""
    return sum(c.executed for t in self.turns for c in t.calls)

  def counted_calls(self, which: str = "executed") -> int:
    """Tool calls counted as `which` (one of `CALL_COUNTS`).

    Raises:
      ValueError: unknown `which`.
    """
    if which == "executed":
      return self.num_executed_calls
    if which == "ok":
      return sum(c.status == "ok" for t in self.turns for c in t.calls)
    if which == "answered":
      return self.num_tool_calls
    raise ValueError(f"counted_calls: which must be one of {CALL_COUNTS}, got {which!r}")


def collate(episodes: Sequence[Episode], *, pad_id: int = 0, prompt_bucket_min: int = 64,
            response_bucket_min: int = 64, max_prompt_len: int | None = None, max_response_len: int | None = None,
            batch_multiple: int = 1) -> dict[str, np.ndarray]:
  """Right-pads episodes into fixed bucketed shapes for the trainer.

  Sequence dimensions are bucketed (`config.bucket`: x2 / x1.5 steps) so the trainer's update compiles a
  bounded number of times; the batch is padded with empty rows (all masks 0) to a multiple of `batch_multiple`.

  Returns:
    A dict of numpy arrays, with Bp = padded batch, P / R = bucketed prompt / response lengths, T = P + R:
      prompt_ids [Bp, P], prompt_lens [Bp]; response_ids, loss_mask (float32), response_mask (1 on every
      response token, tool tokens included), logp_raw, logp_sample [Bp, R]; response_lens [Bp];
      input_ids [Bp, T]: prompt then response, contiguous, right-padded (row b's response starts at
      prompt_lens[b]); num_tool_calls, num_executed_calls, num_failed_calls, num_turns [Bp]; valid [Bp] (0 on
      padding rows).
  """
  if not episodes:
    raise ValueError("collate: no episodes")
  if batch_multiple < 1:
    raise ValueError(f"collate: batch_multiple must be >= 1, got {batch_multiple}")
  p = bucket(max(len(e.prompt_ids) for e in episodes), prompt_bucket_min, max_prompt_len)
  r = bucket(max(max(e.response_len for e in episodes), 1), response_bucket_min, max_response_len)
  b = -(-len(episodes) // batch_multiple) * batch_multiple
  out = {
      "prompt_ids": np.full((b, p), pad_id, np.int32), "prompt_lens": np.zeros((b,), np.int32),
      "response_ids": np.full((b, r), pad_id, np.int32), "loss_mask": np.zeros((b, r), np.float32),
      "response_mask": np.zeros((b, r), np.float32), "logp_raw": np.zeros((b, r), np.float32),
      "logp_sample": np.zeros((b, r), np.float32), "response_lens": np.zeros((b,), np.int32),
      "input_ids": np.full((b, p + r), pad_id, np.int32), "num_tool_calls": np.zeros((b,), np.int32),
      "num_executed_calls": np.zeros((b,), np.int32),
      "num_failed_calls": np.zeros((b,), np.int32), "num_turns": np.zeros((b,), np.int32),
      "valid": np.zeros((b,), np.float32),
  }
  for i, e in enumerate(episodes):
    pl, rl = len(e.prompt_ids), e.response_len
    out["prompt_ids"][i, :pl] = e.prompt_ids
    out["prompt_lens"][i] = pl
    out["response_ids"][i, :rl] = e.response_ids
    out["loss_mask"][i, :rl] = e.loss_mask
    out["response_mask"][i, :rl] = 1
    out["logp_raw"][i, :rl] = e.logp_raw
    out["logp_sample"][i, :rl] = e.logp_sample
    out["response_lens"][i] = rl
    out["input_ids"][i, :pl] = e.prompt_ids
    out["input_ids"][i, pl:pl + rl] = e.response_ids
    out["num_tool_calls"][i] = e.num_tool_calls
    out["num_executed_calls"][i] = e.num_executed_calls
    out["num_failed_calls"][i] = e.num_failed_calls
    out["num_turns"][i] = e.num_turns
    out["valid"][i] = 1
  return out
