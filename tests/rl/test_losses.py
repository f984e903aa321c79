"""Hand-computed checks of the GRPO-TCR policy loss, aggregation, entropy, KL and gradient masking."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from agentrl_jax.rl import logprobs as LP
from agentrl_jax.rl import losses as L

CFG = L.LossConfig()  # recipe: clip 0.2 / 0.28, dual clip 10, token-mean


def _ppo(ratio, adv, cfg=CFG, mask=None):
  ratio = jnp.asarray(ratio, jnp.float32)[None]
  adv = jnp.asarray(adv, jnp.float32)[None]
  mask = jnp.ones_like(ratio) if mask is None else jnp.asarray(mask)[None]
  return _ppo_jit(jnp.log(ratio), adv, mask, cfg)


@functools.partial(jax.jit, static_argnums=3)
def _ppo_jit(logp, adv, mask, cfg):
  return L.ppo_clip_loss(logp, jnp.zeros_like(logp), adv, mask, cfg)


# ---------------------------------------------------------------- policy loss branches (hand-computed)

CASES = [  # ratio, advantage, loss, d loss / d logp, (high, low, dual)
    (1.1, 2.0, -2.2, -2.2, (0, 0, 0)),  # unclipped
    (1.5, 1.0, -1.28, 0.0, (1, 0, 0)),  # clip high, A > 0: -A * (1 + 0.28)
    (0.5, 1.0, -0.5, -0.5, (0, 0, 0)),  # A > 0 below 1 - eps: PPO does not clip
    (0.5, -1.0, 0.8, 0.0, (0, 1, 0)),  # clip low, A < 0: -A * (1 - 0.2)
    (1.5, -1.0, 1.5, 1.5, (0, 0, 0)),  # A < 0 above 1 + eps_h: unclipped (pessimistic)
    (20.0, -0.5, 5.0, 0.0, (0, 0, 1)),  # dual clip: -A * c
    (1.5, 0.0, 0.0, 0.0, (0, 0, 0)),  # zero advantage
]


@jax.jit
def _grad_ppo(logp, adv):
  return jax.grad(lambda lp: L.ppo_clip_loss(lp, jnp.zeros_like(lp), adv, jnp.ones_like(lp), CFG).loss.sum())(logp)


@pytest.mark.parametrize("ratio,adv,want,want_grad,flags", CASES)
def test_clip_branches(ratio, adv, want, want_grad, flags):
  out = _ppo([ratio], [adv])
  np.testing.assert_allclose(out.loss[0, 0], want, rtol=1e-6)
  got_flags = (out.clip_high[0, 0], out.clip_low[0, 0], out.dual_clip[0, 0])
  assert tuple(float(f) for f in got_flags) == flags

  grad = _grad_ppo(jnp.full((1, 1), math.log(ratio)), jnp.full((1, 1), adv))
  np.testing.assert_allclose(grad[0, 0], want_grad, rtol=1e-6, atol=1e-7)


def test_dual_clip_off():
  cfg = dataclasses.replace(CFG, dual_clip_c=None)
  out = _ppo([20.0], [-0.5], cfg)
  np.testing.assert_allclose(out.loss[0, 0], 10.0, rtol=1e-6)
  assert float(out.dual_clip.sum()) == 0.0


def _verl_reference(logp, logp_old, adv, el, eh, c):
  """verl's compute_policy_loss_vanilla per-token formula, in numpy."""
  ratio = np.exp(np.clip(logp - logp_old, -20, 20))
  l1 = -adv * ratio
  l2 = -adv * np.clip(ratio, 1 - el, 1 + eh)
  c1 = np.maximum(l1, l2)
  c2 = np.minimum(-adv * c, c1)
  return np.where(adv < 0, c2, c1)


def test_matches_verl_formula_random():
  rng = np.random.default_rng(0)
  logp = rng.normal(size=(8, 64)).astype(np.float32) * 2
  logp_old = rng.normal(size=(8, 64)).astype(np.float32) * 2
  adv = rng.normal(size=(8, 64)).astype(np.float32)
  out = L.ppo_clip_loss(logp, logp_old, adv, np.ones((8, 64)), CFG)
  want = _verl_reference(logp, logp_old, adv, 0.2, 0.28, 10.0)
  np.testing.assert_allclose(out.loss, want, rtol=1e-5, atol=1e-6)
  assert 0 < float(out.clip_high.sum()) and 0 < float(out.clip_low.sum()) and 0 < float(out.dual_clip.sum())


def test_mask_zeroes_every_output():
  out = _ppo([1.5, 0.5, 20.0], [1.0, -1.0, -1.0], mask=[0, 0, 0])
  for field in out:
    assert float(jnp.abs(field).sum()) == 0.0


def test_tis_weights():
  cfg = dataclasses.replace(CFG, tis_cap=2.0)
  logp = jnp.zeros((1, 3))
  logp_old = jnp.zeros((1, 3))
  logp_sampler = jnp.log(jnp.array([[1 / 3, 2.0, 1.0]]))  # weights exp(old - sampler) = 3 -> cap 2, 0.5, 1
  adv = jnp.ones((1, 3))
  loss, m = L.grpo_objective(cfg, logp=logp, logp_old=logp_old, advantages=adv, mask=jnp.ones((1, 3)),
                             logp_sampler=logp_sampler)
  np.testing.assert_allclose(loss, (-2.0 - 0.5 - 1.0) / 3, rtol=1e-6)
  np.testing.assert_allclose(m["pg_loss"], loss)
  # The registered policy loss itself is unweighted.
  np.testing.assert_allclose(L.ppo_clip_loss(logp, logp_old, adv, jnp.ones((1, 3)), cfg).loss[0], [-1.0] * 3)
  with pytest.raises(ValueError, match="logp_sampler"):
    L.grpo_objective(cfg, logp=logp, logp_old=logp_old, advantages=adv, mask=jnp.ones((1, 3)))


# ---------------------------------------------------------------- non-finite inputs

def test_ratio_clamp_keeps_loss_and_grad_finite():
  logp = jnp.array([[0.0, 0.0, 0.0, 0.0]])
  logp_old = jnp.array([[-jnp.inf, jnp.inf, -1e30, 1e30]])  # log ratio +inf, -inf, huge, -huge
  adv = jnp.array([[-1.0, 1.0, 1.0, -1.0]])
  cfg = dataclasses.replace(CFG, dual_clip_c=None)
  f = lambda lp: L.ppo_clip_loss(lp, logp_old, adv, jnp.ones((1, 4)), cfg).loss  # noqa: E731
  loss, grad = jax.jit(lambda lp: (f(lp), jax.grad(lambda x: f(x).sum())(lp)))(logp)
  assert bool(jnp.all(jnp.isfinite(loss)))
  np.testing.assert_allclose(loss[0, 0], math.exp(20.0), rtol=1e-5)  # clamped ratio, unclipped for A < 0
  np.testing.assert_allclose(loss[0, 2], -(1 + 0.28), rtol=1e-6)  # clip high
  assert bool(jnp.all(jnp.isfinite(grad)))


def test_garbage_at_masked_positions_does_not_leak():
  nan, inf = jnp.nan, jnp.inf
  logp = jnp.array([[-0.5, nan, -inf]])
  logp_old = jnp.array([[-0.5, inf, nan]])
  adv = jnp.array([[1.0, nan, inf]])
  mask = jnp.array([[1, 0, 0]])
  cfg = dataclasses.replace(CFG, kl_coeff=0.1, tis_cap=2.0, entropy_coeff=0.01)
  loss_fn = lambda lp: L.grpo_objective(  # noqa: E731
      cfg, logp=lp, logp_old=logp_old, advantages=adv, mask=mask, entropy=jnp.array([[1.0, nan, inf]]),
      logp_ref=jnp.array([[-0.5, nan, inf]]), logp_sampler=jnp.array([[-0.5, nan, -inf]]))
  (loss, metrics), grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(logp)
  assert bool(jnp.isfinite(loss)) and all(bool(jnp.isfinite(v)) for v in metrics.values()), metrics
  np.testing.assert_allclose(loss, -1.0 - 0.01 * 1.0, rtol=1e-6)  # pg (ratio 1, A 1) - coeff * entropy
  np.testing.assert_array_equal(grad[0, 1:], 0.0)
  np.testing.assert_allclose(grad[0, 0], -1.0, rtol=1e-6)


# ---------------------------------------------------------------- aggregation

X = jnp.array([[1.0, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
M = jnp.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])  # last row fully masked: not a sequence


@pytest.mark.parametrize("mode,want", [
    ("token-mean", 21 / 5),  # (1 + 2 + 5 + 6 + 7) / 5 tokens
    ("seq-mean-token-mean", (1.5 + 6.0) / 2),  # per-sequence means, over the 2 non-empty sequences
    ("seq-mean-token-sum", (3 + 18) / 2),
    ("seq-mean-token-sum-norm", (3 + 18) / 4),  # verl: sum over sequences / T (= 4)
])
def test_aggregation_modes(mode, want):
  np.testing.assert_allclose(L.aggregate(X, M, mode), want, rtol=1e-6)


def test_sum_norm_scale_factor_and_bad_mode():
  norm = L.agg_normaliser(M, loss_scale_factor=7.0)
  np.testing.assert_allclose(L.aggregate(X, M, "seq-mean-token-sum-norm", norm), 3.0)
  with pytest.raises(ValueError, match="loss_agg_mode"):
    L.aggregate(X, M, "token-sum")


def test_empty_mask_gives_zero_not_nan():
  for mode in L.AGG_MODES:
    assert float(L.aggregate(X, jnp.zeros_like(M), mode)) == 0.0


@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_micro_batch_partial_sums_are_exact(mode):
  # Dyadic values and a power-of-two token count: every partial sum is exact in float32, so equality is
  # bitwise, not approximate.
  rng = np.random.default_rng(1)
  b, t = 8, 16
  x = jnp.asarray(rng.integers(-64, 64, size=(b, t)) / 8.0, jnp.float32)
  lengths = np.array([16, 8, 4, 16, 0, 8, 2, 10])  # 64 tokens; one empty row
  mask = jnp.asarray(np.arange(t)[None] < lengths[:, None])
  norm = L.agg_normaliser(mask)
  full = L.aggregate(x, mask, mode, norm)
  parts = [L.aggregate(x[i:i + 2], mask[i:i + 2], mode, norm) for i in range(0, b, 2)]
  if mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
    assert float(sum(parts)) == float(full)
  np.testing.assert_allclose(sum(parts), full, rtol=1e-6)
  # Without the shared normaliser, a mean of micro-batch means is NOT the mini-batch token-mean.
  if mode == "token-mean":
    naive = np.mean([L.aggregate(x[i:i + 2], mask[i:i + 2], mode) for i in range(0, b, 2)])
    assert abs(naive - float(full)) > 1e-3


@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_grad_accumulation_in_scan_equals_full_batch(mode):
  """The update step's pattern: one normaliser per mini-batch, lax.scan over micro-batches, sum grads."""
  k, b, t, v = 4, 2, 6, 11
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(k * b, t, v)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, v, size=(k * b, t)))
  lengths = rng.integers(0, t + 1, size=(k * b,))
  mask = jnp.asarray(np.arange(t)[None] < lengths[:, None]).astype(jnp.float32)
  logp_old = jnp.asarray(rng.normal(size=(k * b, t)) * 0.3 - 2.0, jnp.float32)
  adv = jnp.asarray(rng.normal(size=(k * b, 1)), jnp.float32) * mask
  cfg = dataclasses.replace(CFG, loss_agg_mode=mode, entropy_coeff=0.01)
  norm = L.agg_normaliser(mask, cfg.loss_scale_factor)

  def loss_fn(lg, tk, lo, a, m):
    logp, ent = LP.token_logprobs_and_entropy(lg, tk)
    return L.grpo_objective(cfg, logp=logp, logp_old=lo, advantages=a, mask=m, norm=norm, entropy=ent)

  batch = (logits, tokens, logp_old, adv, mask)

  @jax.jit
  def full_and_accumulated(batch):
    full = jax.value_and_grad(loss_fn, has_aux=True)(*batch)

    def step(carry, micro):
      (loss, metrics), g = jax.value_and_grad(loss_fn, has_aux=True)(*micro)
      # Gradients are w.r.t. each micro-batch's own logits: emit them, sum loss and metrics.
      return jax.tree.map(jnp.add, carry, (loss, metrics)), g

    micro = jax.tree.map(lambda a: a.reshape(k, b, *a.shape[1:]), batch)
    zeros = jax.tree.map(jnp.zeros_like, full[0])
    return full, lax.scan(step, zeros, micro)

  ((full_loss, full_metrics), full_grad), ((loss, metrics), grads) = full_and_accumulated(batch)
  np.testing.assert_allclose(loss, full_loss, rtol=1e-5, atol=1e-7)
  for key in full_metrics:
    np.testing.assert_allclose(metrics[key], full_metrics[key], rtol=1e-5, atol=1e-7, err_msg=key)
  np.testing.assert_allclose(grads.reshape(full_grad.shape), full_grad, rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------- log-probs and entropy

def test_token_logprobs_hand_computed():
  logits = jnp.array([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # p = [1/4, 3/4], [1/2, 1/2]
  tokens = jnp.array([[1, 0]])
  np.testing.assert_allclose(jax.jit(LP.token_logprobs)(logits, tokens)[0], [math.log(0.75), math.log(0.5)],
                             rtol=1e-6)
  lp, ent = jax.jit(LP.token_logprobs_and_entropy)(logits.astype(jnp.bfloat16), tokens)
  assert lp.dtype == ent.dtype == jnp.float32
  np.testing.assert_allclose(ent[0, 1], math.log(2.0), rtol=1e-6)
  # temperature 2 on logits [0, 2 ln 3] is the same as logits [0, ln 3]
  lp_t = jax.jit(LP.token_logprobs, static_argnames="temperature")(
      jnp.array([[[0.0, 2 * math.log(3.0)]]]), jnp.array([[1]]), temperature=2.0)
  np.testing.assert_allclose(lp_t[0, 0], math.log(0.75), rtol=1e-6)


def test_entropy_known_distributions():
  ent = jax.jit(LP.entropy_from_logits)
  v = 7
  np.testing.assert_allclose(ent(jnp.full((3, v), 5.0)), math.log(v), rtol=1e-6)
  one_hot = jnp.array([0.0] + [-jnp.inf] * (v - 1))
  assert float(ent(one_hot)) == 0.0
  np.testing.assert_allclose(ent(jnp.array([1e4, 0.0, 0.0])), 0.0, atol=1e-30)
  p = jnp.array([0.5, 0.25, 0.25])
  np.testing.assert_allclose(ent(jnp.log(p)), 1.5 * math.log(2.0), rtol=1e-6)
  # Shift invariance at large logits (the input's own float32 rounding is ~1e-5 at 100).
  np.testing.assert_allclose(ent(jnp.log(p) + 100.0), 1.5 * math.log(2.0), rtol=1e-5)
  big = jnp.array([[1e30, -1e30, 0.0]], jnp.float32)  # no overflow in exp
  assert bool(jnp.isfinite(ent(big)).all())
  g = jax.jit(jax.grad(LP.entropy_from_logits))(one_hot)
  assert bool(jnp.all(jnp.isfinite(g)))


def test_chunked_and_fused_match_unchunked():
  rng = np.random.default_rng(3)
  b, t, d, v = 2, 8, 5, 13
  hidden = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, v, size=(b, t)))
  logits = jnp.einsum("BTD,DV->BTV", hidden, w)
  @jax.jit
  def all_variants(hidden, w, logits, tokens):
    out = [LP.token_logprobs_and_entropy(logits, tokens, temperature=0.7)]
    for c in (2, 4):
      out.append(LP.token_logprobs_and_entropy(logits, tokens, temperature=0.7, chunk_size=c))
      out.append(LP.token_logprobs_and_entropy_from_hidden(hidden, w, tokens, temperature=0.7, chunk_size=c))
    return out

  (lp, ent), *variants = all_variants(hidden, w, logits, tokens)
  for lp_v, ent_v in variants:
    np.testing.assert_allclose(lp_v, lp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ent_v, ent, rtol=1e-5, atol=1e-6)

  def f(h, ww, c):
    lp, ent = LP.token_logprobs_and_entropy_from_hidden(h, ww, tokens, chunk_size=c)
    return jnp.sum(lp * 0.3 + ent)

  grad = jax.jit(jax.grad(f, argnums=(0, 1)), static_argnums=2)
  g_full, g_chunk = grad(hidden, w, None), grad(hidden, w, 4)
  for a, e in zip(g_chunk, g_full):
    np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="chunk_size"):
    LP.token_logprobs_and_entropy(logits, tokens, chunk_size=3)


@pytest.mark.parametrize("temperature, chunk", [(1.0, None), (0.7, 4), (1.3, 2)])
def test_fused_lm_head_gradients_match_autodiff(temperature, chunk):
  """The fused LM head's hand-written backward pass against autodiff of the plain form (full logits), with
  cotangents on both log-probs and entropy, logits large enough (~30) that a shift-free form would cancel."""
  rng = np.random.default_rng(4)
  b, t, d, v = 2, 8, 6, 37
  hidden = jnp.asarray(rng.normal(size=(b, t, d)) * 3, jnp.float32)
  w = jnp.asarray(rng.normal(size=(d, v)) * 3, jnp.float32)
  tokens = jnp.asarray(rng.integers(0, v, size=(b, t)))
  c_lp, c_ent = (jnp.asarray(rng.normal(size=(b, t)), jnp.float32) for _ in range(2))

  def loss(fused):
    def f(h, ww):
      if fused:
        lp, ent = LP.token_logprobs_and_entropy_from_hidden(h, ww, tokens, temperature=temperature, chunk_size=chunk)
      else:
        lp, ent = LP.token_logprobs_and_entropy(jnp.einsum("BTD,DV->BTV", h, ww), tokens, temperature=temperature)
      return jnp.sum(lp * c_lp + ent * c_ent)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

  (value, grads), (value_ref, grads_ref) = loss(True)(hidden, w), loss(False)(hidden, w)
  np.testing.assert_allclose(value, value_ref, rtol=1e-5)
  for g, g_ref in zip(grads, grads_ref):
    np.testing.assert_allclose(g, g_ref, rtol=0, atol=1e-5 * float(jnp.abs(g_ref).max()))


# ---------------------------------------------------------------- KL estimators

def test_kl_estimators_known_values():
  logp = jnp.log(jnp.array([[0.5]]))
  ref = jnp.log(jnp.array([[0.25]]))
  ln2 = math.log(2.0)
  want = {"k1": ln2, "kl": ln2, "abs": ln2, "k2": 0.5 * ln2**2, "mse": 0.5 * ln2**2,
          "k3": 0.5 + ln2 - 1.0, "low_var_kl": 0.5 + ln2 - 1.0, "k3+": 0.5 + ln2 - 1.0, "k1+": ln2}
  for name, value in want.items():
    np.testing.assert_allclose(L.get_kl(name)(logp, ref)[0, 0], value, rtol=1e-6, err_msg=name)
  assert float(L.get_kl("abs")(ref, logp)[0, 0]) == pytest.approx(ln2)
  # k3 clamps: d = ref - logp clipped to +-20, then the estimate to +-10 (verl).
  assert float(L.kl_k3(jnp.array(0.0), jnp.array(-1000.0))) == 10.0
  assert float(L.kl_k3(jnp.array(0.0), jnp.array(0.0))) == 0.0
  # '+' variants: k2's gradient (logp - ref), the forward estimator's value.
  g = jax.grad(lambda lp: L.get_kl("k3+")(lp, ref).sum())(logp)
  np.testing.assert_allclose(g[0, 0], ln2, rtol=1e-6)
  with pytest.raises(ValueError, match="unknown KL"):
    L.get_kl("k4")


# ---------------------------------------------------------------- full objective and gradients

def test_upper_bound_is_reachable_only_below_one_over_one_plus_clip_high():
  """clip_high_reachable: tokens with A > 0 whose old probability is below 1 / (1 + clip_high) (0.78125 at 0.28),
  the only ones whose ratio can pass the upper bound; A <= 0 and masked tokens never count."""
  p_old = jnp.array([[0.5, 0.78, 0.79, 0.99, 0.1, 0.1]])
  adv = jnp.array([[1.0, 1.0, 1.0, 1.0, -1.0, 1.0]])
  mask = jnp.array([[1, 1, 1, 1, 1, 0]])
  _, m = L.grpo_objective(CFG, logp=jnp.log(p_old), logp_old=jnp.log(p_old), advantages=adv, mask=mask)
  assert float(m["clip_high_reachable"]) == pytest.approx(2 / 5)  # 0.5 and 0.78, of 5 trained tokens
  _, m = L.grpo_objective(dataclasses.replace(CFG, clip_high=0.2), logp=jnp.log(p_old), logp_old=jnp.log(p_old),
                          advantages=adv, mask=mask)
  assert float(m["clip_high_reachable"]) == pytest.approx(3 / 5)  # below 1 / 1.2 = 0.833: 0.79 too


def test_objective_metrics_hand_computed():
  logp = jnp.log(jnp.array([[1.5, 0.5, 1.0, 20.0]]))
  logp_old = jnp.zeros((1, 4))
  adv = jnp.array([[1.0, -1.0, 1.0, -1.0]])
  loss, m = L.grpo_objective(CFG, logp=logp, logp_old=logp_old, advantages=adv, mask=jnp.ones((1, 4)),
                             entropy=jnp.array([[1.0, 2.0, 3.0, 4.0]]))
  np.testing.assert_allclose(loss, (-1.28 + 0.8 - 1.0 + 10.0) / 4, rtol=1e-6)
  assert float(m["clip_frac_high"]) == float(m["clip_frac_low"]) == float(m["clip_frac_dual"]) == 0.25
  assert float(m["clip_frac"]) == 0.5
  assert float(m["clip_high_reachable"]) == 0.0  # both A > 0 tokens had old probability 1: no room to rise
  np.testing.assert_allclose(m["entropy"], 2.5)
  np.testing.assert_allclose(m["ppo_kl"], -float(jnp.mean(logp)), rtol=1e-6)
  r = np.array([1.5, 0.5, 1.0, 20.0])
  np.testing.assert_allclose(m["approx_kl"], np.mean(np.minimum(r - 1 - np.log(r), 10.0)), rtol=1e-6)
  with pytest.raises(ValueError, match="entropy_coeff"):
    L.grpo_objective(dataclasses.replace(CFG, entropy_coeff=0.1), logp=logp, logp_old=logp_old,
                     advantages=adv, mask=jnp.ones((1, 4)))
  with pytest.raises(ValueError, match="kl_coeff"):
    L.grpo_objective(dataclasses.replace(CFG, kl_coeff=0.1), logp=logp, logp_old=logp_old,
                     advantages=adv, mask=jnp.ones((1, 4)))


@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_masked_positions_get_exactly_zero_gradient(mode):
  """Tool-output tokens (mask 0) must not move the model: d loss / d logits is exactly 0 there."""
  rng = np.random.default_rng(4)
  b, t, v = 3, 7, 9
  logits = jnp.asarray(rng.normal(size=(b, t, v)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, v, size=(b, t)))
  mask = jnp.asarray(rng.integers(0, 2, size=(b, t)))
  mask = mask.at[:, 0].set(1)
  adv = jnp.asarray(rng.normal(size=(b, 1)), jnp.float32) * jnp.ones((b, t))  # nonzero even where masked
  logp_old = jnp.asarray(rng.normal(size=(b, t)) * 0.1 - 2.0, jnp.float32)
  cfg = L.LossConfig(loss_agg_mode=mode, entropy_coeff=0.01, kl_coeff=0.1, kl_type="k3", tis_cap=2.0)

  def loss_fn(lg):
    logp, ent = LP.token_logprobs_and_entropy(lg, tokens, chunk_size=7)
    return L.grpo_objective(cfg, logp=logp, logp_old=logp_old, advantages=adv, mask=mask, entropy=ent,
                            logp_ref=logp_old - 0.1, logp_sampler=logp_old + 0.2)[0]

  g = jax.jit(jax.grad(loss_fn))(logits)
  masked = np.asarray(mask) == 0
  assert masked.any()
  np.testing.assert_array_equal(np.asarray(g)[masked], 0.0)
  assert np.abs(np.asarray(g)[~masked]).sum(-1).min() > 0


# ---------------------------------------------------------------- config

@pytest.mark.parametrize("field,value", [
    ("clip_low", 1.0), ("clip_low", -0.1), ("clip_high", -0.1), ("clip_high", float("nan")),
    ("dual_clip_c", 1.0), ("loss_agg_mode", "token-sum"), ("policy_loss", "nope"), ("kl_type", "k9"),
    ("kl_coeff", -1.0), ("tis_cap", 0.0), ("loss_scale_factor", 0.0), ("entropy_coeff", "0.1"),
])
def test_config_validation_names_field(field, value):
  with pytest.raises(ValueError, match=f"LossConfig.{field}"):
    L.LossConfig(**{field: value})


def test_config_defaults_are_the_recipe_and_static():
  cfg = L.LossConfig()
  assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip_c) == (0.2, 0.28, 10.0)
  assert cfg.loss_agg_mode == "token-mean" and cfg.entropy_coeff == 0.0 and cfg.kl_coeff == 0.0
  assert not cfg.needs_reference and dataclasses.replace(cfg, kl_coeff=0.001).needs_reference
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.clip_low = 0.3
  hash(cfg)  # usable as a static jit argument
  with pytest.raises(ValueError, match="unknown policy loss"):
    L.get_loss("nope")
  assert L.get_loss("ppo_clip") is L.ppo_clip_loss
