"""The collect and filter jobs end to end on a known policy: a tiny model SFT'd on the scripted teacher's real
tool-use conversations for four arithmetic problems until it reproduces them greedily.

collect -> SFT round trip: the policy calls the tool, the code runs in the real sandbox, the kept trajectories
are written as SFT parquet, built by `data.prepare(schema="sft")`, trained on by the SFT trainer, and each one
renders to exactly the tokens of its episode. filter: the pass rates under that policy are 1 on the problems it
learned and 0 on two it never saw, and the band keeps exactly the learned ones.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from agentrl_jax import data, testing
from agentrl_jax.data import collect
from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.rl import filter_prompts
from agentrl_jax.sft import masking
from agentrl_jax.sft import trainer as sft_trainer
from agentrl_jax.tasks import arithmetic, teacher
from agentrl_jax.tools import base as tools_base
from agentrl_jax.tools import executors as tool_executors

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")


def load(name, arg=None, **overrides):
  return testing.load_config(name, arg, **{"model.tokenizer_path": testing.tiny_tokenizer_dir(), **overrides})


@dataclasses.dataclass
class ToyPolicy:
  checkpoint: str
  prompts: str  # RL parquet: the learned problems, then the unseen ones
  learned: list
  unseen: list


@pytest.fixture(scope="module")
def toy_policy(tmp_path_factory) -> ToyPolicy:
  root = tmp_path_factory.mktemp("toy_policy")
  problems = arithmetic.make_problems(6, levels=(2,), seed=11)
  learned, unseen = problems[:4], problems[4:]
  with tool_executors.make_executor(tools_base.ToolConfig(timeout_s=10)) as executor:
    convs = teacher.conversations(learned, executor, seed=0, p_mistake=0.0)
  assert len(convs) == 4
  for c in convs:
    c["tools"] = []  # the rollouts below do not advertise the tool schema either (short prompts)
  sft_data = teacher.write_sft_parquet(str(root / "teacher.parquet"), convs)
  config = load("sft_tiny", "overfit", **{"data.path": sft_data, "export_hf": False})
  metrics = sft_trainer.run(config, str(root / "sft"))
  assert metrics["loss"] < 0.05, metrics
  prompts = arithmetic.write_rl_parquet(str(root / "prompts.parquet"), problems)
  return ToyPolicy(str(root / "sft" / "checkpoints"), prompts, learned, unseen)


def _policy_overrides(policy: ToyPolicy) -> dict:
  return {"model.checkpoint": policy.checkpoint, "data.train_path": policy.prompts}


def test_collect_sft_round_trip(toy_policy, tmp_path):
  # ---- collect: 2 greedy samples per prompt (identical, so the second is a near-duplicate)
  config = load("collect_trajectories", "smoke", **_policy_overrides(toy_policy),
                **{"collect.n": 2, "collect.temperature": 0.0, "collect.max_per_prompt": 2})
  result = collect.run(config, str(tmp_path / "collect"), keep_episodes=True)
  report = [json.loads(line) for line in open(tmp_path / "collect" / "collect_report.jsonl")]
  decisions = {(r["index"], r["sample"]): r["decision"] for r in report}
  assert [decisions[(i, 0)] for i in range(4)] == [collect.KEPT] * 4, report
  assert [decisions[(i, 1)] for i in range(4)] == [collect.NEAR_DUPLICATE] * 4
  assert all(decisions[(i, s)] != collect.KEPT for i in (4, 5) for s in (0, 1))  # never learned: wrong
  assert result.summary["kept"] == 4 and result.summary["kept_token_exact"] == 4

  # ---- the kept trajectories: the model's tool call, the REAL sandbox output, the answer
  for row, problem in zip(result.rows, toy_policy.learned):
    user, call, tool, answer = row["messages"]
    assert user == {"role": "user", "content": problem.question}
    assert call["tool_calls"][0]["function"]["arguments"] == {"code": f"print({problem.expression})"}
    assert tool == {"role": "tool", "content": problem.answer}
    assert answer == {"role": "assistant", "content": f"The answer is \\boxed{{{problem.answer}}}."}

  # ---- SFT parquet -> data.prepare(schema="sft") -> the SFT trainer (two steps)
  parquet = tmp_path / "collect" / "trajectories.parquet"
  prep = data.prepare(data.SourceConfig(path=str(parquet), schema="sft", data_dir=str(tmp_path / "tfds")))
  assert [c.messages for c in prep.records()] == [r["messages"] for r in result.rows]
  sft_config = load("sft_tiny", "overfit", **{"data.path": str(parquet), "sft.num_epochs": 2, "export_hf": False,
                                              "log_every_steps": 1})
  with sft_config.unlocked():
    sft_config.model.checkpoint = toy_policy.checkpoint  # continue from the policy (sft_tiny has no such field)
  metrics = sft_trainer.run(sft_config, str(tmp_path / "sft"))
  lines = [json.loads(line) for line in open(tmp_path / "sft" / "metrics.jsonl")]
  assert [m["step"] for m in lines] == [1, 2] and metrics["skipped_conversations"] == 0
  assert lines[0]["loss"] < 0.1  # the policy already generates exactly these conversations

  # ---- each conversation as SFT renders it IS its episode, token for token
  tok = testing.tiny_tokenizer()
  im_end, tool_end = (tok.convert_tokens_to_ids(t) for t in (tok_lib.IM_END, tok_lib.TOOL_CALL_END))
  for row, episode in zip(result.rows, result.episodes):
    enc = masking.encode_conversation(tok, row["messages"], json.loads(row["tools"]) or None)
    ids = np.concatenate([episode.prompt_ids, episode.response_ids])
    p, n = len(episode.prompt_ids), len(ids)
    np.testing.assert_array_equal(enc.tokens[:n], ids)
    assert tok.decode(enc.tokens[n:].tolist()).strip() == ""  # only the template's newline after <|im_end|>
    # SFT trains exactly the tokens the model drew, plus the <|im_end|> closing a tool-call turn (in the
    # rollout that token belongs to the tool response chunk).
    differ = np.flatnonzero(enc.loss_mask[p:n] != episode.loss_mask.astype(bool))
    assert differ.size == 1 and ids[p + differ[0]] == im_end and ids[p + differ[0] - 1] == tool_end


def test_filter_job_pass_rates_on_known_policy(toy_policy, tmp_path):
  config = load("filter_prompts", "smoke", **_policy_overrides(toy_policy),
                **{"filter.k": 2, "filter.temperature": 0.0, "filter.min_pass_rate": 0.5, "filter.include_min": True,
                   "filter.max_pass_rate": 1.0, "filter.include_max": True})
  summary = filter_prompts.run(config, str(tmp_path))
  entries = [json.loads(line) for line in open(tmp_path / "pass_rates.jsonl")]
  assert [e["pass_rate"] for e in entries] == [1.0] * 4 + [0.0] * 2
  assert [e["kept"] for e in entries] == [True] * 4 + [False] * 2
  assert summary["kept"] == 4 and summary["all_correct"] == 4 and summary["all_wrong"] == 2
  kept = data.prepare(data.SourceConfig(path=str(tmp_path / "filtered.parquet"), schema="rl",
                                        data_dir=str(tmp_path / "tfds"))).records()
  assert [r.prompt for r in kept] == [[{"role": "user", "content": p.question}] for p in toy_policy.learned]
  assert [r.ground_truth for r in kept] == [p.answer for p in toy_policy.learned]
  assert all(r.extra_info["pass_rate"] == 1.0 and r.extra_info["pass_rate_k"] == 2 for r in kept)
  assert [r.extra_info["expression"] for r in kept] == [p.expression for p in toy_policy.learned]
