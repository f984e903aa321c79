"""Off-policy correction (rl/offpolicy.py): hand-computed behaviour weights (AReaL's decoupled cap, token and
sequence TIS), verl's rejection rules and thresholds, packed rows, metrics and alarms, and the on-policy identity."""

import dataclasses
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.rl import losses as L
from agentrl_jax.rl import offpolicy as O


def _correct(cfg_kwargs, r, mask=None, segment_ids=None, behav=None):
  """offpolicy.correct with logp_prox = log r and logp_behav = 0 (or `behav`), so that pi_prox / pi_behav = r."""
  r = np.asarray(r, np.float64)
  r = r[None] if r.ndim == 1 else r
  prox = jnp.asarray(np.log(r), jnp.float32)
  behav = jnp.zeros_like(prox) if behav is None else jnp.asarray(behav, jnp.float32)
  mask = jnp.ones(prox.shape) if mask is None else jnp.asarray(mask)
  mask = mask[None] if mask.ndim == 1 else mask
  seg = None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
  cfg = None if cfg_kwargs is None else L.LossConfig(**cfg_kwargs).correction
  out = O.correct(cfg, logp_prox=prox, logp_behav=behav, mask=mask, segment_ids=seg)
  return (None if out.weight is None else np.asarray(out.weight), np.asarray(out.mask),
          {k: float(v) for k, v in out.metrics.items()})


# ---------------------------------------------------------------- behaviour weights (hand-computed)

R = [3.0, 0.5, 1.0, 6.0]  # pi_prox / pi_behav per token, one sequence


@pytest.mark.parametrize("kwargs,want,rejected", [
    (dict(tis_cap=2.0), [2.0, 0.5, 1.0, 2.0], 0.0),  # verl token TIS: min(r, 2)
    (dict(behav_imp_weight_cap=5.0), [3.0, 0.5, 1.0, 0.0], 0.25),  # AReaL token_mask: r > 5 -> 0
    (dict(behav_imp_weight_cap=5.0, tis_cap=2.0), [2.0, 0.5, 1.0, 0.0], 0.25),  # both: zero above 5, cap at 2
    (dict(behav_imp_weight_cap=math.inf), R, 0.0),  # AReaL without a cap: the raw ratio
    (dict(tis_cap=2.0, is_level="sequence"), [2.0] * 4, 0.0),  # verl sequence TIS: min(3 * 0.5 * 1 * 6 = 9, 2)
    (dict(behav_imp_weight_cap=10.0, is_level="sequence"), [9.0] * 4, 0.0),
    (dict(behav_imp_weight_cap=8.0, is_level="sequence"), [0.0] * 4, 1.0),  # the whole sequence dropped
])
def test_behaviour_weights(kwargs, want, rejected):
  w, mask, m = _correct(kwargs, R)
  np.testing.assert_allclose(w[0], want, rtol=1e-6)
  assert mask.all()  # weights never change the mask: zero-weighted tokens stay in the normaliser (AReaL)
  assert m["rejected_token_frac"] == pytest.approx(rejected)
  assert m["rejected_seq_frac"] == (1.0 if rejected else 0.0)


def test_metrics_hand_computed():
  _, _, m = _correct(dict(tis_cap=2.0), R)
  assert m["is_weight_mean"] == pytest.approx((3 + 0.5 + 1 + 6) / 4, rel=1e-6)  # raw weights, as verl reports
  assert m["is_weight_max"] == pytest.approx(6.0, rel=1e-6)
  c = np.clip(R, 0.5, 2.0)  # clamped to [1 / cap, cap] for the ESS, as verl does
  assert m["is_ess"] == pytest.approx(c.sum() ** 2 / (4 * (c ** 2).sum()), rel=1e-6)  # 30.25 / 37
  assert m["is_weight_frac_high"] == 0.5
  logr = np.log(R)
  assert m["behav_kl_k1"] == pytest.approx(-logr.mean(), rel=1e-6)  # E[log pi_behav - log pi_prox]
  assert m["behav_kl_k3"] == pytest.approx(np.mean(np.asarray(R) - 1 - logr), rel=1e-6)
  assert m["behav_ppl_ratio"] == pytest.approx(9 ** -0.25, rel=1e-6)  # exp(mean(log behav - log prox))
  assert (m["is_tokens"], m["is_weight_sum"]) == (4.0, pytest.approx(10.5))
  assert m["is_clamped_sum"] == pytest.approx(5.5) and m["is_clamped_sq_sum"] == pytest.approx(9.25)
  # Without a cap the ESS clamps at verl's default threshold 2; uniform weights give ESS 1.
  _, _, m = _correct(None, [1.5, 1.5, 1.5])
  assert m["is_ess"] == pytest.approx(1.0) and m["is_weight_frac_high"] == 0.0
  _, _, m = _correct(dict(behav_imp_weight_cap=5.0), R)
  c = np.clip(R, 0.2, 5.0)
  assert m["is_ess"] == pytest.approx(c.sum() ** 2 / (4 * (c ** 2).sum()), rel=1e-6)


def test_sequence_metrics_and_empty_rows():
  # Two rows (sequences), the second with no trained token: it counts nowhere.
  r = [[2.0, 0.5, 4.0], [9.0, 9.0, 9.0]]
  mask = [[1, 1, 1], [0, 0, 0]]
  _, _, m = _correct(dict(rejection="seq_sum_k1"), r, mask=mask)  # verl's 0.5_2.0: product 4 -> rejected
  assert m["is_weight_mean"] == pytest.approx(6.5 / 3) and m["is_weight_max"] == pytest.approx(4.0)
  assert m["rejected_token_frac"] == 1.0 and m["rejected_seq_frac"] == 1.0
  assert m["behav_ppl_ratio"] == pytest.approx(math.exp(-math.log(4.0) / 3), rel=1e-6)
  _, _, m = _correct(None, r, mask=np.zeros((2, 3)))
  assert all(v == 0.0 for v in m.values()), m  # nothing trained: zeros, never NaN


# ---------------------------------------------------------------- rejection rules (verl's options and thresholds)

@pytest.mark.parametrize("rejection,threshold,r,keep", [
    # geometric-mean rejection (verl decoupled_geo_rs): mean of k1 = -log r within [log 0.999, log 1.001]
    ("seq_mean_k1", None, [1.0005, 1.0005], True),
    ("seq_mean_k1", None, [1.003, 1.0], False),  # geometric mean 1.0015
    ("seq_mean_k1", None, [0.9985, 1.0], True),  # 0.99925
    ("seq_mean_k1", None, [0.997, 1.0], False),  # 0.9985
    # K3 rejection (verl decoupled_k3_rs): mean of r - 1 - log r <= 0.01; k3(1.2) = 0.0177
    ("seq_mean_k3", None, [1.2, 1.0], True),
    ("seq_mean_k3", None, [1.2, 1.2], False),
    # sequence MIS (verl decoupled_seq_is_rs): sum of k1 within [log 0.5, log 2], i.e. the product in [0.5, 2]
    ("seq_sum_k1", None, [1.5, 1.2], True),
    ("seq_sum_k1", None, [1.5, 1.5], False),
    ("seq_sum_k1", None, [0.6, 0.8], False),
    ("seq_max_k3", 0.01, [1.0, 1.0, 1.2], False),  # one token's k3 over the bound drops the sequence
    ("seq_sum_k3", 0.02, [1.1, 1.1], True),  # 2 * 0.00469
    ("seq_mean_k2", 0.01, [1.2, 1.0], True),  # mean of (log r)^2 / 2 = 0.0083
])
def test_sequence_rejection_hand_computed(rejection, threshold, r, keep):
  w, mask, m = _correct(dict(rejection=rejection, rejection_threshold=threshold), r)
  assert w is None  # rejection alone weights nothing (verl's decoupled_*_rs presets: rollout_is=None)
  assert mask.all() == keep and mask.any() == keep
  assert m["rejected_seq_frac"] == (0.0 if keep else 1.0)


def test_token_rejection_and_k1_sign_convention():
  # verl's k1 statistic is -log r and its bounds are "lower_upper" on exp(k1) = 1 / r: "0.8_2.0" keeps
  # 0.8 <= 1 / r <= 2, i.e. 0.5 <= r <= 1.25.
  r = [0.4, 0.6, 1.0, 1.2, 1.3, 3.0]
  _, mask, m = _correct(dict(rejection="token_k1", rejection_threshold="0.8_2.0"), r)
  np.testing.assert_array_equal(mask[0], [False, True, True, True, False, False])
  assert m["rejected_token_frac"] == pytest.approx(0.5) and m["rejected_seq_frac"] == 1.0
  _, mask, _ = _correct(dict(rejection="token_k1", rejection_threshold=2.0), r)  # one number u: [1/u, u]
  np.testing.assert_array_equal(mask[0], [False, True, True, True, True, False])
  _, mask, _ = _correct(dict(rejection="token_k2", rejection_threshold=0.02), [1.2, 1.25, 0.8])  # 0.0166, 0.0249
  np.testing.assert_array_equal(mask[0], [True, False, False])
  _, mask, _ = _correct(dict(rejection="token_k3", rejection_threshold=0.01), [1.1, 1.2, 0.9])  # 0.0047, 0.0177
  np.testing.assert_array_equal(mask[0], [True, False, True])


def test_rules_compose_and_weights_respect_rejection():
  # Two options: both must pass. Token TIS weights are zeroed on rejected tokens.
  r = [1.2, 1.0, 3.0]
  w, mask, m = _correct(dict(rejection="token_k1,seq_max_k3", rejection_threshold="2.5,1.0", tis_cap=2.0), r)
  np.testing.assert_array_equal(mask[0], [True, True, False])  # 3 > 2.5; max k3 = 0.90 <= 1
  np.testing.assert_allclose(w[0], [1.2, 1.0, 0.0], rtol=1e-6)
  assert m["rejected_token_frac"] == pytest.approx(1 / 3)


def test_nan_on_a_trained_token_is_not_rejected():
  r = np.array([[1.0, np.nan, 1.0]])
  w, mask, _ = _correct(dict(rejection="seq_mean_k3,token_k1", rejection_threshold="0.01,2.0",
                             behav_imp_weight_cap=5.0, tis_cap=2.0), r)
  assert mask.all() and np.isnan(w[0, 1])  # the loss becomes NaN and the update skips the step


@pytest.mark.parametrize("name", ["decoupled_k3_rs", "decoupled_geo_rs", "decoupled_token_is", "areal_decoupled"])
def test_a_nan_behaviour_logprob_makes_the_loss_nan_in_every_correction(name):
  """Rejection-only presets never read the weight: `nan_free` (not a NaN weight) must carry the NaN to the loss,
  or the step would train, silently, on the sampler's garbage."""
  cfg = L.LossConfig(**O.preset(name))
  prox = jnp.full((2, 4), -0.7)
  behav = prox.at[1, 2].set(jnp.nan)
  mask = jnp.ones((2, 4))
  corr = O.correct(cfg.correction, logp_prox=prox, logp_behav=behav, mask=mask)
  assert not bool(corr.nan_free)
  assert bool(O.correct(cfg.correction, logp_prox=prox, logp_behav=prox, mask=mask).nan_free)
  untrained = O.correct(cfg.correction, logp_prox=prox, logp_behav=behav, mask=mask.at[1, 2].set(0))
  assert bool(untrained.nan_free)  # garbage off the trained tokens is not a NaN of the batch
  loss, _ = L.grpo_objective(cfg, logp=prox, logp_old=prox, advantages=jnp.ones((2, 4)), mask=mask,
                             logp_sampler=behav)
  assert np.isnan(float(loss))
  loss, _ = L.grpo_objective(cfg, logp=prox, logp_old=prox, advantages=jnp.ones((2, 4)), mask=mask,
                             logp_sampler=prox)
  assert np.isfinite(float(loss))


def test_garbage_at_untrained_positions_does_not_leak():
  prox = jnp.array([[-1.0, jnp.nan, -jnp.inf, -1.0]])
  behav = jnp.array([[-1.0, jnp.inf, jnp.nan, -1.1]])
  mask = jnp.array([[1, 0, 0, 1]])
  cfg = L.LossConfig(**O.preset("decoupled_k3_rs_seq_tis")).correction
  out = O.correct(cfg, logp_prox=prox, logp_behav=behav, mask=mask)
  assert all(np.isfinite(float(v)) for v in out.metrics.values()), out.metrics
  np.testing.assert_array_equal(np.asarray(out.weight)[0, 1:3], 0.0)
  np.testing.assert_allclose(np.asarray(out.weight)[0, [0, 3]], math.exp(0.1), rtol=1e-6)  # sequence weight


# ---------------------------------------------------------------- verl's formulas, transcribed, on random data

def _verl_rejection(log_ratio, mask, option, lower, upper):
  """verl compute_rollout_rejection_mask (one option, 2D padded rows) in numpy: the kept-token mask."""
  lr = np.clip(log_ratio, -20, 20)
  stat = {"k1": -lr, "k2": 0.5 * lr ** 2, "k3": np.exp(lr) - 1 - lr}[option.rsplit("_", 1)[1]]
  if option.startswith("seq_sum"):
    stat = np.broadcast_to((stat * mask).sum(-1, keepdims=True), lr.shape)
  elif option.startswith("seq_mean"):
    stat = np.broadcast_to((stat * mask).sum(-1, keepdims=True) / (mask.sum(-1, keepdims=True) + 1e-8), lr.shape)
  elif option.startswith("seq_max"):
    mx = np.where(mask > 0, stat, -np.inf).max(-1, keepdims=True)
    stat = np.broadcast_to(np.where(mx == -np.inf, 0.0, mx), lr.shape)
  keep = stat <= upper
  if lower is not None:
    keep &= stat >= lower
  return mask * keep


def _verl_is_weights(log_ratio, mask, level, threshold):
  """verl compute_rollout_correction_weights (truncated) and its rollout_is_mean / _max / ESS, in numpy."""
  if level == "token":
    w = np.exp(np.clip(log_ratio, -20, 20))
  else:
    w = np.broadcast_to(np.exp(np.clip((log_ratio * mask).sum(-1, keepdims=True), -20, 20)), log_ratio.shape)
  w = w * mask
  mean = (w * mask).sum() / (mask.sum() + 1e-8)
  c = np.clip(w, 1 / threshold, threshold)
  c_norm = c / ((c * mask).sum() / (mask.sum() + 1e-8) + 1e-8)
  ess = 1.0 / ((c_norm ** 2 * mask).sum() / (mask.sum() + 1e-8))
  return np.minimum(w, threshold), {"is_weight_mean": mean, "is_weight_max": w[mask > 0].max(), "is_ess": ess}


@pytest.mark.parametrize("option", O.REJECTIONS)
def test_rejection_matches_verl_formula(option):
  rng = np.random.default_rng(zlib.crc32(option.encode()))  # str hash() changes per process (PYTHONHASHSEED)
  b, t = 16, 12
  log_ratio = rng.normal(size=(b, t)) * rng.uniform(0.01, 0.4, size=(b, 1))  # some rows close, some far
  mask = (rng.random((b, t)) < 0.8).astype(np.float64)
  spec = {"k1": "0.7_1.3", "k2": 0.02, "k3": 0.02}[option.rsplit("_", 1)[1]]
  if option == "seq_mean_k1":  # a mean of 12 log-ratios is small: a tighter band
    spec = "0.95_1.05"
  if option.startswith("seq_sum"):
    spec = {"k1": "0.4_2.5", "k2": 0.1, "k3": 0.1}[option.rsplit("_", 1)[1]]
  (rule,) = O.parse_rejection(option, spec)
  want = _verl_rejection(log_ratio, mask, option, rule.lower, rule.upper)
  _, got, _ = _correct(dict(rejection=option, rejection_threshold=spec), np.exp(log_ratio), mask=mask)
  np.testing.assert_array_equal(got, want > 0)
  assert 0 < want.sum() < mask.sum(), "the case should reject some tokens and keep others"


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_is_weights_and_metrics_match_verl_formula(level):
  rng = np.random.default_rng(5)
  log_ratio = rng.normal(size=(8, 10)) * 0.3
  mask = (rng.random((8, 10)) < 0.7).astype(np.float64)
  want_w, want_m = _verl_is_weights(log_ratio, mask, level, 2.0)
  w, _, m = _correct(dict(tis_cap=2.0, is_level=level), np.exp(log_ratio), mask=mask)
  np.testing.assert_allclose(w, want_w * mask, rtol=2e-6)
  for k, v in want_m.items():
    assert m[k] == pytest.approx(v, rel=2e-5), k


# ---------------------------------------------------------------- packed rows

def _pack(rows, mask_rows, lengths, t):
  """Lays the sequences (each `lengths[i]` tokens of rows[i]) out back to back in one row of t tokens."""
  x, mk, seg = np.ones(t), np.zeros(t), np.zeros(t, np.int32)
  start = 0
  for i, n in enumerate(lengths):
    x[start:start + n] = rows[i][:n]
    mk[start:start + n] = mask_rows[i][:n]
    seg[start:start + n] = i + 1
    start += n
  return x, mk, seg


@pytest.mark.parametrize("kwargs", [
    dict(tis_cap=2.0, is_level="sequence"),
    dict(behav_imp_weight_cap=3.0, is_level="sequence"),
    dict(rejection="seq_sum_k1"),
    dict(rejection="seq_mean_k1", rejection_threshold="0.9_1.1"),
    dict(rejection="seq_mean_k3", rejection_threshold=0.02),
    dict(rejection="seq_max_k2", rejection_threshold=0.05),
    dict(rejection="token_k1,seq_sum_k3", rejection_threshold="0.5_2.0,0.1", tis_cap=2.0),
])
def test_packed_rows_equal_one_sequence_per_row(kwargs):
  """Sequence-level weights and rules on packed rows (segment_ids) equal those of the same sequences laid out one
  per row: sums, means and maxima stay within a segment; padding (segment 0) is never a sequence."""
  rng = np.random.default_rng(3)
  lengths = [[5, 3, 4], [6, 2], [7]]  # sequences per packed row
  t = 14
  rows = [[np.exp(rng.normal(size=n) * 0.25) for n in ls] for ls in lengths]
  masks = [[np.r_[0.0, (rng.random(n - 1) < 0.85)] for n in ls] for ls in lengths]  # first token untrained
  packed = [_pack(r, mk, ls, t) for r, mk, ls in zip(rows, masks, lengths)]
  r_p, m_p, s_p = (np.stack(a) for a in zip(*packed))
  flat_r = [x for rs in rows for x in rs]
  flat_m = [x for ms in masks for x in ms]
  r_u = np.ones((len(flat_r), t))
  m_u = np.zeros((len(flat_r), t))
  for i, (x, mk) in enumerate(zip(flat_r, flat_m)):
    r_u[i, :len(x)], m_u[i, :len(x)] = x, mk
  w_p, keep_p, met_p = _correct(kwargs, r_p, mask=m_p, segment_ids=s_p)
  w_u, keep_u, met_u = _correct(kwargs, r_u, mask=m_u)
  unpack = lambda a: np.concatenate([a[i][s_p[i] == j + 1] for i, ls in enumerate(lengths)  # noqa: E731
                                     for j in range(len(ls))])
  unrow = lambda a: np.concatenate([a[i, :len(x)] for i, x in enumerate(flat_r)])  # noqa: E731
  np.testing.assert_array_equal(unpack(keep_p), unrow(keep_u))
  if w_p is not None:
    np.testing.assert_allclose(unpack(w_p), unrow(w_u), rtol=1e-6)
  for k in met_u:
    assert met_p[k] == pytest.approx(met_u[k], rel=1e-5, abs=1e-7), k
  assert 0 < met_u["rejected_seq_frac"] < 1 or w_p is not None, "the case should reject some sequences"


def test_packed_sequence_weight_hand_computed():
  # One row, two episodes and padding: segment 1 = [x, 2, 1.5] (product 3), segment 2 = [x, 0.5] (0.5).
  r = [[7.0, 2.0, 1.5, 7.0, 0.5, 7.0]]
  mask = [[0, 1, 1, 0, 1, 0]]
  seg = [[1, 1, 1, 2, 2, 0]]
  w, _, m = _correct(dict(tis_cap=2.0, is_level="sequence"), r, mask=mask, segment_ids=seg)
  np.testing.assert_allclose(w[0], [0, 2.0, 2.0, 0, 0.5, 0], rtol=1e-6)
  assert m["is_weight_mean"] == pytest.approx((3 + 3 + 0.5) / 3, rel=1e-6)
  assert m["behav_ppl_ratio"] == pytest.approx((3 ** -0.5 + 2.0) / 2, rel=1e-6)  # per-episode, then mean
  _, keep, m = _correct(dict(rejection="seq_sum_k1"), r, mask=mask, segment_ids=seg)  # product in [0.5, 2]?
  np.testing.assert_array_equal(keep[0], [0, 0, 0, 0, 1, 0])
  assert m["rejected_seq_frac"] == 0.5 and m["rejected_token_frac"] == pytest.approx(2 / 3)


# ---------------------------------------------------------------- the loss: composition, defaults, on-policy identity

def _loss_and_grad(cfg, logp, logp_old, adv, mask, **kw):
  f = lambda lp: L.grpo_objective(cfg, logp=lp, logp_old=logp_old, advantages=adv, mask=mask, **kw)  # noqa: E731
  return jax.jit(jax.value_and_grad(f, has_aux=True))(logp)


def _random_case(seed=0, b=4, t=16):
  rng = np.random.default_rng(seed)
  logp_old = jnp.asarray(rng.normal(size=(b, t)) * 0.5 - 2.0, jnp.float32)
  logp = logp_old + jnp.asarray(rng.normal(size=(b, t)) * 0.2, jnp.float32)
  adv = jnp.asarray(np.repeat(rng.normal(size=(b, 1)), t, 1), jnp.float32)
  mask = jnp.asarray(rng.random((b, t)) < 0.8, jnp.float32)
  return logp, logp_old, adv, mask


def test_decoupled_loss_hand_computed():
  """AReaL's decoupled objective: PPO clip on pi_theta / pi_prox times the behaviour weight pi_prox / pi_behav,
  zeroed above the cap; the zeroed token stays in the token-mean's denominator."""
  logp_old = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))  # pi_prox
  logp = jnp.log(jnp.array([[0.55, 0.8, 0.5]]))  # ratios 1.1, 1.6 (clipped at 1.28 for A > 0), 1.0
  logp_sampler = jnp.log(jnp.array([[0.25, 0.5, 0.05]]))  # behaviour weights 2, 1, 10 (> cap 5: zeroed)
  adv = jnp.ones((1, 3))
  cfg = L.LossConfig(**O.preset("areal_decoupled"))
  (loss, m), g = _loss_and_grad(cfg, logp, logp_old, adv, jnp.ones((1, 3)), logp_sampler=logp_sampler)
  np.testing.assert_allclose(loss, -(1.1 * 2 + 1.28 * 1 + 1.0 * 0) / 3, rtol=1e-6)
  np.testing.assert_allclose(g[0], [-1.1 * 2 / 3, 0.0, 0.0], rtol=1e-6)  # d/dlogp of -A r w / N
  assert m["rejected_token_frac"] == pytest.approx(1 / 3) and m["is_weight_max"] == pytest.approx(10.0)
  # Token TIS on top (decoupled + TIS): the weight 2 is truncated at 1.5.
  cfg = dataclasses.replace(cfg, tis_cap=1.5)
  (loss, _), _ = _loss_and_grad(cfg, logp, logp_old, adv, jnp.ones((1, 3)), logp_sampler=logp_sampler)
  np.testing.assert_allclose(loss, -(1.1 * 1.5 + 1.28) / 3, rtol=1e-6)


def test_rejection_removes_tokens_from_the_normaliser():
  """verl: rejection rewrites the response mask, so rejected tokens leave the token-mean's denominator."""
  logp_old = jnp.zeros((2, 2))
  logp = jnp.log(jnp.full((2, 2), 1.1))
  logp_sampler = jnp.log(jnp.array([[1.0, 1.0], [0.5, 0.5]]))  # row 1: geometric mean r = 2: rejected
  cfg = L.LossConfig(**O.preset("decoupled_geo_rs"))
  (loss, m), _ = _loss_and_grad(cfg, logp, logp_old, jnp.ones((2, 2)), jnp.ones((2, 2)), logp_sampler=logp_sampler)
  np.testing.assert_allclose(loss, -1.1, rtol=1e-6)  # the mean over row 0's 2 tokens, not over 4
  assert m["rejected_seq_frac"] == 0.5 and m["rejected_token_frac"] == 0.5


def test_defaults_ignore_sampler_logp_bitwise():
  """At the defaults (on-policy recipe) the sampler's log-probs only feed metrics: loss and gradient are bitwise
  those without them."""
  logp, logp_old, adv, mask = _random_case()
  sampler = logp_old + 0.3
  (l0, m0), g0 = _loss_and_grad(L.LossConfig(), logp, logp_old, adv, mask)
  (l1, m1), g1 = _loss_and_grad(L.LossConfig(), logp, logp_old, adv, mask, logp_sampler=sampler)
  assert L.LossConfig().correction is None and not L.LossConfig().needs_proximal_logp
  assert np.asarray(l0).tobytes() == np.asarray(l1).tobytes()
  assert np.asarray(g0).tobytes() == np.asarray(g1).tobytes()
  assert {k: float(v) for k, v in m0.items()} == {k: float(m1[k]) for k in m0}
  # Explicitly default-valued new fields are the same static config (one compile, same program).
  fields = dict(is_level="token", behav_imp_weight_cap=None, rejection=None, rejection_threshold=None, tis_cap=None)
  assert L.LossConfig(**fields) == L.LossConfig() and hash(L.LossConfig(**fields)) == hash(L.LossConfig())


@pytest.mark.parametrize("name", sorted(O.PRESETS))
def test_every_correction_is_the_identity_on_policy(name):
  """Sampler and trainer agree (pi_behav = pi_prox): every preset leaves loss and gradient bitwise unchanged."""
  logp, logp_old, adv, mask = _random_case(1)
  cfg = L.LossConfig(**O.preset(name))
  (l0, _), g0 = _loss_and_grad(L.LossConfig(), logp, logp_old, adv, mask)
  (l1, m1), g1 = _loss_and_grad(cfg, logp, logp_old, adv, mask, logp_sampler=logp_old)
  assert np.asarray(l0).tobytes() == np.asarray(l1).tobytes(), name
  assert np.asarray(g0).tobytes() == np.asarray(g1).tobytes(), name
  if name != "disabled":
    assert float(m1["rejected_token_frac"]) == 0.0 and float(m1["is_ess"]) == 1.0


def test_precomputed_weights_on_micro_batches_add_up():
  """The update's pattern: correct() on the whole mini-batch, then micro-batches with the shared norm and the
  precomputed weight and mask: loss, metrics and gradient sum to the whole-batch values (jit, lax.scan)."""
  k, b, t = 4, 2, 12
  logp, logp_old, adv, mask = _random_case(2, b=k * b, t=t)
  rng = np.random.default_rng(9)
  shift = rng.normal(size=(k * b, t)) * 0.1 + rng.normal(size=(k * b, 1)) * 0.15
  shift[0, 3] = -1.5  # one token the sampler found much less likely: weight e^1.5 > the cap 3
  sampler = logp_old + jnp.asarray(shift, jnp.float32)
  cfg = L.LossConfig(tis_cap=2.0, behav_imp_weight_cap=3.0, rejection="seq_mean_k3", rejection_threshold=0.01,
                     loss_agg_mode="seq-mean-token-mean")

  @jax.jit
  def run(logp):
    (full_loss, full_m), full_g = jax.value_and_grad(
        lambda lp: L.grpo_objective(cfg, logp=lp, logp_old=logp_old, advantages=adv, mask=mask,
                                    logp_sampler=sampler), has_aux=True)(logp)
    corr = O.correct(cfg.correction, logp_prox=logp_old, logp_behav=sampler, mask=mask)
    norm = L.agg_normaliser(corr.mask, cfg.loss_scale_factor)

    def step(carry, micro):
      lp, lo, a, m, w = micro
      (loss, met), g = jax.value_and_grad(
          lambda x: L.grpo_objective(cfg, logp=x, logp_old=lo, advantages=a, mask=m, norm=norm, is_weight=w),
          has_aux=True)(lp)
      return jax.tree.map(jnp.add, carry, (loss, met)), g

    micro = jax.tree.map(lambda a: a.reshape(k, b, t), (logp, logp_old, adv, corr.mask, corr.weight))
    zeros = jax.tree.map(jnp.zeros_like, (full_loss, {kk: v for kk, v in full_m.items() if kk not in corr.metrics}))
    (loss, met), g = jax.lax.scan(step, zeros, micro)
    return full_loss, full_m, full_g, loss, met, g.reshape(k * b, t), corr.metrics

  full_loss, full_m, full_g, loss, met, g, corr_m = run(logp)
  assert 0 < float(corr_m["rejected_seq_frac"]) < 1 and float(corr_m["is_weight_max"]) > 3.0
  np.testing.assert_allclose(loss, full_loss, rtol=1e-5, atol=1e-7)
  for key, v in met.items():
    np.testing.assert_allclose(v, full_m[key], rtol=1e-5, atol=1e-7, err_msg=key)
  for key, v in corr_m.items():
    assert float(full_m[key]) == float(v), key
  np.testing.assert_allclose(g, full_g, rtol=1e-5, atol=1e-8)
  with pytest.raises(ValueError, match="is_weight"):
    L.grpo_objective(cfg, logp=logp, logp_old=logp_old, advantages=adv, mask=mask, logp_sampler=sampler,
                     norm=L.agg_normaliser(mask))
  # Rejection alone weights nothing: micro-batches pass only the rejected mask (and no is_weight).
  rs = L.LossConfig(**O.preset("decoupled_k3_rs"))
  corr = O.correct(rs.correction, logp_prox=logp_old, logp_behav=sampler, mask=mask)
  assert corr.weight is None and not corr.mask.all()
  norm = L.agg_normaliser(corr.mask)
  micro = [L.grpo_objective(rs, logp=logp[i:i + b], logp_old=logp_old[i:i + b], advantages=adv[i:i + b],
                            mask=corr.mask[i:i + b], norm=norm)[0] for i in range(0, k * b, b)]
  whole = L.grpo_objective(rs, logp=logp, logp_old=logp_old, advantages=adv, mask=mask, logp_sampler=sampler)[0]
  np.testing.assert_allclose(sum(micro), whole, rtol=1e-5)


# ---------------------------------------------------------------- config, presets, host-side metrics and alarms

@pytest.mark.parametrize("field,value", [
    ("is_level", "segment"), ("behav_imp_weight_cap", 1.0), ("behav_imp_weight_cap", float("nan")),
    ("rejection", "seq_mean_k4"), ("rejection", "token_k3"), ("rejection_threshold", "0.5_x"),
    ("rejection_threshold", -1.0), ("rejection_threshold", "2_0.5"), ("rejection_threshold", "0.1,0.2,0.3"),
])
def test_config_validation_names_field(field, value):
  kw = {field: value}
  if field == "rejection_threshold":
    kw["rejection"] = "seq_mean_k1"
  with pytest.raises(ValueError, match=f"LossConfig.{field}"):
    L.LossConfig(**kw)


def test_a_k3_threshold_with_an_underscore_is_an_error_not_a_number():
  # float("1_2") is 12: a k1-style spec shared with a k3 option must not become a k3 bound of 0.52 (verl raises).
  with pytest.raises(ValueError, match="'0.5_2' for 'seq_mean_k3'"):
    O.parse_rejection("seq_mean_k1,seq_mean_k3", "0.5_2")
  with pytest.raises(ValueError, match="'1_2' for 'token_k2'"):
    O.parse_rejection("token_k2", "1_2")
  assert O.parse_rejection("seq_mean_k1", "0.5_2")[0].upper == pytest.approx(math.log(2.0))


def test_every_preset_applies_to_the_run_config():
  """`config.rl.loss.update(preset(name))`, as offpolicy.preset documents, for every preset: the config's typed
  fields take its values, and the trainer's LossConfig from them equals the preset's."""
  from agentrl_jax.rl import recipe
  for name in O.PRESETS:
    config = recipe.rl_config()
    config.rl.loss.update(O.preset(name))
    assert L.LossConfig(**config.rl.loss).correction == L.LossConfig(**O.preset(name)).correction, name


def test_config_validation_threshold_without_rejection():
  with pytest.raises(ValueError, match="LossConfig.rejection_threshold"):
    L.LossConfig(rejection_threshold=0.01)


def test_presets_are_verls_and_areals():
  assert O.preset("decoupled_token_is") == dict(is_level="token", tis_cap=2.0, behav_imp_weight_cap=None,
                                                rejection=None, rejection_threshold=None)
  cfg = L.LossConfig(**O.preset("decoupled_geo_rs"))
  (rule,) = cfg.correction.rules
  assert rule == O.RejectionRule("seq_mean_k1", math.log(0.999), math.log(1.001))
  assert L.LossConfig(**O.preset("decoupled_k3_rs")).correction.rules == (O.RejectionRule("seq_mean_k3", None, 0.01),)
  seq_mis = L.LossConfig(**O.preset("decoupled_seq_is_rs")).correction
  assert seq_mis.is_level == "sequence" and seq_mis.tis_cap == 2.0
  assert seq_mis.rules == (O.RejectionRule("seq_sum_k1", math.log(0.5), math.log(2.0)),)
  assert L.LossConfig(**O.preset("areal_decoupled")).behav_imp_weight_cap == 5.0
  for name in O.PRESETS:
    cfg = L.LossConfig(**O.preset(name))
    assert cfg.needs_proximal_logp == (name != "disabled")
  # A threshold left None takes verl's preset default for the option.
  assert L.LossConfig(rejection="seq_mean_k3").correction.rules == (O.RejectionRule("seq_mean_k3", None, 0.01),)
  with pytest.raises(ValueError, match="unknown off-policy preset"):
    O.preset("tis")


def test_reduce_update_metrics_and_alarms():
  rng = np.random.default_rng(4)
  r = np.exp(rng.normal(size=(8, 6)) * 0.8)
  mask = rng.random((8, 6)) < 0.9
  whole = _correct(dict(tis_cap=2.0), r, mask=mask)[2]
  parts = [_correct(dict(tis_cap=2.0), r[i:i + 2], mask=mask[i:i + 2])[2] for i in range(0, 8, 2)]
  out = O.reduce_update_metrics(parts)
  for k in ("is_weight_mean", "is_ess", "is_weight_max"):
    assert out[k] == pytest.approx(whole[k], rel=1e-5), k
  assert out["is_ess"] != pytest.approx(np.mean([p["is_ess"] for p in parts]), rel=1e-4)  # averaging is wrong
  assert "is_weight_sum" not in out and out["is_tokens"] == pytest.approx(whole["is_tokens"] / 4)
  assert out["behav_kl_k1"] == pytest.approx(np.mean([p["behav_kl_k1"] for p in parts]))
  assert O.reduce_update_metrics([]) == {}

  assert O.offpolicy_alarms({"train/is_weight_mean": 1.1, "train/is_ess": 0.9}) == []
  alarms = O.offpolicy_alarms({"train/is_weight_mean": 2.5, "train/is_ess": 0.2, "train/is_tokens": 10})
  assert len(alarms) == 2 and "2.5" in alarms[0] and "[0.5, 2]" in alarms[0] and "0.2" in alarms[1]
  assert len(O.offpolicy_alarms({"is_weight_mean": 0.4})) == 1
  assert O.offpolicy_alarms({"is_weight_mean": 0.0, "is_ess": 0.0, "is_tokens": 0.0}) == []  # nothing trained
  assert O.offpolicy_alarms({"loss": 1.0}) == []
