"""Off-policy correction between the behaviour policy (the sampler) and the trainer: importance weights, rejection
masks and their diagnostics (pure functions), plus the host-side reduction of their metrics and verl's alarms.

Three policies take part when rollouts are stale or the sampler's numerics differ from the trainer's:
  pi_behav  drew the tokens: the sampler's log-probs, batch key "sampler_logp";
  pi_prox   the trainer's recomputation before the update (AReaL's proximal policy), batch key "old_logp";
  pi_theta  the policy being trained.
The PPO ratio stays pi_theta / pi_prox (`losses.ppo_clip_loss`); what this module adds depends on
r = pi_prox / pi_behav only, so it is computed once per mini-batch, before micro-batching, as verl's
rollout_corr_helper.py does before its update:
  - a behaviour weight per token that multiplies the policy loss (no gradient): r itself per token
    (level "token") or the product of r over the token's sequence (level "sequence"; verl's sequence IS),
    zeroed where it exceeds `behav_imp_weight_cap` (AReaL's decoupled PPO, mode token_mask: those tokens stay
    in the normaliser) and truncated at `tis_cap` (verl's TIS);
  - rejection rules (verl's rollout_rs options, e.g. "seq_mean_k1" = geometric-mean rejection, "seq_mean_k3" =
    K3 rejection) that drop tokens or whole sequences from the loss mask, and so from the normalisers.

Sequences: without "segment_ids" a row is one sequence; with them (packed rows, `rl.batch.pack_minibatch`) each
segment id of a row is one sequence, so every per-sequence sum, mean and max is taken within a row and a segment.
Segment ids must lie in [0, T]; id 0 is padding (never trained).

All log-ratios are clamped to +-20 before exp (verl's SAFETY_BOUND), and untrained positions are selected away
before any arithmetic, so garbage there (NaN, -inf) never leaks. A NaN log-ratio on a trained token is NOT
rejected (verl's rules drop it): `Correction.nan_free` is False, and the update skips the step as for any
non-finite loss, whatever the config weights or rejects (a rejection-only config never reads the weight).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int, Shaped

SAFETY_BOUND = 20.0  # verl's clamp of log-ratios before exp: exp(20) ~ 4.9e8 is finite in float32.
DEFAULT_IS_THRESHOLD = 2.0  # verl's rollout_is_threshold: clamps the weights of the ESS when no cap is set.

Mask = Shaped[Array, "B T"]
SegmentIds = Int[Array, "B T"]
LogWeightFn = Callable[[Float[Array, "B T"], "SegmentIds | None"], Float[Array, "B T"]]
_IS_LEVELS: dict[str, LogWeightFn] = {}


def register_is_level(name: str) -> Callable[[LogWeightFn], LogWeightFn]:
  """Registers `fn(log_ratio, segment_ids) -> per-token log behaviour weight` ([B, T]; log_ratio is 0 where
  untrained) under `name`."""

  def deco(fn: LogWeightFn) -> LogWeightFn:
    if name in _IS_LEVELS and _IS_LEVELS[name] is not fn:
      raise ValueError(f"IS level {name!r} is already registered")
    _IS_LEVELS[name] = fn
    return fn

  return deco


def get_is_level(name: str) -> LogWeightFn:
  """The IS level registered as `name`; raises ValueError listing the known names."""
  if name not in _IS_LEVELS:
    raise ValueError(f"unknown IS level {name!r}; known: {sorted(_IS_LEVELS)}")
  return _IS_LEVELS[name]


def is_levels() -> list[str]:
  return sorted(_IS_LEVELS)


# ------------------------------------------------------------------------------------------------------------
# Per-sequence reductions within rows (plain rows or packed segments)
# ------------------------------------------------------------------------------------------------------------


def sequence_sum(x: Float[Array, "B T"], segment_ids: SegmentIds | None) -> Float[Array, "B S"]:
  """Sum of x over each sequence of each row: [B, 1] for plain rows, [B, T + 1] (indexed by segment id) for
  packed ones. Zero x where it must not count."""
  if segment_ids is None:
    return jnp.sum(x, axis=-1, keepdims=True)
  t = x.shape[-1]
  return jax.vmap(lambda v, s: jax.ops.segment_sum(v, s, num_segments=t + 1))(x, segment_ids)


def sequence_max(x: Float[Array, "B T"], segment_ids: SegmentIds | None) -> Float[Array, "B S"]:
  """Max of x over each sequence (layout of `sequence_sum`); -inf for a sequence whose x is all -inf."""
  if segment_ids is None:
    return jnp.max(x, axis=-1, keepdims=True)
  t = x.shape[-1]
  return jax.vmap(lambda v, s: jax.ops.segment_max(v, s, num_segments=t + 1))(x, segment_ids)


def to_tokens(per_seq: Float[Array, "B S"], segment_ids: SegmentIds | None, t: int) -> Float[Array, "B T"]:
  """Broadcasts per-sequence values back to each sequence's tokens."""
  if segment_ids is None:
    return jnp.broadcast_to(per_seq, (per_seq.shape[0], t))
  return jnp.take_along_axis(per_seq, segment_ids.astype(jnp.int32), axis=-1)


# ------------------------------------------------------------------------------------------------------------
# Behaviour weights: registered levels
# ------------------------------------------------------------------------------------------------------------


@register_is_level("token")
def token_log_weight(log_ratio: Float[Array, "B T"], segment_ids: SegmentIds | None) -> Float[Array, "B T"]:
  """log r_t = log pi_prox - log pi_behav per token (verl rollout_is="token", AReaL token modes)."""
  del segment_ids
  return log_ratio


@register_is_level("sequence")
def sequence_log_weight(log_ratio: Float[Array, "B T"], segment_ids: SegmentIds | None) -> Float[Array, "B T"]:
  """sum_t log r_t over the token's sequence: the sequence's likelihood ratio (verl rollout_is="sequence")."""
  return to_tokens(sequence_sum(log_ratio, segment_ids), segment_ids, log_ratio.shape[-1])


# ------------------------------------------------------------------------------------------------------------
# Rejection rules: verl's rollout_rs options and thresholds
# ------------------------------------------------------------------------------------------------------------

REJECTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")  # verl's SUPPORTED_ROLLOUT_RS_OPTIONS
# The thresholds of verl's RolloutCorrectionConfig presets, used when no threshold is given:
# geometric-mean rejection (decoupled_geo_rs), K3 rejection (decoupled_k3_rs), sequence MIS (decoupled_seq_is_rs).
DEFAULT_REJECTION_THRESHOLDS = {"seq_mean_k1": "0.999_1.001", "seq_mean_k3": "0.01", "seq_sum_k1": "0.5_2.0"}


class RejectionRule(NamedTuple):
  """One rejection option: keep a token (or sequence) while lower <= statistic <= upper.

  Attributes:
    option: a REJECTIONS name, "<level>_<estimator>".
    lower: lower bound of the statistic (k1 options only: log of the ratio bound), else None.
    upper: upper bound of the statistic (k1: log of the ratio bound; k2, k3: the divergence).
  """

  option: str
  lower: float | None
  upper: float


def parse_rejection(rejection: str, threshold: str | float | None) -> tuple[RejectionRule, ...]:
  """Rules from verl's `rollout_rs` / `rollout_rs_threshold` syntax.

  `rejection` is a comma-separated list of REJECTIONS (all must pass; duplicates dropped). `threshold` is one spec
  shared by all options or one per option (comma-separated); None takes DEFAULT_REJECTION_THRESHOLDS. A k1 spec is
  "lower_upper" in ratio space (log taken here), or one number u meaning [1/u, u]; a k2/k3 spec is one upper bound
  (an underscore there is an error, as in verl: a k1 spec shared with a k3 option must not be read as one number).

  Raises:
    ValueError: unknown option, missing / malformed / non-positive threshold, or a count mismatch.
  """
  options = list(dict.fromkeys(o.strip() for o in str(rejection).split(",") if o.strip()))
  if not options:
    raise ValueError("names no rejection option")
  for o in options:
    if o not in REJECTIONS:
      raise ValueError(f"has unknown option {o!r}; known: {list(REJECTIONS)}")
  if threshold is None:
    missing = [o for o in options if o not in DEFAULT_REJECTION_THRESHOLDS]
    if missing:
      raise ValueError(f"needs a threshold for {missing} (verl has no preset default for them)")
    specs = [str(DEFAULT_REJECTION_THRESHOLDS[o]) for o in options]
  else:
    if isinstance(threshold, bool) or not isinstance(threshold, (str, int, float)):
      raise ValueError(f"threshold must be a string or a number, got {threshold!r}")
    specs = [s.strip() for s in str(threshold).split(",") if s.strip()]
    if len(specs) == 1:
      specs = specs * len(options)
    if len(specs) != len(options):
      raise ValueError(f"threshold {threshold!r} gives {len(specs)} values for {len(options)} options")
  rules = []
  for o, spec in zip(options, specs):
    try:
      if o.endswith("k1"):
        lo, hi = spec.split("_", 1) if "_" in spec else (None, spec)
        hi = float(hi)
        lo = 1.0 / hi if lo is None else float(lo)
        if not (0 < lo <= hi < math.inf):
          raise ValueError
        rules.append(RejectionRule(o, math.log(lo), math.log(hi)))
      else:
        hi = float("nan" if "_" in spec else spec)  # float() would read "1_2" as 12
        if not 0 < hi < math.inf:
          raise ValueError
        rules.append(RejectionRule(o, None, hi))
    except ValueError:
      form = "'lower_upper' (ratios, 0 < lower <= upper) or one ratio u > 0" if o.endswith("k1") else "one number > 0"
      raise ValueError(f"threshold {spec!r} for {o!r} must be {form}") from None
  return tuple(rules)


# ------------------------------------------------------------------------------------------------------------
# The correction
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CorrectionConfig:
  """What `correct` applies (built from LossConfig; validated there).

  Attributes:
    is_level: registered IS level of the behaviour weight ("token" or "sequence").
    tis_cap: truncate the behaviour weight at this value (verl's TIS; None: no truncation).
    behav_imp_weight_cap: zero the behaviour weight where it exceeds this (AReaL's decoupled PPO, token_mask;
      inf: the raw weight, uncapped; None: no such weighting).
    rules: rejection rules (parse_rejection); empty: no rejection.
  """

  is_level: str = "token"
  tis_cap: float | None = None
  behav_imp_weight_cap: float | None = None
  rules: tuple[RejectionRule, ...] = ()

  @property
  def weights_loss(self) -> bool:
    """Whether the policy loss is multiplied by a behaviour weight (else only rejection, if any)."""
    return self.tis_cap is not None or self.behav_imp_weight_cap is not None

  @property
  def ess_threshold(self) -> float:
    """The weights of the ESS metric are clamped to [1/thr, thr] (verl), thr = the cap the loss uses: with only
    AReaL's cap (5.0) that is [0.2, 5], wider than verl's default [0.5, 2], so the ESS < 0.3 alarm fires sooner."""
    for cap in (self.tis_cap, self.behav_imp_weight_cap):
      if cap is not None and math.isfinite(cap) and cap > 1.0:
        return float(cap)
    return DEFAULT_IS_THRESHOLD


class Correction(NamedTuple):
  """Output of `correct` for one mini-batch.

  Attributes:
    weight: [B, T] float32 behaviour weight to multiply the per-token policy loss by (no gradient; 0 where the
      mask is 0), or None when the config weights nothing.
    mask: [B, T] bool, the loss mask after rejection (pass it to the loss AND to `losses.agg_normaliser`).
    metrics: float32 scalars (see `correct`).
    nan_free: bool scalar, False when a trained token's log-ratio is NaN (the update must skip the step).
  """

  weight: Float[Array, "B T"] | None
  mask: Shaped[Array, "B T"]
  metrics: dict[str, Array]
  nan_free: Shaped[Array, ""]


# Metrics whose mini-batch values must not be averaged (see reduce_update_metrics): additive parts and maxima.
ADDITIVE_PARTS = ("is_tokens", "is_weight_sum", "is_clamped_sum", "is_clamped_sq_sum")
_PARTS_DROPPED = ADDITIVE_PARTS[1:]  # sums with no meaning of their own once combined
MAX_METRICS = ("is_weight_max",)


def _safe_div(a, b):
  return a / jnp.maximum(b, 1.0)


def correct(cfg: CorrectionConfig | None, *, logp_prox: Float[Array, "B T"], logp_behav: Float[Array, "B T"],
            mask: Mask, segment_ids: SegmentIds | None = None) -> Correction:
  """Behaviour weights, rejection mask and diagnostics of one whole mini-batch (never of a micro-batch: the
  metrics are not additive, and the mask changes the normalisers).

  With r = pi_prox / pi_behav, lr = log r (0 where the mask is 0) and w the raw weight at cfg.is_level
  (exp(clip(lr, +-20)) per token, or exp(clip(sum of lr over the sequence, +-20)) for "sequence"):
    weight = w, then 0 where w > behav_imp_weight_cap (AReaL), then min(., tis_cap) (verl), then 0 where rejected.
    Rejection rule on statistic s (per token, or the sum / mean / max over the sequence, from the token
    estimators k1 = -lr, k2 = lr^2 / 2, k3 = exp(lr) - 1 - lr, lr clamped to +-20): the token (or its whole
    sequence) is dropped from the mask when s > upper or s < lower. Exactly verl's compute_rollout_rejection_mask,
    except that NaN is not rejected: `nan_free` reports it, and the update skips the step.
    With is_level "sequence", behav_imp_weight_cap zeroes a sequence whose likelihood ratio (the product of r)
    exceeds the cap: verl's sequence weight under AReaL's token_mask rule (AReaL's own sequence modes compare the
    geometric mean of r, which a long sequence exceeds far less often).

  Args:
    cfg: the correction; None computes only the metrics (weight None, mask unchanged).
    logp_prox: [B, T] the trainer's log-probs before the update (batch "old_logp").
    logp_behav: [B, T] the sampler's log-probs (batch "sampler_logp").
    mask: [B, T] nonzero on trained tokens.
    segment_ids: [B, T] packed-sequence ids, or None (one sequence per row).

  Returns:
    Correction. Metrics (float32 scalars; token means over the trained tokens of `mask`, before rejection, as
    verl's are): is_weight_mean / is_weight_max (raw weight w, verl's rollout_is_mean / _max), is_ess
    ((sum c)^2 / (N sum c^2) of c = clip(w, 1/thr, thr), thr = cfg.ess_threshold: verl's
    rollout_is_eff_sample_size, 1 = uniform), is_weight_frac_high (w > thr), behav_kl_k1 (mean of
    log pi_behav - log pi_prox: verl's "kl", KL(pi_behav || pi_prox)), behav_kl_k3 (mean of r - 1 - log r: verl's
    "k3_kl"), behav_ppl_ratio (mean over sequences of exp(mean log pi_behav - mean log pi_prox): verl's
    "ppl_ratio", trainer perplexity / sampler perplexity), rejected_token_frac (trained tokens the correction
    removes from the loss: rejected, or weight zeroed by behav_imp_weight_cap), rejected_seq_frac (sequences
    with such a token, of the sequences with a trained token), and the additive parts is_tokens, is_weight_sum,
    is_clamped_sum, is_clamped_sq_sum (see reduce_update_metrics). Denominators differ from verl's in two places:
    rejected_seq_frac and behav_ppl_ratio average over the sequences with a trained token (verl's over every row,
    an empty row counting 0 and 1), so padding does not dilute them; is_weight_frac_high counts tokens at both
    levels (verl's sequence level counts sequences).
  """
  m = mask != 0
  f32 = jnp.float32
  t = m.shape[-1]
  seg = None if segment_ids is None else segment_ids.astype(jnp.int32)
  lr = jnp.where(m, logp_prox.astype(f32) - logp_behav.astype(f32), 0.0)
  lr_safe = jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
  n_tok = jnp.sum(m, dtype=f32)
  seq_n = sequence_sum(m.astype(f32), seg)  # [B, S] trained tokens per sequence
  seq_valid = seq_n > 0
  n_seq = jnp.sum(seq_valid, dtype=f32)
  level = "token" if cfg is None else cfg.is_level
  w_raw = jnp.exp(jnp.clip(get_is_level(level)(lr, seg), -SAFETY_BOUND, SAFETY_BOUND))
  w_raw = lax.stop_gradient(jnp.where(m, w_raw, 0.0))

  # ---- rejection (verl): each rule drops tokens, or whole sequences, whose statistic is out of bounds
  keep = m
  if cfg is not None and cfg.rules:
    estimators = {"k1": -lr_safe, "k2": 0.5 * jnp.square(lr_safe), "k3": jnp.exp(lr_safe) - 1.0 - lr_safe}
    for rule in cfg.rules:
      level_name, est = rule.option.rsplit("_", 1)
      s = estimators[est]
      if level_name == "seq_sum":
        s = to_tokens(sequence_sum(jnp.where(m, s, 0.0), seg), seg, t)
      elif level_name == "seq_mean":
        s = to_tokens(sequence_sum(jnp.where(m, s, 0.0), seg) / jnp.maximum(seq_n, 1.0), seg, t)
      elif level_name == "seq_max":
        s = to_tokens(sequence_max(jnp.where(m, s, -jnp.inf), seg), seg, t)
      out = s > rule.upper
      if rule.lower is not None:
        out = out | (s < rule.lower)
      keep = keep & ~out

  # ---- behaviour weight (AReaL's mask cap, verl's truncation), 0 off the kept tokens
  weight = None
  dropped = m & ~keep
  if cfg is not None and cfg.weights_loss:
    weight = w_raw
    if cfg.behav_imp_weight_cap is not None:
      # `>` rather than `<=` keeps a NaN weight NaN, so that the step is skipped rather than the token ignored.
      weight = jnp.where(weight > cfg.behav_imp_weight_cap, 0.0, weight)
      dropped = dropped | (m & (weight == 0.0))
    if cfg.tis_cap is not None:
      weight = jnp.minimum(weight, cfg.tis_cap)
    weight = lax.stop_gradient(jnp.where(keep, weight, 0.0))

  # ---- metrics
  thr = DEFAULT_IS_THRESHOLD if cfg is None else cfg.ess_threshold
  clamped = jnp.where(m, jnp.clip(w_raw, 1.0 / thr, thr), 0.0)
  c_sum, c_sq = jnp.sum(clamped), jnp.sum(jnp.square(clamped))
  w_sum = jnp.sum(w_raw)
  seq_dropped = sequence_sum(dropped.astype(f32), seg) > 0
  # Per-sequence mean log-prob difference (behav - prox) = -mean lr; clamped only to stay finite.
  seq_log_ppl_diff = jnp.clip(-sequence_sum(lr, seg) / jnp.maximum(seq_n, 1.0), -SAFETY_BOUND, SAFETY_BOUND)
  tok = lambda x: _safe_div(jnp.sum(jnp.where(m, x, 0.0)), n_tok)  # noqa: E731
  metrics = {
      "is_weight_mean": _safe_div(w_sum, n_tok),
      "is_weight_max": jnp.max(w_raw),
      "is_ess": jnp.square(c_sum) / jnp.where(c_sq > 0, n_tok * c_sq, 1.0),  # c >= 1/thr: c_sq > 0 iff N > 0
      "is_weight_frac_high": tok((w_raw > thr).astype(f32)),
      "behav_kl_k1": tok(-lr),
      "behav_kl_k3": tok(jnp.exp(lr_safe) - 1.0 - lr_safe),
      "behav_ppl_ratio": _safe_div(jnp.sum(jnp.where(seq_valid, jnp.exp(seq_log_ppl_diff), 0.0)), n_seq),
      "rejected_token_frac": tok(dropped.astype(f32)),
      "rejected_seq_frac": _safe_div(jnp.sum(seq_valid & seq_dropped, dtype=f32), n_seq),
      "is_tokens": n_tok, "is_weight_sum": w_sum, "is_clamped_sum": c_sum, "is_clamped_sq_sum": c_sq,
  }
  metrics = {k: lax.stop_gradient(jnp.asarray(v, f32)) for k, v in metrics.items()}
  nan_free = ~jnp.any(m & jnp.isnan(lr))
  return Correction(weight, keep, metrics, nan_free)


# ------------------------------------------------------------------------------------------------------------
# Presets (verl's RolloutCorrectionConfig class methods with their default arguments; AReaL's default)
# ------------------------------------------------------------------------------------------------------------

_OFF = dict(is_level="token", tis_cap=None, behav_imp_weight_cap=None, rejection=None, rejection_threshold=None)
_GEO = dict(rejection="seq_mean_k1", rejection_threshold="0.999_1.001")
_K3 = dict(rejection="seq_mean_k3", rejection_threshold="0.01")  # a string, as config.rl.loss's field is
_TOKEN_TIS = dict(is_level="token", tis_cap=2.0)
_SEQ_TIS = dict(is_level="sequence", tis_cap=2.0)
PRESETS: dict[str, dict] = {
    "disabled": {},
    "decoupled_token_is": _TOKEN_TIS,
    "decoupled_seq_is": _SEQ_TIS,
    "decoupled_seq_is_rs": dict(_SEQ_TIS, rejection="seq_sum_k1", rejection_threshold="0.5_2.0"),
    "decoupled_geo_rs": _GEO,
    "decoupled_geo_rs_token_tis": dict(_GEO, **_TOKEN_TIS),
    "decoupled_geo_rs_seq_tis": dict(_GEO, **_SEQ_TIS),
    "decoupled_k3_rs": _K3,
    "decoupled_k3_rs_token_tis": dict(_K3, **_TOKEN_TIS),
    "decoupled_k3_rs_seq_tis": dict(_K3, **_SEQ_TIS),
    # AReaL's decoupled PPO with its defaults: behave_imp_weight_cap=5.0, behave_imp_weight_mode="token_mask".
    "areal_decoupled": dict(behav_imp_weight_cap=5.0),
}


def preset(name: str) -> dict:
  """LossConfig field values of an off-policy preset (every correction field, the others at their off values):
  `LossConfig(**preset("decoupled_k3_rs_token_tis"))` or `config.rl.loss.update(preset(...))`."""
  if name not in PRESETS:
    raise ValueError(f"unknown off-policy preset {name!r}; known: {sorted(PRESETS)}")
  return dict(_OFF, **PRESETS[name])


# ------------------------------------------------------------------------------------------------------------
# Host side: metrics over several updates, alarms
# ------------------------------------------------------------------------------------------------------------


def reduce_update_metrics(updates: Sequence[dict[str, float]]) -> dict[str, float]:
  """One step's metrics from the metrics of its updates (mini-batches x epochs): the mean of each metric, except
  is_weight_max (the max), is_weight_mean and is_ess (recomputed from the additive parts over all updates, so
  they are those of the union of the mini-batches); of the additive parts only is_tokens (averaged) is kept."""
  if not updates:
    return {}
  out = {k: float(sum(float(u[k]) for u in updates) / len(updates)) for k in updates[0] if k not in _PARTS_DROPPED}
  for k in MAX_METRICS:
    if k in updates[0]:
      out[k] = max(float(u[k]) for u in updates)
  if all(k in updates[0] for k in ADDITIVE_PARTS):
    n, w, c, c2 = (sum(float(u[k]) for u in updates) for k in ADDITIVE_PARTS)
    out["is_weight_mean"] = w / max(n, 1.0)
    out["is_ess"] = c * c / (max(n, 1.0) * c2) if c2 > 0 else 0.0
  return out


def offpolicy_alarms(metrics: dict[str, float], *, is_mean_range: tuple[float, float] = (0.5, 2.0),
                     min_ess: float = 0.3) -> list[str]:
  """verl's rollout-correction health warnings (docs/algo/rollout_corr.md): the mean IS weight outside [0.5, 2]
  (a large behaviour / trainer gap) and an effective sample size below 0.3 (the weight sits on few tokens).

  `metrics` holds is_weight_mean and is_ess, bare or with any prefix ("train/is_ess"); a step without them, or
  whose is_tokens is 0, raises nothing. Returns the warning lines (empty when healthy)."""
  def find(name):
    for k, v in metrics.items():
      if k == name or k.endswith("/" + name):
        return float(v)
    return None

  tokens = find("is_tokens")
  if tokens is not None and tokens <= 0:
    return []
  alarms = []
  mean, ess = find("is_weight_mean"), find("is_ess")
  lo, hi = is_mean_range
  if mean is not None and not lo <= mean <= hi:
    alarms.append(f"off-policy: mean importance weight pi_prox / pi_behav is {mean:.3g}, outside [{lo:g}, {hi:g}]: "
                  "the sampler's policy is far from the trainer's (staleness or numerics)")
  if ess is not None and ess < min_ess:
    alarms.append(f"off-policy: effective sample size of the importance weights is {ess:.3g} < {min_ess:g}: "
                  "the update rests on few tokens")
  return alarms
