"""The compiled update step on one device: micro-batching is exact, masked tokens get no gradient, non-finite
steps are skipped, log-prob alignment, one compile per shape."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import nnx

from agentrl_jax import testing
from agentrl_jax import train_state as train_state_lib
from agentrl_jax.models import sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import losses
from agentrl_jax.rl import update as update_lib

CFG = ModelConfig.tiny_qwen3(num_layers=1)  # one layer: compile time dominates these tests
B, T, PROMPT = 4, 32, 8
# lr 1, eps 1, no decay/clip: one step moves each param by -g / (|g| + 1), a smooth function of the gradient, so
# comparing params after the step compares gradients (Adam's g / |g| would amplify round-off in tiny ones).
GRAD_PROBE = train_state_lib.OptimizerConfig(learning_rate=1.0, eps=1.0, weight_decay=0.0, grad_clip=None)


def _mesh():
  return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


@functools.cache
def _init(opt_cfg, seed):
  mesh = _mesh()
  graphdef, state = train_state_lib.init_train_state(testing.tiny_model(CFG, seed=seed), opt_cfg, mesh)
  return graphdef, train_state_lib.train_state_shardings(state, mesh), _host(state)


@functools.cache
def _update_fn(loss_cfg, opt_cfg, micro):
  graphdef, shardings, _ = _init(opt_cfg, 0)
  return update_lib.make_update_fn(graphdef, shardings, loss_cfg, opt_cfg, _mesh(), micro_batch_size=micro,
                                   logits_chunk_size=8)


def _setup(opt_cfg=GRAD_PROBE, loss_cfg=losses.LossConfig(), micro=2, seed=0, fresh=False):
  """(graphdef, a fresh device copy of the initial state, shardings, update fn); fns are shared across tests
  (each distinct one costs a compile) unless `fresh`."""
  graphdef, shardings, host_state = _init(opt_cfg, seed)
  fn = _update_fn.__wrapped__(loss_cfg, opt_cfg, micro) if fresh else _update_fn(loss_cfg, opt_cfg, micro)
  return graphdef, jax.device_put(host_state, shardings), shardings, fn


def _batch(seed=0, b=B, t=T):
  """Rows: prompt (mask 0), model tokens (1), a tool-output span (0), model tokens (1), right padding (0)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CFG.vocab_size, (b, t)).astype(np.int32)
  mask = np.zeros((b, t), np.float32)
  ends = [t, t - 5, t - 9, t - 3][:b] + [t] * max(0, b - 4)
  for i in range(b):
    mask[i, PROMPT:ends[i]] = 1
    mask[i, 14:18] = 0  # tool output
    tokens[i, ends[i]:] = 0  # padding
  old = -3.0 + 0.3 * rng.standard_normal((b, t)).astype(np.float32)
  adv = rng.standard_normal(b).astype(np.float32)
  return {"tokens": tokens, "loss_mask": mask, "advantages": adv, "old_logp": old}


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _step(fn, state, batch, n=1):
  for _ in range(n):
    state, metrics = fn(state, batch, jax.random.key(0))
  return _host(state), {k: float(v) for k, v in metrics.items()}


@pytest.mark.parametrize("loss_cfg", [losses.LossConfig(),
                                      losses.LossConfig(loss_agg_mode="seq-mean-token-mean", entropy_coeff=0.01)],
                         ids=["token-mean", "seq-mean-token-mean+entropy"])
def test_micro_batched_update_equals_big_batch(loss_cfg):
  batch = _batch()
  _, st_big, _, big = _setup(loss_cfg=loss_cfg, micro=B)
  _, st_mb, _, micro = _setup(loss_cfg=loss_cfg, micro=2)
  p0 = _host(st_big.params)
  s_big, m_big = _step(big, st_big, batch)
  s_mb, m_mb = _step(micro, st_mb, batch)
  for k in m_big:
    assert m_mb[k] == pytest.approx(m_big[k], rel=1e-5, abs=1e-6), k
  assert m_big["skipped"] == 0 and m_big["clip_frac"] > 0
  assert m_big["tokens"] == float(np.sum(np.asarray(batch["loss_mask"])[:, 1:] != 0))
  assert _max_diff(s_mb.params, s_big.params) <= 1e-6
  assert _max_diff(p0, s_big.params) > 1e-3  # the step did move the params
  assert int(s_big.step) == int(s_mb.step) == 1


def test_token_mean_is_the_mean_over_all_tokens():
  """Rows of very different lengths: the loss is the mean over tokens, not a mean of micro-batch means."""
  batch = _batch()
  batch["old_logp"] = np.zeros_like(batch["old_logp"]) - 50.0  # ratio clamps to exp(20): every token clipped
  _, state, _, fn = _setup()
  _, m = _step(fn, state, batch)
  mask = np.asarray(batch["loss_mask"]).copy()
  mask[:, 0] = 0
  adv = np.broadcast_to(batch["advantages"][:, None], mask.shape)
  # A > 0: clipped at 1 + 0.28; A < 0: dual clip at 10.
  per_tok = np.where(adv > 0, -adv * 1.28, -adv * 10.0)
  assert m["loss"] == pytest.approx(float(np.sum(per_tok * mask) / mask.sum()), rel=1e-5)


def test_logprobs_alignment_and_entropy():
  """logp[:, t] scores tokens[:, t] with the logits at t - 1 (the logit at t predicts t + 1)."""
  graphdef, state, shardings, fn = _setup()
  mesh = _mesh()
  batch = _batch()
  tok = batch["tokens"]
  lp_fn = update_lib.make_logprobs_fn(graphdef, shardings.params, mesh, micro_batch_size=2, logits_chunk_size=8)
  lp = np.asarray(lp_fn(state.params, {"tokens": tok}))
  model = nnx.merge(graphdef, state.params)
  logits = np.asarray(testing.jit_forward(model)(jnp.asarray(tok))[0], np.float64)
  log_sm = logits - logits.max(-1, keepdims=True)
  log_sm = log_sm - np.log(np.exp(log_sm).sum(-1, keepdims=True))
  want = np.take_along_axis(log_sm[:, :-1], tok[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(lp[:, 1:], want, atol=2e-5)
  assert np.all(lp[:, 0] == 0)
  # Temperature divides the logits, as the sampler does.
  lp_t = np.asarray(update_lib.make_logprobs_fn(graphdef, shardings.params, mesh, micro_batch_size=4,
                                                temperature=0.5)(state.params, {"tokens": tok}))
  z = logits[:, :-1] / 0.5
  z = z - z.max(-1, keepdims=True)
  want_t = np.take_along_axis(z, tok[:, 1:, None], -1)[..., 0] - np.log(np.exp(z).sum(-1))
  np.testing.assert_allclose(lp_t[:, 1:], want_t, atol=5e-5)

  # On-policy (old = current): ratio 1, approx KL 0; the entropy metric is the exact masked token mean.
  batch["old_logp"] = lp
  _, m = _step(fn, state, batch)
  p = np.exp(log_sm[:, :-1])
  ent = -(p * log_sm[:, :-1]).sum(-1)
  mask = np.asarray(batch["loss_mask"])[:, 1:]
  assert m["entropy"] == pytest.approx(float((ent * mask).sum() / mask.sum()), rel=1e-5)
  assert abs(m["approx_kl"]) < 1e-6 and m["clip_frac"] == 0


def test_masked_positions_get_no_gradient():
  """Advantages, old and sampler log-probs at mask-0 positions (tool output, prompt, padding), and tokens
  after the last trained token, do not change the step at all (bitwise)."""
  loss_cfg = losses.LossConfig(tis_cap=2.0)
  batch = _batch()
  batch["advantages"] = np.broadcast_to(batch["advantages"][:, None], (B, T)).copy()
  batch["sampler_logp"] = batch["old_logp"] - 0.1
  _, st1, _, fn = _setup(loss_cfg=loss_cfg)
  s1, m1 = _step(fn, st1, batch)

  rng = np.random.default_rng(7)
  masked = np.asarray(batch["loss_mask"]) == 0
  other = {k: np.array(v) for k, v in batch.items()}
  other["advantages"][masked] = rng.standard_normal(masked.sum()) * 100
  other["old_logp"][masked] = np.nan
  other["sampler_logp"][masked] = -np.inf
  for i in range(B):  # tokens after the row's last trained token: trailing tool output / padding
    last = np.nonzero(~masked[i])[0].max()
    other["tokens"][i, last + 1:] = rng.integers(0, CFG.vocab_size, T - last - 1)
  assert any((other["tokens"] != batch["tokens"]).ravel())
  _, st2, _, fn2 = _setup(loss_cfg=loss_cfg)
  s2, m2 = _step(fn2, st2, other)
  assert m1 == m2
  assert _max_diff(s1.params, s2.params) == 0.0
  assert _max_diff(s1.opt_state, s2.opt_state) == 0.0

  # ... while a trained position's advantage does change it.
  third = {k: np.array(v) for k, v in batch.items()}
  third["advantages"][0, PROMPT + 1] += 1.0
  _, st3, _, fn3 = _setup(loss_cfg=loss_cfg)
  s3, _ = _step(fn3, st3, third)
  assert _max_diff(s1.params, s3.params) > 0


@pytest.mark.parametrize("where,value", [("advantages", np.nan), ("advantages", np.inf), ("old_logp", np.nan)])
def test_non_finite_step_is_skipped(where, value):
  _, state, _, fn = _setup()
  before = _host(state)
  batch = _batch()
  batch[where] = np.array(batch[where])
  if where == "advantages":
    batch[where][1] = value
  else:
    batch[where][1, PROMPT + 2] = value
  state, metrics = fn(state, batch, jax.random.key(0))
  assert float(metrics["skipped"]) == 1.0
  assert not np.isfinite(float(metrics["loss"])) or not np.isfinite(float(metrics["grad_norm"]))
  after = _host(state)
  assert jax.tree.structure(after) == jax.tree.structure(before)
  for x, y in zip(jax.tree.leaves(after), jax.tree.leaves(before)):
    np.testing.assert_array_equal(x, y)
  # The run goes on: the next good batch is applied.
  state, metrics = fn(state, _batch(), jax.random.key(0))
  assert float(metrics["skipped"]) == 0.0 and int(state.step) == 1
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(_host(state)))


def test_reference_kl_grad_clip_and_warmup():
  loss_cfg = losses.LossConfig(kl_coeff=0.1, kl_type="k3")
  opt = train_state_lib.OptimizerConfig(learning_rate=1e-2, grad_clip=1e-3, warmup_steps=2)
  _, state, _, fn = _setup(loss_cfg=loss_cfg, opt_cfg=opt)
  batch = _batch()
  with pytest.raises(ValueError, match="ref_logp"):
    fn(state, batch, jax.random.key(0))
  batch["ref_logp"] = batch["old_logp"] - 0.5
  p0 = _host(state.params)
  lrs = []
  for _ in range(3):
    state, m = fn(state, batch, jax.random.key(0))
    lrs.append(float(m["learning_rate"]))
    assert float(m["grad_norm"]) > 1e-3  # reported before clipping
    assert float(m["kl_ref"]) > 0 and float(m["loss"]) != float(m["pg_loss"])
  assert lrs == pytest.approx([0.0, 5e-3, 1e-2])
  assert int(state.step) == 3 and _max_diff(p0, _host(state.params)) > 0


def test_batch_validation():
  _, state, _, fn = _setup(micro=3)
  with pytest.raises(ValueError, match="multiple of micro_batch_size"):
    fn(state, _batch(), jax.random.key(0))
  _, state, _, fn = _setup()
  with pytest.raises(ValueError, match="unknown keys"):
    fn(state, dict(_batch(), rewards=np.zeros(B)), jax.random.key(0))
  bad = _batch()
  bad["old_logp"] = bad["old_logp"][:, :-1]
  with pytest.raises(ValueError, match="old_logp"):
    fn(state, bad, jax.random.key(0))


def test_compiles_once_per_bucketed_shape():
  compiles = []

  def listener(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(kw.get("fun_name", ""))

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    _, state, shardings, fn = _setup(fresh=True)
    for seed, t in [(0, 16), (1, 16), (2, 32), (3, 16), (4, 32)]:
      state, _ = fn(state, _batch(seed, t=t), jax.random.key(seed))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert sum("update" in name for name in compiles) == 2, compiles
