"""Trajectory collection, host side: messages rebuilt from episode turns (failed and malformed calls included),
the exact-render check, the filters (tool calls, per-prompt cap, near-duplicates) and the SFT parquet."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentrl_jax import data, testing
from agentrl_jax.data import collect
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.rollout.chat import ToolResponseRenderer
from agentrl_jax.rollout.episode import CallInfo, Episode, TurnInfo
from agentrl_jax.tools import TOOL_SCHEMA


def call_text(code: str, name: str = "code_interpreter") -> str:
  return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"code": code}}) + "\n</tool_call>"


def structured(code: str) -> dict:
  return {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}


@pytest.fixture(scope="module")
def tok():
  return testing.tiny_tokenizer()


def make_episode(tok, prompt, turns, *, tools=None, group=0, sample=0, stop_reason="end"):
  """An episode laid out exactly as the agent loop builds one: per turn the generated tokens (ending with the
  stop token the sampler drew), then `[pending token] + tool-response tokens` from the same renderer.

  `turns`: `(generated text, [(status, output), ...] or None)`.
  """
  prompt_ids = tok.encode(tok_lib.render_chat(tok, prompt, tools=tools, add_generation_prompt=True),
                          add_special_tokens=False)
  renderer = ToolResponseRenderer(tok)
  resp, mask, infos, n_calls, n_failed = [], [], [], 0, 0
  for text, calls in turns:
    gen = tok.encode(text, add_special_tokens=False)
    info = TurnInfo(start=len(resp), num_generated=len(gen), stop="tool" if calls else "end")
    resp += gen
    mask += [1] * len(gen)
    if calls:
      info.calls = [CallInfo("code_interpreter", "", status, output) for status, output in calls]
      chunk = renderer.chunk(resp[-1], [output for _, output in calls])
      resp += chunk[1:]
      mask += [0] * (len(chunk) - 1)
      info.num_tool_tokens = len(chunk) - 1
      n_calls += len(calls)
      n_failed += sum(status != "ok" for status, _ in calls)
    infos.append(info)
  r = len(resp)
  return Episode(group=group, sample=sample, prompt_ids=np.array(prompt_ids), response_ids=np.array(resp),
                 loss_mask=np.array(mask), logp_raw=np.zeros(r, np.float32), logp_sample=np.zeros(r, np.float32),
                 num_tool_calls=n_calls, num_failed_calls=n_failed, num_malformed_calls=0, stop_reason=stop_reason,
                 transcript=tok.decode(prompt_ids + resp, skip_special_tokens=False), turns=infos)


PROMPT = [{"role": "user", "content": "Compute 6*7."}]
MALFORMED = "Let me try.\n<tool_call>\n{not json}\n</tool_call>"
MALFORMED_ERROR = "Error: the tool call is not valid JSON (Expecting property name). Got: {not json}"
TRACEBACK = "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in <module>\nNameError: name 'x' is not defined"


def recovering_episode(tok, **kw):
  return make_episode(tok, PROMPT, [
      (MALFORMED, [("malformed", MALFORMED_ERROR)]),
      (call_text("print(x)"), [("error", TRACEBACK)]),
      ("Fixed.\n" + call_text("print(6*7)"), [("ok", "42")]),
      ("The answer is \\boxed{42}.<|im_end|>", None),
  ], **kw)


def test_messages_from_turns_with_malformed_and_failed_calls(tok):
  episode = recovering_episode(tok)
  messages = collect.episode_messages(episode, PROMPT, tok)
  assert messages == [
      PROMPT[0],
      {"role": "assistant", "content": MALFORMED},  # malformed: stays text, exactly as generated
      {"role": "tool", "content": MALFORMED_ERROR},
      {"role": "assistant", "content": "", "tool_calls": [structured("print(x)")]},
      {"role": "tool", "content": TRACEBACK},  # a failed call: the real traceback the model read
      {"role": "assistant", "content": "Fixed.", "tool_calls": [structured("print(6*7)")]},
      {"role": "tool", "content": "42"},
      {"role": "assistant", "content": "The answer is \\boxed{42}."},
  ]
  problem, token_exact = collect.check_render(tok, messages, [], episode)
  assert problem == "" and token_exact


def test_render_check_catches_a_different_tool_schema(tok):
  episode = recovering_episode(tok, tools=[TOOL_SCHEMA])
  messages = collect.episode_messages(episode, PROMPT, tok)
  assert collect.check_render(tok, messages, [TOOL_SCHEMA], episode) == ("", True)
  problem, _ = collect.check_render(tok, messages, [], episode)  # not what the policy was shown
  assert "where the episode has" in problem


def test_control_token_in_content_is_not_renderable(tok):
  episode = make_episode(tok, PROMPT, [("<|im_start|>The answer is \\boxed{42}.<|im_end|>", None)])
  problem, _ = collect.check_render(tok, collect.episode_messages(episode, PROMPT, tok), [], episode)
  assert "control token" in problem


@pytest.mark.parametrize("text, content, codes", [
    (call_text("print(1)"), "", ["print(1)"]),
    ("Let me check.\n" + call_text("print(1)"), "Let me check.", ["print(1)"]),
    ("A\n\n" + call_text("print(1)"), "A\n", ["print(1)"]),
    ("A\n" + call_text("print(1)") + "\n" + call_text("print(2)"), "A", ["print(1)", "print(2)"]),
    ("A\n" + MALFORMED.split("\n", 1)[1] + "\n" + call_text("print(2)"), "A\n" + MALFORMED.split("\n", 1)[1],
     ["print(2)"]),
    ("A" + call_text("print(1)"), None, []),               # no newline: the template would add one
    ("\n" + call_text("print(1)"), None, []),              # a lone newline is not content the template writes
    ('<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"}}</tool_call>', None, []),
    ("A\n" + call_text("print(1)", name="search"), None, []),    # unknown tool
    ("A\n" + call_text("print(1)") + " trailing", None, []),
    ("no calls at all", None, []),
])
def test_split_turn_renders_back_to_the_text(tok, text, content, codes):
  got_content, calls = collect.split_turn(text)
  assert got_content == (text if content is None else content)
  assert [c["function"]["arguments"]["code"] for c in calls] == codes
  message = {"role": "assistant", "content": got_content, **({"tool_calls": calls} if calls else {})}
  rendered = tok_lib.render_chat(tok, [PROMPT[0], message])
  assert rendered.endswith("<|im_start|>assistant\n" + text + "<|im_end|>\n")


def test_screen_requires_complete_correct_and_tool_calls(tok):
  with_tool = recovering_episode(tok)
  direct = make_episode(tok, PROMPT, [("The answer is \\boxed{42}.<|im_end|>", None)])
  truncated = make_episode(tok, PROMPT, [("The answer", None)], stop_reason="max_response_len")
  assert collect.screen(with_tool, True, 1) == ""
  assert collect.screen(with_tool, False, 1) == collect.INCORRECT
  assert collect.screen(direct, True, 1) == collect.FEW_TOOL_CALLS
  assert collect.screen(direct, True, 0) == ""
  assert collect.screen(with_tool, True, 4) == collect.FEW_TOOL_CALLS
  assert collect.screen(truncated, True, 0) == collect.INCOMPLETE


def test_select_group_caps_and_drops_near_duplicates():
  a = "Let me compute 37*41 with code. The tool says 1517, so the answer is 1517."
  a_case = a.upper().replace(" ", "  ")  # same text after normalisation
  a_edit = a.replace("Let me", "I will")  # one word pair changed: still near
  b = "First I multiply 37 by 40 to get 1480, then add 37 for 1517. Check: yes."
  c = "Direct: 1517."
  kw = dict(dedup_ngram=3)
  assert collect.select_group([a, a_case, a_edit, b, c], max_per_prompt=0, dedup_threshold=0.6, **kw) == [
      collect.KEPT, collect.NEAR_DUPLICATE, collect.NEAR_DUPLICATE, collect.KEPT, collect.KEPT]
  assert collect.select_group([a, a_edit, b, c], max_per_prompt=2, dedup_threshold=0.9, **kw) == [
      collect.KEPT, collect.KEPT, collect.OVER_CAP, collect.OVER_CAP]
  assert collect.select_group([a, a, a], max_per_prompt=0, dedup_threshold=0.0, **kw) == [collect.KEPT] * 3
  assert collect.jaccard(collect.ngrams(a, 3), collect.ngrams(a_case, 3)) == 1.0
  assert 0.6 < collect.jaccard(collect.ngrams(a, 3), collect.ngrams(a_edit, 3)) < 0.9


def test_collect_episodes_keeps_good_ones_and_builds_through_sft_prepare(tok, tmp_path):
  records = [PromptRecord(PROMPT, "toy_arith", "42", {"level": 2}, index=7),
             PromptRecord([{"role": "user", "content": "Compute 2+3."}], "toy_arith", "5", {}, index=9)]
  good = recovering_episode(tok, group=0, sample=0)
  again = recovering_episode(tok, group=0, sample=1)                               # a duplicate of sample 0
  wrong = make_episode(tok, PROMPT, [(call_text("print(6*8)"), [("ok", "48")]),
                                     ("The answer is \\boxed{48}.<|im_end|>", None)], group=0, sample=2)
  direct = make_episode(tok, records[1].prompt, [("The answer is \\boxed{5}.<|im_end|>", None)], group=1)
  other = make_episode(tok, records[1].prompt, [(call_text("print(2+3)"), [("ok", "5")]),
                                                ("So \\boxed{5}.<|im_end|>", None)], group=1, sample=1)
  episodes = [good, again, wrong, direct, other]
  texts = [tok.decode(e.response_ids.tolist(), skip_special_tokens=False) for e in episodes]
  cfg = collect.CollectConfig(n=3, max_per_prompt=2, dedup_threshold=0.8, min_tool_calls=1)
  got = collect.collect_episodes(episodes, [True, True, False, True, True], texts, records, tokenizer=tok,
                                 tools=[], cfg=cfg, preds=["42", "42", "48", "5", "5"])
  assert [e["decision"] for e in got.report] == [collect.KEPT, collect.NEAR_DUPLICATE, collect.INCORRECT,
                                                 collect.FEW_TOOL_CALLS, collect.KEPT]
  assert [e["index"] for e in got.report] == [7, 7, 7, 9, 9] and got.episodes == [good, other]
  row = got.rows[0]
  assert row["prompt_index"] == 7 and row["ground_truth"] == "42" and row["tools"] == "[]"
  assert row["num_tool_calls"] == 3 and row["num_failed_calls"] == 2 and row["token_exact"]

  path = collect.write_sft_parquet(str(tmp_path / "sft.parquet"), got.rows)
  prep = data.prepare(data.SourceConfig(path=path, schema="sft", data_dir=str(tmp_path / "tfds")))
  assert [c.messages for c in prep.records()] == [r["messages"] for r in got.rows]


def test_write_parquet_falls_back_to_json_text_for_mixed_argument_types(tmp_path):
  def row(arguments):
    return {"messages": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": "", "tool_calls": [
                             {"type": "function", "function": {"name": "f", "arguments": arguments}}]},
                         {"role": "tool", "content": "1"}, {"role": "assistant", "content": "done"}],
            "tools": "[]"}

  rows = [row({"code": "a", "n": 1}), row({"n": "x", "code": "b"})]  # types and key order differ
  path = collect.write_sft_parquet(str(tmp_path / "mixed.parquet"), rows)
  prep = data.prepare(data.SourceConfig(path=path, schema="sft", data_dir=str(tmp_path / "tfds")))
  got = [c.messages for c in prep.records()]
  assert got == [r["messages"] for r in rows]
  assert list(got[1][1]["tool_calls"][0]["function"]["arguments"]) == ["n", "code"]  # order kept for rendering


@pytest.mark.parametrize("field, value", [("n", 0), ("max_per_prompt", -1), ("dedup_threshold", 1.5),
                                          ("temperature", -0.1), ("top_p", 0.0), ("output", "")])
def test_collect_config_validates(field, value):
  with pytest.raises(ValueError, match=field):
    collect.CollectConfig(**{field: value})


def load(name, arg=None):
  return testing.load_config(name, arg)


def test_collect_configs_load():
  config = load("collect_trajectories")
  assert config.job == "collect" and config.builder == "rollout" and config.model.size == "qwen3_4b"
  assert config.rollout.max_response_len == 20480 and config.collect.min_tool_calls == 1
  smoke = load("collect_trajectories", "smoke")
  assert smoke.model.size == "tiny_qwen3" and smoke.data.toy_problems > 0 and "rl" not in smoke
  collect.CollectConfig(**smoke.collect)
  with pytest.raises(ValueError, match="unknown arg"):
    load("collect_trajectories", "big")
