"""A row's bookkeeping between device calls (`rollout.rows`), without a model: a character tokenizer (token =
code point) drives the end of a turn, the tool calls it starts and the tool response it reads back."""

import concurrent.futures
import json

import numpy as np

from agentrl_jax.rollout import episode as episode_lib
from agentrl_jax.rollout import rows
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.sampling.config import StopReason
from agentrl_jax.tools.base import ExecResult

RESUMABLE = {ord(">")}  # the last character of `</tool_call>` stands for the pause token


class CharTokenizer:

  def decode(self, ids, skip_special_tokens=False):
    del skip_special_tokens
    return "".join(chr(i) for i in ids)


def call(code):
  return "<tool_call>" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "</tool_call>"


def row_with(text, version=3):
  row = rows.Row(ep=5, group=2, sample=1, prompt=np.asarray([7, 8], np.int32), cache_len=2)
  for c in text:
    row.add(ord(c), -0.5, -0.25, version)
  return row


class Recorder:
  """An executor whose futures hold the result given for each code; `fail_submit` raises on submit instead."""

  def __init__(self, results=None, fail_submit=False):
    self.codes, self.results, self.fail_submit = [], results or {}, fail_submit

  def submit(self, code):
    if self.fail_submit:
      raise RuntimeError("executor closed")
    self.codes.append(code)
    fut = concurrent.futures.Future()
    result = self.results.get(len(self.codes) - 1, ExecResult("ok", stdout="3\n"))
    if isinstance(result, Exception):
      fut.set_exception(result)
    else:
      fut.set_result(result)
    return fut


def test_a_turn_ends_the_episode_or_returns_its_calls():
  cfg, tok = RolloutConfig(max_turns=2), CharTokenizer()
  plain = row_with("The answer is 3.")
  assert rows.end_turn(plain, StopReason.END, cfg, tok, RESUMABLE) == episode_lib.STOP_END
  assert (plain.turns[0].start, plain.turns[0].num_generated, plain.turns[0].stop) == (0, 16, "end")
  cut = row_with("The answ")
  assert rows.end_turn(cut, StopReason.LENGTH, cfg, tok, RESUMABLE) == episode_lib.STOP_LENGTH
  assert cut.turns[0].stop == "length"
  # A full response budget ends the episode even at a tool call.
  full = row_with(call("print(1)"))
  assert rows.end_turn(full, StopReason.TOOL, cfg.replace(max_response_len=len(full.resp)), tok,
                       RESUMABLE) == episode_lib.STOP_LENGTH

  tooled = row_with("Let me compute. " + call("print(1+2)"))
  calls = rows.end_turn(tooled, StopReason.TOOL, cfg, tok, RESUMABLE)
  assert [c.code for c in calls] == ["print(1+2)"] and tooled.n_calls == 1 and tooled.turns[0].stop == "tool"
  # The last allowed turn's call is recorded, not run.
  tooled.turn_start = len(tooled.resp)
  for c in call("print(4)"):
    tooled.add(ord(c), 0.0, 0.0, 4)
  assert rows.end_turn(tooled, StopReason.TOOL, cfg, tok, RESUMABLE) == episode_lib.STOP_TURNS
  assert [(c.code, c.status) for c in tooled.turns[1].calls] == [("print(4)", "not_run")]
  assert tooled.n_calls == 1


def test_malformed_calls_are_counted_and_end_the_episode_only_when_asked():
  tok, text = CharTokenizer(), call("print(1)") + "<tool_call>{not json</tool_call>"
  answered = row_with(text)
  calls = rows.end_turn(answered, StopReason.END, RolloutConfig(max_calls_per_turn=2), tok, RESUMABLE)
  assert [c.ok for c in calls] == [True, False]
  assert (answered.n_calls, answered.n_malformed, answered.n_failed) == (2, 1, 0)
  ended = row_with(text)
  cfg = RolloutConfig(max_calls_per_turn=2, end_on_failed_call=True)
  assert rows.end_turn(ended, StopReason.END, cfg, tok, RESUMABLE) == episode_lib.STOP_FAILED_CALL
  assert [c.status for c in ended.turns[0].calls] == ["not_run", "malformed"]
  assert (ended.n_calls, ended.n_malformed, ended.n_failed) == (2, 1, 1)


def test_calls_are_submitted_up_to_the_cap_and_their_results_read_back_in_order():
  cfg, tok = RolloutConfig(max_calls_per_turn=2), CharTokenizer()
  row = row_with(call("print(1)") + "<tool_call>{bad</tool_call>" + call("print(2)") + call("print(3)"))
  calls = rows.end_turn(row, StopReason.END, cfg, tok, RESUMABLE)
  ex = Recorder({1: ValueError("worker died")})
  rows.start_calls(row, calls, cfg, ex)
  assert row.status == "waiting" and len(ex.codes) == 2  # print(3) is past the cap of 2
  assert [(info.status, fut is None) for info, fut in row.calls] == [
      ("running", False), ("malformed", True), ("running", False), ("skipped", True)]
  contents = rows.tool_results(row, cfg)
  assert [c.status for c in row.turns[0].calls] == ["ok", "malformed", "sandbox_error", "skipped"]
  assert contents[0] == "3" and "worker died" in contents[2] and "at most 2" in contents[3]
  assert row.n_failed == 3 and row.calls == []

  # Another host's row: empty futures for its results to be set on; nothing submitted here.
  remote = row_with(call("print(1)"))
  rows.start_calls(remote, rows.end_turn(remote, StopReason.TOOL, cfg, tok, RESUMABLE), cfg, None)
  assert [(info.status, fut.done()) for info, fut in remote.calls] == [("running", False)]
  remote.calls[0][1].set_result(ExecResult("error", stderr="NameError"))
  assert rows.tool_results(remote, cfg) == ["NameError"] and remote.n_failed == 1

  # An executor that cannot take the call answers the model with a sandbox error.
  broken = row_with(call("print(1)"))
  rows.start_calls(broken, rows.end_turn(broken, StopReason.TOOL, cfg, tok, RESUMABLE), cfg, Recorder(
      fail_submit=True))
  assert "submit failed: RuntimeError: executor closed" in rows.tool_results(broken, cfg)[0]
  assert broken.turns[0].calls[0].status == "sandbox_error"


def test_a_tool_response_is_off_the_loss_and_the_episode_keeps_every_token():
  cfg, tok = RolloutConfig(), CharTokenizer()
  row = row_with(call("print(1+2)"), version=3)
  rows.start_calls(row, rows.end_turn(row, StopReason.TOOL, cfg, tok, RESUMABLE), cfg, Recorder())
  rows.tool_results(row, cfg)
  drawn = len(row.resp)
  assert row.add_tool_response([row.resp[-1], 100, 101, 102]) == 3
  assert row.turns[0].num_tool_tokens == 3 and row.turn_start == drawn + 3
  row.add(ord("!"), -1.0, -2.0, 4)
  ep = row.episode(episode_lib.STOP_END, tok)
  assert (ep.group, ep.sample, ep.stop_reason, ep.num_tool_calls, ep.num_failed_calls) == (2, 1, "end", 1, 0)
  assert ep.response_ids.tolist() == row.resp and ep.response_ids.dtype == np.int32
  assert ep.loss_mask.tolist() == [1] * drawn + [0] * 3 + [1]
  assert ep.versions.tolist() == [3] * drawn + [-1] * 3 + [4]
  assert ep.logp_raw.tolist() == [-0.5] * drawn + [0.0] * 3 + [-1.0]
  assert ep.logp_sample.tolist() == [-0.25] * drawn + [0.0] * 3 + [-2.0]
  assert ep.transcript == "\x07\x08" + call("print(1+2)") + "def!"
