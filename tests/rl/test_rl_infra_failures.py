"""Infrastructure failures are not answers: rows whose reward could not be computed carry no advantage and no
loss, are counted, and stop the run past a threshold; non-finite updates are counted and stop the run too.

The dead sandbox is a real one: a SandboxFusion executor pointed at a port nothing listens on, through the code
reward, for a third of the responses of a run on the digit task.
"""

import itertools
import json
import os
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import rewards, testing
from agentrl_jax.rewards import code as code_reward
from agentrl_jax.rl import advantages as adv_lib
from agentrl_jax.rl import batch as batch_lib
from agentrl_jax.rl import trainer
from agentrl_jax.rl import update as update_lib
from agentrl_jax.rollout.episode import Episode, collate
from agentrl_jax.tasks import digits
from agentrl_jax.tools import sandbox_fusion
from agentrl_jax.tools.base import ToolConfig

DEAD = "dead_sandbox_third"


def _episode(group, sample, n_tokens=3):
  return Episode(group=group, sample=sample, prompt_ids=np.array([5, 6]), response_ids=np.arange(7, 7 + n_tokens),
                 loss_mask=np.ones(n_tokens, np.float32), logp_raw=np.zeros(n_tokens, np.float32),
                 logp_sample=np.zeros(n_tokens, np.float32), num_tool_calls=0, num_failed_calls=0,
                 num_malformed_calls=0, stop_reason="end", transcript="", turns=[])


def test_failed_rows_leave_the_group_statistics_and_the_loss():
  reward = np.array([1.0, -1.0, 0.0, 1.0, 0.0, -1.0], np.float32)
  failed = np.array([False, False, True, False, True, False])  # a third of the group
  adv = np.asarray(adv_lib.compute_advantages(jnp.asarray(reward), jnp.zeros(6, jnp.int32),
                                              valid=jnp.asarray(~failed)))
  ok = reward[~failed]
  want = (ok - ok.mean()) / (ok.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(adv[~failed], want, rtol=1e-5)
  assert (adv[failed] == 0).all()
  batch = batch_lib.update_batch(collate([_episode(0, i) for i in range(6)], prompt_bucket_min=4,
                                         response_bucket_min=4), adv, keep=~failed)
  assert not batch["loss_mask"][failed].any() and (batch["advantages"][failed] == 0).all()
  assert batch["loss_mask"][~failed].sum() == 4 * 3
  # A group left with fewer than two scored rows teaches nothing (dynamic sampling drops it).
  score = np.array([1, 0, 0, 1, 1, 0], np.float32)
  np.testing.assert_array_equal(
      batch_lib.informative_groups(score, 3, valid=np.array([True, False, False, True, True, True])), [False, True])


def test_tally_counts_per_source_and_names_the_cause():
  tally = batch_lib.InfraTally()
  part = batch_lib.Scored(score=np.zeros(6, np.float32), acc=np.zeros(6, bool), reward=np.zeros(6, np.float32),
                          overlong_penalty=np.zeros(6, np.float32), truncated=np.zeros(6, bool), pred=[""] * 6,
                          info=["", "reward not computed (sandbox): connection refused", "", "", "bad gt", ""],
                          response_text=[""] * 6, failure=["", "sandbox", "", "", "ground_truth", ""],
                          data_source=["lcb", "lcb", "lcb", "aime", "aime", "aime"])
  tally.add(part)
  assert tally.metrics() == {"reward/infra_failures": 2.0, "reward/infra_failures/aime": 1.0,
                             "reward/infra_failures/lcb": 1.0}
  tally.check(0.5, step=1)  # 2 of 6 is below half
  with pytest.raises(batch_lib.RunStopped, match=r"2 of 6 responses .*sandbox x1 \(lcb x1\).*ground_truth x1"):
    tally.check(0.05, step=1)


class _DeadSandboxThird:
  """Digit-fraction reward, except that every third response from call `start` on is a code answer scored
  against a dead SandboxFusion server."""

  def __init__(self, start: int):
    self.calls = itertools.count()
    self.lock = threading.Lock()
    self.start = start
    self.executor = sandbox_fusion.SandboxFusionExecutor(ToolConfig(
        backend="sandbox_fusion", sandbox_fusion_url="http://127.0.0.1:9/run_code", retries=0, timeout_s=5.0,
        max_concurrency=4))

  def __call__(self, response, ground_truth, extra_info, executor, cfg):
    with self.lock:
      i = next(self.calls)
    if i >= self.start and (i - self.start) % 3 == 0:
      suite = {"inputs": ["1\n"], "outputs": ["2\n"]}
      return code_reward.score("```python\nprint(int(input()) + 1)\n```", suite, executor=self.executor)
    return digits.score(response)


def _config(tmp_path, **overrides):
  return testing.load_config("rl_toy", "digits", **{
      "model.tokenizer_path": testing.tiny_tokenizer_dir(), "reward.sources": [["toy_digits", DEAD]],
      "samples_per_log": 32, "samples_every_steps": 1, **overrides})


@pytest.fixture
def dead_third(request):
  scorer = _DeadSandboxThird(start=request.param)
  rewards.SCORERS[DEAD] = scorer
  yield scorer
  del rewards.SCORERS[DEAD]
  scorer.executor.close()


@pytest.mark.parametrize("dead_third", [0], indirect=True)
def test_rl_step_with_a_third_of_responses_on_a_dead_sandbox(tmp_path, dead_third):
  # Above the threshold the step trains on the other two thirds; the failed rows carry no advantage.
  last = trainer.run(_config(tmp_path, **{"rl.total_steps": 1, "rl.max_infra_failure_frac": 0.5}), str(tmp_path))
  e = 8 * 4  # n x prompts
  failed = len(range(0, e, 3))
  assert last["reward/infra_failures"] == failed and last["reward/infra_failures/toy_digits"] == failed
  assert last["count/infra_failures"] == failed
  samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
  assert len(samples) == e
  bad = [s for s in samples if s["failure"]]
  assert len(bad) == failed and {s["failure"] for s in bad} == {"sandbox"}
  assert all(s["advantage"] == 0.0 and "sandbox" in s["info"] for s in bad)
  assert any(s["advantage"] != 0.0 for s in samples if not s["failure"])
  assert 0 < last["train/tokens"]


@pytest.mark.parametrize("dead_third", [32], indirect=True)
def test_past_the_threshold_the_run_stops_naming_the_cause(tmp_path, dead_third):
  # Step 1 scores cleanly; in step 2 a third of the responses hit the dead sandbox: above the default 5%.
  with pytest.raises(batch_lib.RunStopped, match=r"rl: step 2: the reward of 11 of 32 responses .*"
                                                 r"max_infra_failure_frac=0.05: sandbox x11 \(toy_digits x11\)"):
    trainer.run(_config(tmp_path, **{"rl.total_steps": 3}), str(tmp_path))
  assert os.listdir(tmp_path / "checkpoints") == ["1"]  # step 1 kept; step 2 never updated
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1] and rows[0]["reward/infra_failures"] == 0


def _poison_updates_from_step_2(monkeypatch):
  """From the third mini-batch (step 2; two a step) on, the update's advantages are NaN: a real NaN loss."""
  real = update_lib.make_update_fn

  def poisoned(*args, **kwargs):
    update = real(*args, **kwargs)
    calls = itertools.count()

    def step(state, batch, key):
      if next(calls) >= 2:
        batch = dict(batch, advantages=batch["advantages"] * jnp.nan)
      return update(state, batch, key)

    return step

  monkeypatch.setattr(update_lib, "make_update_fn", poisoned)


def test_consecutive_nonfinite_steps_stop_the_run_keeping_the_last_finite_checkpoint(tmp_path, monkeypatch):
  _poison_updates_from_step_2(monkeypatch)
  config = testing.load_config("rl_toy", "digits", **{
      "model.tokenizer_path": testing.tiny_tokenizer_dir(), "rl.total_steps": 6, "checkpoint.every_steps": 1,
      "rl.max_consecutive_nonfinite_steps": 2})
  with pytest.raises(batch_lib.RunStopped, match="2 steps in a row had updates with a non-finite loss"):
    trainer.run(config, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["train/nonfinite_updates"] for r in rows] == [0.0, 2.0, 2.0]
  assert rows[-1]["count/nonfinite_steps"] == 2
  assert os.listdir(tmp_path / "checkpoints") == ["1"]


def test_unknown_data_source_is_refused_when_the_data_loads(tmp_path):
  import pandas as pd

  rows = digits.rl_rows(6)
  rows[3] = dict(rows[3], data_source="unheard_of_bench")
  path = str(tmp_path / "train.parquet")
  pd.DataFrame(rows).to_parquet(path)
  config = testing.load_config("rl_toy", "digits", **{"model.tokenizer_path": testing.tiny_tokenizer_dir(),
                                                       "data.train_path": path, "data.train_schema": "rl"})
  with pytest.raises(ValueError, match=f"{path}: row 3: no reward for data_source 'unheard_of_bench'"):
    trainer.run(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "checkpoints")  # refused before any model or rollout work


# The same failures in an asynchronous run (`rl.max_staleness` = 1; two batches fill the 64 row slots, so the
# next batch is decoding and scoring beside each update): the stream scores groups as they finish, and a step
# whose update turns out non-finite is finished after the next step's rollouts.
ASYNC = {"rl.max_staleness": 1, "rollout.batch_size": 64}


@pytest.mark.parametrize("dead_third", [0], indirect=True)
def test_async_run_leaves_dead_sandbox_rows_out_of_the_advantages(tmp_path, dead_third):
  last = trainer.run(_config(tmp_path, **{"rl.total_steps": 2, "rl.max_infra_failure_frac": 0.5, **ASYNC}),
                     str(tmp_path))
  assert last["async/staleness_max"] == 1.0  # asynchronous for real: step 2 trained tokens of version 0
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
  assert len(samples) == 2 * 32
  bad = [s for s in samples if s["failure"]]
  # Every third scoring call fails, in whatever order the stream's groups finished, and no third batch starts
  # (the step before the last checkpoint drains the stream): 22 of the 64 calls, whichever step had them.
  assert len(bad) == 2 * 11 == sum(r["reward/infra_failures"] for r in rows) == last["count/infra_failures"]
  assert {s["failure"] for s in bad} == {"sandbox"} and all(s["advantage"] == 0.0 for s in bad)
  assert any(s["advantage"] != 0.0 for s in samples if not s["failure"])


@pytest.mark.parametrize("dead_third", [0], indirect=True)
def test_async_run_past_the_threshold_stops_before_the_update(tmp_path, dead_third):
  # Both batches decode from the start, so how many of step 1's responses drew a failing call depends on the
  # order their groups finished (a third of the 64 calls fail: 11 when step 1's groups finish first).
  with pytest.raises(batch_lib.RunStopped, match=r"rl: step 1: the reward of \d+ of 32 responses .*"
                                                 r"max_infra_failure_frac=0.05: sandbox x\d+"):
    trainer.run(_config(tmp_path, **{"rl.total_steps": 3, **ASYNC}), str(tmp_path))
  assert os.listdir(tmp_path / "checkpoints") == []  # nothing was trained, nothing saved


def test_async_consecutive_nonfinite_steps_stop_the_run(tmp_path, monkeypatch):
  _poison_updates_from_step_2(monkeypatch)
  # Checkpoints every 3 steps: step 2 is finished after step 3's rollouts (its update ran beside them), step 3
  # (due a checkpoint) at once, where the second non-finite step in a row stops the run and saves nothing.
  config = testing.load_config("rl_toy", "digits", **{
      "model.tokenizer_path": testing.tiny_tokenizer_dir(), "rl.total_steps": 6, "checkpoint.every_steps": 3,
      "rl.max_consecutive_nonfinite_steps": 2, **ASYNC})
  with pytest.raises(batch_lib.RunStopped, match="2 steps in a row had updates with a non-finite loss"):
    trainer.run(config, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [(r["step"], r["train/nonfinite_updates"], r["count/nonfinite_steps"]) for r in rows] == [
      (1, 0.0, 0.0), (2, 2.0, 1.0), (3, 2.0, 2.0)]
  assert os.listdir(tmp_path / "checkpoints") == []
