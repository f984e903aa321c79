"""The compiled update step with off-policy correction: micro-batching stays exact (plain and packed rows), the
update equals the objective on the whole batch, its metrics are the mini-batch's, and the defaults are bitwise
unchanged by the sampler's log-probs."""

import functools

import jax
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import losses, offpolicy
from agentrl_jax.rl import update as update_lib

CFG = ModelConfig.tiny_qwen3(num_layers=1)
B, T = 4, 32
OPT = update_lib.OptimizerConfig(learning_rate=1.0, eps=1.0, weight_decay=0.0, grad_clip=None)  # see test_update_step
CORRECTED = losses.LossConfig(is_level="sequence", tis_cap=2.0, behav_imp_weight_cap=4.0,
                              rejection="seq_mean_k3,token_k1", rejection_threshold="0.02,0.5_3.0")


def _mesh():
  return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


@functools.cache
def _init():
  mesh = _mesh()
  graphdef, state = update_lib.init_train_state(testing.tiny_model(CFG, seed=0), OPT, mesh)
  return graphdef, update_lib.train_state_shardings(state, mesh), jax.tree.map(np.asarray, jax.device_get(state))


@functools.cache
def _update_fn(loss_cfg, micro):
  graphdef, shardings, _ = _init()
  return update_lib.make_update_fn(graphdef, shardings, loss_cfg, OPT, _mesh(), micro_batch_size=micro,
                                   logits_chunk_size=8)


def _step(loss_cfg, micro, batch):
  graphdef, shardings, host = _init()
  state, metrics = _update_fn(loss_cfg, micro)(jax.device_put(host, shardings), batch, jax.random.key(0))
  return jax.tree.map(np.asarray, jax.device_get(state)), {k: float(v) for k, v in metrics.items()}


def _batch(packed: bool, seed=0):
  """Rows of episodes (plain: one per row; packed: 2-3 per row with segment ids), and sampler log-probs that
  are close to the trainer's on some episodes and far on others (so rules both keep and reject)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  seg = np.zeros((B, T), np.int32)
  pos = np.zeros((B, T), np.int32)
  layouts = [[12, 10, 8], [20, 9], [14, 14], [30]] if packed else [[T], [T - 4], [T - 9], [T - 2]]
  shift = np.zeros((B, T), np.float32)
  for i, lengths in enumerate(layouts):
    start = 0
    for j, n in enumerate(lengths):
      seg[i, start:start + n] = j + 1
      pos[i, start:start + n] = np.arange(n)
      mask[i, start + 4:start + n] = 1  # a 4-token prompt per episode
      shift[i, start:start + n] = rng.normal() * 0.15  # per-episode drift of the sampler
      start += n
  shift += rng.normal(size=(B, T)).astype(np.float32) * 0.05
  shift[1, 6] = -1.3  # a token the sampler found much less likely: weight e^1.3 > the cap 4 -> zeroed
  old = (-3.0 + 0.3 * rng.standard_normal((B, T))).astype(np.float32)
  batch = {"tokens": tokens, "loss_mask": mask, "old_logp": old, "sampler_logp": old + shift,
           "advantages": rng.standard_normal((B, T) if packed else B).astype(np.float32)}
  if packed:
    batch["advantages"] *= seg > 0
    batch.update(segment_ids=seg, positions=pos)
  return batch


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_corrected_update_is_exact_over_micro_batches_and_matches_the_objective(packed):
  batch = _batch(packed)
  s_big, m_big = _step(CORRECTED, B, batch)
  s_mb, m_mb = _step(CORRECTED, 1, batch)  # one row per micro-batch: packed sequences never straddle two
  for k in m_big:
    assert m_mb[k] == pytest.approx(m_big[k], rel=1e-5, abs=1e-6), k
  for k in offpolicy.ADDITIVE_PARTS + ("is_weight_max", "is_ess", "rejected_seq_frac", "behav_kl_k3"):
    assert m_mb[k] == m_big[k], k  # computed once on the whole mini-batch, not summed over micro-batches
  assert _max_diff(s_mb.params, s_big.params) <= 1e-6
  assert 0 < m_big["rejected_seq_frac"] < 1 and m_big["is_weight_max"] > 4.0
  assert m_big["tokens"] < m_big["is_tokens"]  # rejected tokens left the normaliser

  # The same numbers as the objective computed (correction included) on the whole batch at the initial params.
  graphdef, _, host = _init()
  logp, entropy = jax.jit(lambda p, b: update_lib.token_logprobs(graphdef, p, b, logits_chunk_size=8))(
      host.params, {k: batch[k] for k in update_lib.LOGPROB_KEYS if k in batch})
  mask = np.asarray(batch["loss_mask"]).copy()
  mask[:, 0] = 0
  adv = batch["advantages"] if packed else np.broadcast_to(batch["advantages"][:, None], (B, T))
  loss, m = losses.grpo_objective(CORRECTED, logp=logp, logp_old=batch["old_logp"], advantages=adv, mask=mask,
                                  entropy=entropy, logp_sampler=batch["sampler_logp"],
                                  segment_ids=batch.get("segment_ids"))
  assert m_big["loss"] == pytest.approx(float(loss), rel=1e-5)
  for k in ("is_weight_mean", "is_ess", "rejected_token_frac", "rejected_seq_frac", "behav_ppl_ratio", "entropy"):
    assert m_big[k] == pytest.approx(float(m[k]), rel=1e-5), k


def test_rejection_only_update_matches_the_objective():
  """verl's K3 rejection preset (no weights): micro-batches get the rejected mask only."""
  loss_cfg = losses.LossConfig(**offpolicy.preset("decoupled_k3_rs"))
  batch = _batch(packed=False, seed=1)
  _, m = _step(loss_cfg, 1, batch)
  graphdef, _, host = _init()
  logp, _ = jax.jit(lambda p, t: update_lib.token_logprobs(graphdef, p, {"tokens": t}, logits_chunk_size=8))(
      host.params, batch["tokens"])
  mask = np.asarray(batch["loss_mask"]).copy()
  mask[:, 0] = 0
  loss, want = losses.grpo_objective(loss_cfg, logp=logp, logp_old=batch["old_logp"], mask=mask,
                                     advantages=np.broadcast_to(batch["advantages"][:, None], (B, T)),
                                     logp_sampler=batch["sampler_logp"])
  assert 0 < m["rejected_seq_frac"] < 1 and m["tokens"] < m["is_tokens"]
  assert m["loss"] == pytest.approx(float(loss), rel=1e-5)
  assert m["rejected_token_frac"] == pytest.approx(float(want["rejected_token_frac"]))


def test_a_nan_sampler_logprob_skips_a_rejection_only_step():
  """verl's K3 rejection preset never multiplies the loss by a weight, so a NaN sampler log-prob cannot make the
  loss NaN: the correction's NaN check must skip the step (params unchanged), as for a weighted correction."""
  loss_cfg = losses.LossConfig(**offpolicy.preset("decoupled_k3_rs"))
  batch = _batch(packed=False, seed=1)
  batch["sampler_logp"] = batch["sampler_logp"].copy()
  batch["sampler_logp"][2, 10] = np.nan  # a trained token
  state, m = _step(loss_cfg, 1, batch)
  assert m["skipped"] == 1.0
  assert _max_diff(state.params, _init()[2].params) == 0.0
  batch["loss_mask"] = batch["loss_mask"].copy()
  batch["loss_mask"][2, 10] = 0  # the same NaN off the trained tokens: the step trains
  _, m = _step(loss_cfg, 1, batch)
  assert m["skipped"] == 0.0


def test_defaults_are_bitwise_unchanged_by_the_sampler_logprobs():
  """Recipe defaults: "sampler_logp" in the batch adds the off-policy metrics and changes nothing else, bit for
  bit; an on-policy batch (sampler = trainer) under a full correction also gives the default step bit for bit."""
  batch = _batch(packed=True)
  plain = {k: v for k, v in batch.items() if k != "sampler_logp"}
  s0, m0 = _step(losses.LossConfig(), 1, plain)
  s1, m1 = _step(losses.LossConfig(), 1, batch)
  assert _max_diff(s0, s1) == 0.0
  assert {k: m1[k] for k in m0} == m0
  assert set(m1) - set(m0) == set(offpolicy.correct(None, logp_prox=batch["old_logp"], logp_behav=batch["old_logp"],
                                                    mask=batch["loss_mask"]).metrics)
  s2, m2 = _step(CORRECTED, 1, dict(batch, sampler_logp=batch["old_logp"]))
  assert _max_diff(s0, s2) == 0.0
  assert {k: m2[k] for k in m0} == m0
  assert m2["rejected_token_frac"] == 0.0 and m2["is_ess"] == 1.0


def test_correction_requires_sampler_logp():
  batch = _batch(packed=False)
  del batch["sampler_logp"]
  graphdef, shardings, host = _init()
  with pytest.raises(ValueError, match="sampler_logp"):
    _update_fn(CORRECTED, 1)(jax.device_put(host, shardings), batch, jax.random.key(0))
