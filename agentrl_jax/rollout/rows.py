"""What the host keeps of a rollout between device calls: the episode each row slot holds (tokens, log-probs,
policy versions, turns, tool calls), the decisions taken when a row stops drawing, and the rollout's counters.

`agent_loop.AgentLoop` owns the row slots and makes the device calls (prefill, decode, extend); the functions
here act on one row and touch no device. A turn ends in one of two ways:

    out = end_turn(row, stop_reason, cfg, tokenizer, resumable)   # a finish reason, or the calls to run
    start_calls(row, out, cfg, executor)                          # futures; None: another host runs them
    ...                                                           # the loop waits for them
    chunk = renderer.chunk(row.resp[-1], tool_results(row, cfg))  # the tool-response tokens to extend with
    row.add_tool_response(chunk)

Nothing here raises for bad model output or a failing executor: a malformed call is answered with its parse
error, a failed submit or future becomes a sandbox error the model reads.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import numpy as np

from agentrl_jax.rollout import episode as episode_lib
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.episode import CallInfo, Episode, TurnInfo
from agentrl_jax.rollout.parser import ToolCall, parse_tool_calls
from agentrl_jax.sampling.config import StopReason
from agentrl_jax.tools.base import ExecResult, Executor
from agentrl_jax.tools.code_interpreter import format_result, prepare_code, truncate_middle


@dataclasses.dataclass
class RolloutStats:
  """Counters of one rollout.

  Attributes:
    prefilled_tokens: non-model tokens written to the cache: each prompt once (shared by its n samples) plus
      every tool-response token. Equal to `prompt_tokens + tool_tokens` when nothing is prefilled twice.
    prompt_tokens: tokens of the distinct prompts.
    tool_tokens: tool-response tokens appended to responses.
    generated_tokens: tokens drawn by the model.
    padded_prefill_tokens: tokens computed by prefill/extend calls including bucket padding and idle rows.
    decode_calls / decode_steps / extend_calls / prefill_calls / grow_calls: device calls made.
    active_rows: rows decoding, summed over decode calls (their mean occupancy is active_rows / decode_calls).
    wall_s: wall time; device_wait_s: host blocked on device results; tool_wait_s: host blocked on tools only.
    traces: sampler functions traced (compiled) during the rollout.
  """

  prefilled_tokens: int = 0
  prompt_tokens: int = 0
  tool_tokens: int = 0
  generated_tokens: int = 0
  padded_prefill_tokens: int = 0
  decode_calls: int = 0
  decode_steps: int = 0
  active_rows: int = 0
  extend_calls: int = 0
  prefill_calls: int = 0
  grow_calls: int = 0
  wall_s: float = 0.0
  device_wait_s: float = 0.0
  tool_wait_s: float = 0.0
  traces: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Row:
  """The episode an occupied row slot holds, so far."""

  ep: int
  group: int
  sample: int
  prompt: np.ndarray
  cache_len: int
  resp: list = dataclasses.field(default_factory=list)
  mask: list = dataclasses.field(default_factory=list)
  lp_raw: list = dataclasses.field(default_factory=list)
  lp_sample: list = dataclasses.field(default_factory=list)
  vers: list = dataclasses.field(default_factory=list)  # policy version that drew each token (-1: tool tokens)
  turns: list = dataclasses.field(default_factory=list)
  turn_start: int = 0
  status: str = "active"  # active | waiting | ready
  calls: list = dataclasses.field(default_factory=list)  # [(CallInfo, Future | None)] of the current turn
  n_calls: int = 0
  n_failed: int = 0
  n_malformed: int = 0

  def add(self, token, lr, ls, version: int):
    """A token the model drew, with its log-probs and the policy version that drew it."""
    self.resp.append(int(token))
    self.mask.append(1)
    self.lp_raw.append(float(lr))
    self.lp_sample.append(float(ls))
    self.vers.append(version)

  def add_tool_response(self, chunk: list[int]) -> int:
    """Appends a tool-response chunk (`chunk[0]` is the row's pending token, already in `resp`) to the current
    turn, off the loss (mask 0, log-probs 0, version -1), and opens the next turn.

    Returns:
      The tool-response tokens appended.
    """
    k = len(chunk) - 1
    self.resp.extend(chunk[1:])
    self.mask.extend([0] * k)
    self.lp_raw.extend([0.0] * k)
    self.lp_sample.extend([0.0] * k)
    self.vers.extend([-1] * k)
    self.turns[-1].num_tool_tokens = k
    self.turn_start = len(self.resp)
    return k

  def episode(self, reason: str, tokenizer) -> Episode:
    """The finished episode, ended for `reason` (an `episode.STOP_*`)."""
    resp = np.asarray(self.resp, np.int32)
    ids = np.concatenate([self.prompt, resp])
    return Episode(
        group=self.group, sample=self.sample, prompt_ids=self.prompt, response_ids=resp,
        loss_mask=np.asarray(self.mask, np.int32), logp_raw=np.asarray(self.lp_raw, np.float32),
        logp_sample=np.asarray(self.lp_sample, np.float32), num_tool_calls=self.n_calls,
        num_failed_calls=self.n_failed, num_malformed_calls=self.n_malformed, stop_reason=reason,
        transcript=tokenizer.decode(ids.tolist(), skip_special_tokens=False), turns=self.turns,
        versions=np.asarray(self.vers, np.int32))


def end_turn(row: Row, reason: int, cfg: RolloutConfig, tokenizer, resumable: set[int]) -> str | list[ToolCall]:
  """Closes the row's turn when it stopped drawing for `reason` (a `StopReason`).

  Args:
    resumable: tokens after which the episode may go on with a tool response (`</tool_call>`, `<|im_end|>`).

  Returns:
    The episode's finish reason (an `episode.STOP_*`), or the turn's tool calls to answer (never empty); the
    calls are counted on the row.
  """
  stop = {StopReason.END: "end", StopReason.TOOL: "tool", StopReason.LENGTH: "length"}[StopReason(reason)]
  turn = TurnInfo(start=row.turn_start, num_generated=len(row.resp) - row.turn_start, stop=stop)
  row.turns.append(turn)
  if reason == StopReason.LENGTH or len(row.resp) >= cfg.max_response_len:
    return episode_lib.STOP_LENGTH
  calls: list[ToolCall] = []
  if row.resp[-1] in resumable:
    text = tokenizer.decode(row.resp[row.turn_start:], skip_special_tokens=False)
    calls = parse_tool_calls(text, cfg.tool_names)
  if not calls:
    return episode_lib.STOP_END
  if len(row.turns) >= cfg.max_turns:
    turn.calls = [CallInfo(c.name, c.code, "not_run", "") for c in calls]
    return episode_lib.STOP_TURNS
  row.n_calls += len(calls)
  malformed = [c for c in calls if not c.ok]
  row.n_malformed += len(malformed)
  if malformed and cfg.end_on_failed_call:
    row.n_failed += len(malformed)
    turn.calls = [CallInfo(c.name, c.code, "not_run" if c.ok else "malformed", c.error or "") for c in calls]
    return episode_lib.STOP_FAILED_CALL
  return calls


def start_calls(row: Row, calls: list[ToolCall], cfg: RolloutConfig, executor: Executor | None) -> None:
  """Submits the turn's well-formed calls (at most `cfg.max_calls_per_turn`) to `executor` and sets the row
  waiting for them. `executor` None: another host runs this row's calls, and each gets an empty future for
  its result to be set on."""
  row.calls = []
  executed = 0
  for c in calls:
    if not c.ok:
      row.calls.append((CallInfo(c.name, "", "malformed", truncate_middle(c.error, cfg.max_tool_output_chars)),
                        None))
    elif executed >= cfg.max_calls_per_turn:
      msg = f"Error: not executed: at most {cfg.max_calls_per_turn} tool call(s) per turn."
      row.calls.append((CallInfo(c.name, c.code, "skipped", msg), None))
    else:
      executed += 1
      if executor is None:  # another host runs it: its result is set on this future
        future = concurrent.futures.Future()
      else:
        try:
          future = executor.submit(prepare_code(c.code))
        except Exception as e:  # pylint: disable=broad-except  # a closed/broken executor: tell the model
          future = concurrent.futures.Future()
          future.set_result(ExecResult("sandbox_error", stderr=f"[sandbox] submit failed: {type(e).__name__}: {e}"))
      row.calls.append((CallInfo(c.name, c.code, "running", ""), future))
  row.status = "waiting"


def future_result(fut: concurrent.futures.Future) -> ExecResult:
  """A finished call's result; an executor future that raised becomes a sandbox error (never raises)."""
  try:
    return fut.result()
  except Exception as e:  # pylint: disable=broad-except
    return ExecResult("sandbox_error", stderr=f"[sandbox] executor failed: {type(e).__name__}: {e}")


def _result_text(result: ExecResult | None, max_chars: int) -> tuple[str, str, float]:
  """(status, text the model reads, wall seconds) of one execution."""
  if result is None:
    return "sandbox_error", "Tool error: no result.", 0.0
  return result.status, format_result(result, max_chars), result.wall_s


def tool_results(row: Row, cfg: RolloutConfig) -> list[str]:
  """Reads the results of the row's finished calls into its turn (counting failures) and clears them.

  Returns:
    The text the model reads for each call, in call order.
  """
  contents = []
  turn = row.turns[-1]
  for info, fut in row.calls:
    if fut is not None:
      info.status, info.output, info.wall_s = _result_text(future_result(fut), cfg.max_tool_output_chars)
    if info.failed:
      row.n_failed += 1
    contents.append(info.output)
    turn.calls.append(info)
  row.calls = []
  return contents
