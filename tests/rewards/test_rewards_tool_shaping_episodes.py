"""Tool-call shaping on real episodes of the agent loop (tiny model, scripted tokens): only calls the executor
ran lift a wrong answer's reward; malformed, skipped, unrun and sandbox-failed calls do not."""

from __future__ import annotations

import json

from flax import nnx
import jax
import pytest

from agentrl_jax import rewards, testing
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.rl import batch as batch_lib
from agentrl_jax.rollout import agent_loop, shapes
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.stub_executor import stub_executor
from agentrl_jax.sampling.sampler import make_sampler
from agentrl_jax.tools import ExecResult

B, SEG, F = 4, 16, 96
CFG = RolloutConfig(batch_size=B, segment_len=SEG, max_prompt_len=64, max_response_len=400, prompt_bucket_min=64,
                    chunk_len=64, cache_bucket_min=512)
SHAPING = rewards.ShapingConfig(max_response_tokens=400, overlong_buffer_tokens=0)
WRONG, RIGHT = "So the answer is \\boxed{5}.<|im_end|>", "So the answer is \\boxed{4}.<|im_end|>"
MALFORMED = ['<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "1"</tool_call>',      # bad JSON
             '<tool_call>\n{"name": "web_search", "arguments": {"query": "x"}}\n</tool_call>',     # unknown tool
             '<tool_call>\n{"name": "code_interpreter", "arguments": {"script": "1"}}\n</tool_call>',  # no code
             '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "1"}}<|im_end|>']  # unterminated


def call(code: str) -> str:
  return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


def answer(code: str) -> ExecResult:
  if "crash" in code:
    return ExecResult("sandbox_error", stderr="[sandbox] the sandbox died")
  if "1/0" in code:
    return ExecResult("error", stderr="ZeroDivisionError", exit_code=1)
  return ExecResult("ok", stdout="4\n")


@pytest.fixture(scope="module")
def env():
  tok = testing.tiny_tokenizer()
  model = testing.tiny_model(seed=11)
  graphdef, params = nnx.split(model)
  return tok, model, graphdef, params


def run(env, scripts, cfg=CFG):
  tok, model, graphdef, params = env
  sampler = make_sampler(graphdef, model.cfg, shapes.sampling_config(tok, cfg), batch=B, n_forced=F)
  text = tokenizer_lib.render_chat(tok, [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True)
  prompt = tok.encode(text, add_special_tokens=False)
  ex = stub_executor(answer)
  try:
    episodes, _ = agent_loop.run_rollout(
        sampler, params, [prompt] * len(scripts), n=1, tokenizer=tok, executor=ex, cfg=cfg, key=jax.random.key(0),
        scripts=[[tok.encode(t, add_special_tokens=False) for t in s] for s in scripts])
  finally:
    ex.close()
  records = [PromptRecord([{"role": "user", "content": "What is 2+2?"}], "toy_arith", "4", {}, i)
             for i in range(len(scripts))]
  return episodes, records


def score(env, episodes, records, shaping=SHAPING):
  return batch_lib.score_episodes(episodes, records, tokenizer=env[0], executor=None,
                                  reward_cfg=rewards.RewardConfig(), shaping_cfg=shaping, max_workers=1)


def test_only_executed_calls_lift_a_wrong_answer(env):
  scripts = [MALFORMED + [WRONG],                                     # 4 unparseable calls: nothing ran
             [call("print(2+2)"), call("1/0"), WRONG],                # ran twice (once with an error)
             [call("crash()"), WRONG],                                # the sandbox failed: may not have run
             [call("print(2+2)"), RIGHT]]                             # correct: unchanged
  episodes, records = run(env, scripts)
  assert [e.num_tool_calls for e in episodes] == [4, 2, 1, 1]       # answered, as the agent loop counts
  assert [e.num_executed_calls for e in episodes] == [0, 2, 0, 1]
  scored = score(env, episodes, records)
  assert scored.acc.tolist() == [False, False, False, True]
  assert scored.reward.tolist() == pytest.approx([-1.0, -0.8, -1.0, 1.0])
  # The old count ('answered') lets four unparseable calls lift -1.0 to -0.6 without running anything.
  old = score(env, episodes, records, rewards.ShapingConfig(max_response_tokens=400, overlong_buffer_tokens=0,
                                                            tool_call_count="answered"))
  assert old.reward.tolist() == pytest.approx([-0.6, -0.8, -0.9, 1.0])
  ok_only = score(env, episodes, records, rewards.ShapingConfig(max_response_tokens=400, overlong_buffer_tokens=0,
                                                                tool_call_count="ok"))
  assert ok_only.reward.tolist() == pytest.approx([-1.0, -0.9, -1.0, 1.0])


def test_unrun_and_skipped_calls_do_not_count(env):
  # max_turns: the call of the last allowed turn ends the episode unrun (status not_run).
  episodes, records = run(env, [[call("print(1)"), call("print(2)"), WRONG]], cfg=CFG.replace(max_turns=2))
  (ep,) = episodes
  assert ep.stop_reason == "max_turns" and [c.status for t in ep.turns for c in t.calls] == ["ok", "not_run"]
  assert ep.num_executed_calls == 1 and score(env, episodes, records).reward.tolist() == pytest.approx([-0.9])
  # Beyond max_calls_per_turn a call is answered with an error but never run (status skipped).
  turn = call("print(1)") + "\n" + call("print(2)") + "\n" + call("print(3)") + "<|im_end|>"
  episodes, records = run(env, [[turn, WRONG]], cfg=CFG.replace(max_calls_per_turn=2))
  (ep,) = episodes
  assert [c.status for c in ep.turns[0].calls] == ["ok", "ok", "skipped"] and ep.num_tool_calls == 3
  assert ep.num_executed_calls == 2 and score(env, episodes, records).reward.tolist() == pytest.approx([-0.8])
  # end_on_failed_call (the reference's behaviour): the valid call of that turn is not run either.
  episodes, records = run(env, [[call("print(1)") + "\n" + MALFORMED[0] + "<|im_end|>", WRONG]],
                          cfg=CFG.replace(max_calls_per_turn=2, end_on_failed_call=True))
  (ep,) = episodes
  assert ep.stop_reason == "failed_call" and ep.num_executed_calls == 0


def test_counted_calls_rejects_unknown_counts(env):
  episodes, _ = run(env, [[WRONG]])
  with pytest.raises(ValueError, match="which must be one of"):
    episodes[0].counted_calls("all")
  with pytest.raises(ValueError, match="tool_call_count"):
    rewards.ShapingConfig(tool_call_count="all")


def test_scoring_reuses_one_pool_and_scores_the_same(env):
  """Scoring runs on one pool per width kept for the process (the stream scores every group as it finishes):
  however many calls, no more threads than its width are ever started, and the scores follow the episodes."""
  import threading

  episodes, records = run(env, [[WRONG], [RIGHT], [call("print(2+2)"), RIGHT], [WRONG]])
  kw = dict(tokenizer=env[0], executor=None, reward_cfg=rewards.RewardConfig(), shaping_cfg=SHAPING, max_workers=3)
  first = batch_lib.score_episodes(episodes, records, **kw)
  assert first.score.tolist() == [-1.0, 1.0, 1.0, -1.0]
  for _ in range(5):
    again = batch_lib.score_episodes(episodes[::-1], records, **kw)
    assert again.score.tolist() == first.score.tolist()[::-1]
    assert again.reward.tolist() == first.reward.tolist()[::-1]
  # The width-3 pool names its threads score-w3_0, score-w3_1, ... in the order it starts them (other tests'
  # scoring in this process has pools of other widths).
  started = {t.name for t in threading.enumerate() if t.name.startswith("score-w3_")}
  assert started and started <= {"score-w3_0", "score-w3_1", "score-w3_2"}
