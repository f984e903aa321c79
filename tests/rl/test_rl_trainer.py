"""The RL trainer end to end: the reward rises on a toy task (compiling only in its first step), and a SIGKILLed
run resumes bit for bit."""

import json

import jax
import numpy as np

from agentrl_jax import testing
from agentrl_jax.rl import batch as batch_lib
from agentrl_jax.rl import trainer
from agentrl_jax.rollout.episode import Episode, collate


def _config(arg, **overrides):
  return testing.load_config("rl_toy", arg, **{"model.tokenizer_path": testing.tiny_tokenizer_dir(), **overrides})


def test_reward_rises_on_toy_task(tmp_path):
  """A seeded 12-step run on the digit-fraction task: mean reward of the last 3 steps >> the first 3."""
  last = trainer.run(_config("digits"), str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in rows] == list(range(1, 13))
  rewards = [r["reward/mean"] for r in rows]
  first, final = np.mean(rewards[:3]), np.mean(rewards[-3:])
  assert final > first + 0.2, rewards
  assert last["train/skipped"] == 0.0 and last["train/tokens"] > 0
  for key in ("train/entropy", "train/clip_frac_high", "train/clip_frac_low", "train/grad_norm", "reward/acc",
              "response/length_mean", "reward/overlong_frac", "time/rollout_s", "time/update_s"):
    assert key in last, key
  assert (tmp_path / "samples.jsonl").exists() and list((tmp_path / "tensorboard").iterdir())
  # Synchronous: a step ends when its update's results are in, so it spans its rollouts and its whole update.
  for r in rows:
    assert r["time/step_s"] >= r["time/rollout_s"] + r["time/update_s"], r
    assert 0 < r["time/cpu_busy_frac"] < 1.5 and 0 <= r["time/trainer_idle_frac"] < 1, r
  # Synchronous: every trained token was drawn by the step's own params.
  assert all(r["async/staleness_max"] == 0.0 and r["async/partial_frac"] == 0.0 for r in rows)
  # Every program (set-up, rollout, scoring, update) is built in the first step; the eleven after it, on other
  # prompts with other response lengths, compile nothing.
  programs = [r["compile/programs"] for r in rows]
  assert 0 < programs[0] <= 100 and programs[1:] == programs[:1] * 11, programs


def _episode(group, sample, prompt, response, mask):
  r = len(response)
  return Episode(group=group, sample=sample, prompt_ids=np.array(prompt), response_ids=np.array(response),
                 loss_mask=np.array(mask, np.float32), logp_raw=-np.arange(1, r + 1, dtype=np.float32),
                 logp_sample=np.zeros(r, np.float32), num_tool_calls=0, num_failed_calls=0, num_malformed_calls=0,
                 stop_reason="end", transcript="", turns=[])


def test_update_batch_places_masks_at_response_offsets():
  eps = [_episode(0, 0, [5, 6, 7], [8, 9, 10], [1, 0, 1]), _episode(0, 1, [5], [11, 12], [1, 1])]
  collated = collate(eps, prompt_bucket_min=4, response_bucket_min=4, batch_multiple=4)
  batch = batch_lib.update_batch(collated, np.array([0.5, -0.5]))
  assert batch["tokens"].shape == (4, 8)
  np.testing.assert_array_equal(batch["tokens"][0, :6], [5, 6, 7, 8, 9, 10])
  np.testing.assert_array_equal(batch["loss_mask"][0], [0, 0, 0, 1, 0, 1, 0, 0])
  np.testing.assert_array_equal(batch["loss_mask"][1], [0, 1, 1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch["sampler_logp"][1, 1:3], [-1, -2])
  np.testing.assert_array_equal(batch["advantages"], [0.5, -0.5, 0, 0])
  assert not batch["loss_mask"][2:].any()
  assert len(batch_lib.split_minibatches(batch, 2)) == 2


def test_informative_groups_and_scored_select():
  score = np.array([1, 1, 1, -1, -1, -1, 1, 0, 0.5], np.float32)
  np.testing.assert_array_equal(batch_lib.informative_groups(score, 3), [False, False, True])
  s = batch_lib.Scored(score=score, acc=score > 0, reward=score, overlong_penalty=0 * score,
                       truncated=score < -2, pred=[str(i) for i in range(9)], info=[""] * 9,
                       response_text=["x"] * 9)
  part = s.select(range(6, 9))
  both = batch_lib.Scored.concat([s.select([0]), part])
  np.testing.assert_array_equal(both.score, [1, 1, 0, 0.5])
  assert both.pred == ["0", "6", "7", "8"]


FLAGS = ["--config=configs/rl_toy.py:digits", "--config.rl.total_steps=8", "--config.checkpoint.every_steps=3",
         "--config.checkpoint.max_to_keep=5"]


def test_rl_resume_after_sigkill_is_bit_identical(tmp_path):
  """Killed with SIGKILL after its step-3 checkpoint and restarted, a run ends with the same bits as one that
  was never interrupted: params, Adam moments, step, PRNG key, counters and metrics log."""
  full, killed = testing.run_killed_and_resumed(FLAGS, tmp_path, total_steps=8, kill_wait_s=120, run_wait_s=400)

  step_a, state_a, meta_a = testing.latest_checkpoint_state(full / "checkpoints")
  step_b, state_b, meta_b = testing.latest_checkpoint_state(killed / "checkpoints")
  assert step_a == step_b == 8 and meta_a == meta_b
  leaves_a, tree_a = jax.tree.flatten(state_a)
  leaves_b, tree_b = jax.tree.flatten(state_b)
  assert tree_a == tree_b and len(leaves_a) > 20
  for a, b in zip(leaves_a, leaves_b):
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
  metrics = lambda d: [{k: v for k, v in json.loads(l).items()  # noqa: E731
                        if not k.startswith(("time/", "compile/"))}  # the process's, not the run's
                       for l in open(d / "metrics.jsonl")]
  assert metrics(full) == metrics(killed)


def test_lora_rl_restarted_run_restores_the_adapters_onto_the_base_exactly(tmp_path):
  """RL with LoRA adapters: 4 steps in one run, or 2 and then 2 more after a restart (the base loaded again from
  the model block, the adapters, moments, key and data position from the checkpoint) end with the same bits; the
  checkpoints hold the adapters alone."""
  over = {"lora.rank": 4, "lora.alpha": 8.0, "checkpoint.every_steps": 2}
  (tmp_path / "full").mkdir()
  (tmp_path / "split").mkdir()
  trainer.run(_config("digits", **over, **{"rl.total_steps": 4}), str(tmp_path / "full"))
  trainer.run(_config("digits", **over, **{"rl.total_steps": 2}), str(tmp_path / "split"))
  trainer.run(_config("digits", **over, **{"rl.total_steps": 4}), str(tmp_path / "split"))
  step_a, state_a, meta_a = testing.latest_checkpoint_state(tmp_path / "full" / "checkpoints")
  step_b, state_b, meta_b = testing.latest_checkpoint_state(tmp_path / "split" / "checkpoints")
  assert step_a == step_b == 4 and meta_a["lora"] == meta_b["lora"] and meta_a["lora"]["config"]["rank"] == 4
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state_a["train"]["params"])[0]]
  assert len(paths) == 14 and all("_lora_" in p for p in paths), paths
  leaves_a, tree_a = jax.tree.flatten(state_a)
  leaves_b, tree_b = jax.tree.flatten(state_b)
  assert tree_a == tree_b
  for a, b in zip(leaves_a, leaves_b):
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
  assert float(np.max(np.abs(state_a["train"]["params"]["layers"]["attn"]["q_lora_b_rnh"]["value"]))) > 0
