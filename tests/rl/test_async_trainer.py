"""Asynchronous RL end to end (`rl.max_staleness` > 0): staleness bounded, partial rollouts, and a run that is
a deterministic function of its seed and config: a SIGKILLed run resumed from its checkpoint ends with the same
bits as an uninterrupted one."""

import json

import jax
import pytest

from agentrl_jax import testing

# Two batches of 4 prompts x 8 samples fit the 64 row slots, so batch b+1 runs beside batch b.
FLAGS = ["--config=configs/rl_toy.py:digits", "--config.rl.total_steps=8", "--config.checkpoint.every_steps=3",
         "--config.checkpoint.max_to_keep=5", "--config.rl.max_staleness=1", "--config.rollout.batch_size=64",
         "--config.rollout.segment_len=4"]


def _metrics(workdir):
  return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "compile/"))}
          for line in open(workdir / "metrics.jsonl")]


def test_async_run_is_stale_partial_and_resumes_bit_identical(tmp_path):
  full, killed = testing.run_killed_and_resumed(FLAGS, tmp_path, total_steps=8, kill_wait_s=300, run_wait_s=600)

  rows = _metrics(full)
  assert [r["step"] for r in rows] == list(range(1, 9))
  # Asynchronous for real: trained tokens up to one version old, never older than the bound. (Episodes whose
  # weights change mid-way: tests/rollout/test_agent_loop_stream.py; this single-turn task runs in lockstep.)
  assert max(r["async/staleness_max"] for r in rows) == 1.0
  assert all(r["async/staleness_max"] <= 1.0 for r in rows)
  assert sum(r["async/staleness_mean"] for r in rows) > 0
  assert all(r["count/stale_dropped"] == 0 for r in rows)
  # The steps before checkpoints drain the stream: no checkpoint aborted a group in flight.
  assert rows[-1]["count/aborted_groups"] == 0
  # Every prompt trained once: 8 steps x 4 prompts, whatever the interruption.
  assert rows[-1]["count/prompts"] == 32 and _metrics(killed)[-1]["count/prompts"] == 32

  step_a, state_a, meta_a = testing.latest_checkpoint_state(full / "checkpoints")
  step_b, state_b, meta_b = testing.latest_checkpoint_state(killed / "checkpoints")
  assert step_a == step_b == 8 and meta_a == meta_b
  leaves_a, tree_a = jax.tree.flatten(state_a)
  leaves_b, tree_b = jax.tree.flatten(state_b)
  assert tree_a == tree_b and len(leaves_a) > 20
  for a, b in zip(leaves_a, leaves_b):
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
  assert rows == _metrics(killed)


def test_async_step_metrics_count_each_steps_own_work(tmp_path, monkeypatch):
  """A deferred step is logged after the next step's rollouts: its counts are those of its own dispatch. A step
  that waits for its own update (a checkpoint step) counts that update's device time, not the next step."""
  import numpy as np

  from agentrl_jax.rl import batch as batch_lib
  from agentrl_jax.rl import trainer

  informative = batch_lib.informative_groups

  def first_group_uninformative(score, n, valid=None):  # dynamic sampling drops one group every round
    keep = np.ones_like(np.asarray(informative(score, n, valid=valid)))
    keep[0] = False
    return keep

  monkeypatch.setattr(batch_lib, "informative_groups", first_group_uninformative)
  cfg = testing.load_config("rl_toy", "digits", **{
      "rl.total_steps": 4, "checkpoint.every_steps": 2, "rl.max_staleness": 1, "rollout.batch_size": 64,
      "rollout.segment_len": 4, "rl.dynamic_sampling": True})
  trainer.run(cfg, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  dropped = np.diff([0] + [r["count/dropped_groups"] for r in rows])
  prompts = np.diff([0] + [r["count/prompts"] for r in rows])
  assert dropped.tolist() == [r["groups/rounds"] for r in rows]  # one group a round, counted in its own step
  assert prompts.tolist() == [4] * 4
  # Steps 2 and 4 checkpoint, so they wait for their own updates: their windows hold those updates (and the
  # previous step's, which ran during their rollouts); step 3's window runs none (step 2 waited for its own).
  dev = [r["time/update_device_s"] for r in rows]
  assert dev[1] > 0 and dev[3] > 0 and dev[2] == 0.0, dev
  assert rows[1]["time/trainer_idle_frac"] < 1.0 and rows[3]["time/trainer_idle_frac"] < 1.0


@pytest.mark.slow  # two trainer runs (6 and 3 steps): the default suite keeps its one kill-and-resume test above
def test_a_resume_restores_the_streams_buffered_groups_bit_identical(tmp_path):
  """At max_staleness 2 the stream runs two batches ahead, so a checkpoint's drain leaves finished groups of the
  next batch in the buffer: the checkpoint carries them (not regenerated), and a run resumed from it ends with the
  bits of the uninterrupted run. Evaluations, which stop the stream, replay at the same steps."""
  import pickle
  import shutil

  from agentrl_jax.rl import trainer
  from agentrl_jax.tasks import digits

  path = digits.write_rl_parquet(str(tmp_path / "eval.parquet"), 4)
  cfg = lambda: testing.load_config("rl_toy", "digits", **{  # noqa: E731
      "rl.total_steps": 6, "checkpoint.every_steps": 3, "rl.max_staleness": 2, "rollout.batch_size": 64,
      "rollout.segment_len": 4, "eval.every_steps": 4, "eval.n": 2, "eval.ks": [2],
      "eval.sources": [dict(name="digits", path=path, schema="rl")]})
  full, resumed = tmp_path / "full", tmp_path / "resumed"
  full.mkdir()
  trainer.run(cfg(), str(full))
  with open(full / "stream" / "3.pkl", "rb") as f:
    saved = pickle.load(f)
  assert saved["consumed"] == 3 and sum(len(b["groups"]) for b in saved["batches"]) > 0
  # The run as a SIGKILL after its step-3 checkpoint leaves it, rerun with the same config.
  shutil.copytree(full, resumed)
  shutil.rmtree(resumed / "checkpoints" / "6")
  (resumed / "stream" / "6.pkl").unlink()
  trainer.run(cfg(), str(resumed))
  step_a, state_a, _ = testing.latest_checkpoint_state(full / "checkpoints")
  step_b, state_b, _ = testing.latest_checkpoint_state(resumed / "checkpoints")
  assert step_a == step_b == 6
  leaves_a, leaves_b = jax.tree.leaves(state_a), jax.tree.leaves(state_b)
  assert len(leaves_a) == len(leaves_b) > 20
  assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(leaves_a, leaves_b))
  def evals(run):
    rows = map(json.loads, open(run / "metrics.jsonl"))
    return [(r["step"], r["eval/toy_digits/score_mean"]) for r in rows if "eval/toy_digits/score_mean" in r]

  assert [s for s, _ in evals(full)] == [4, 6] and evals(resumed) == evals(full)  # rerun after the resume


def test_an_evaluation_runs_on_a_stopped_stream(tmp_path, monkeypatch):
  """The step before an evaluation drains the stream and the evaluation stops it, so it decodes beside no stream
  KV cache (on a slice most of a sampler chip's memory), on the weights the sampler holds, and nothing in flight is
  aborted."""
  from agentrl_jax.evaluation import runner as eval_runner
  from agentrl_jax.rl import stream as stream_lib
  from agentrl_jax.rl import trainer
  from agentrl_jax.tasks import digits

  streams, freed, seen = [], [], []

  def live_bytes():
    return sum(x.nbytes for x in jax.live_arrays())

  class Recorded(stream_lib.RolloutStream):
    def __init__(self, *args, **kw):
      super().__init__(*args, **kw)
      streams.append(self)

    def stop(self, params, version):
      cache = sum(x.nbytes for x in jax.tree.leaves(self.loop.state))
      before = live_bytes()
      out = super().stop(params, version)
      freed.append((version, cache, before - live_bytes()))
      return out

  evaluate = eval_runner.evaluate

  def checked(engine, params, records, **kw):
    (s,) = streams
    seen.append((s.loop.state is None, s.loop.busy, params is s.weights, s._sampler_version))
    return evaluate(engine, params, records, **kw)

  monkeypatch.setattr(stream_lib, "RolloutStream", Recorded)
  monkeypatch.setattr(eval_runner, "evaluate", checked)
  path = digits.write_rl_parquet(str(tmp_path / "eval.parquet"), 8)
  cfg = testing.load_config("rl_toy", "digits", **{
      "rl.total_steps": 4, "checkpoint.every_steps": 4, "rl.max_staleness": 1, "rollout.batch_size": 64,
      "rollout.segment_len": 4, "eval.every_steps": 2, "eval.n": 2, "eval.ks": [2],
      "eval.sources": [dict(name="digits", path=path, schema="rl", limit=4)]})
  (tmp_path / "run").mkdir()
  trainer.run(cfg, str(tmp_path / "run"))
  # Steps 2 and 4 evaluate (4 also checkpoints): the stream stopped, idle, on the step's weights.
  assert seen == [(True, False, True, 2), (True, False, True, 4)]
  # Each evaluation's stop freed the cache (the checkpoint's at 4 then finds the loop stopped: nothing to free).
  evals = [f for f in freed if f[1]]
  assert [f[0] for f in evals] == [2, 4] and all(cache > 0 and gone >= cache for _, cache, gone in evals), freed
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  train = [r for r in rows if "count/aborted_groups" in r]
  assert [r["step"] for r in train] == [1, 2, 3, 4] and train[-1]["count/aborted_groups"] == 0
  assert [r["step"] for r in rows if r.get("eval/toy_digits/n_problems") == 4] == [2, 4]
