"""Policy losses, KL estimators, entropy and loss aggregation for GRPO-style RL (pure functions).

Everything here is array-in/array-out and registered by name; the config picks names. Per-token arrays are
[B, T] over response positions, with `mask` [B, T] nonzero on the tokens the policy is trained on (model
tokens) and zero on prompt, tool-output and padding tokens.

Normaliser contract (gradient accumulation inside one compiled step):
  Every aggregate here is `sum(weights * x) / normaliser`, with the normaliser passed in explicitly
  (`AggNorm`). Compute `norm = agg_normaliser(minibatch_mask, cfg)` ONCE over the whole mini-batch, then
  call `aggregate` / `grpo_objective` on each micro-batch (split along B, whole sequences) with that same
  `norm`. The micro-batch scalars (loss and every metric) then SUM to the full mini-batch value, and so do
  their gradients; e.g. token-mean is the exact mean over all tokens of the mini-batch, not a mean of
  micro-batch means. Under `jit` with a data-sharded batch the sums in `agg_normaliser` are global, so the
  same holds across devices. Without a `norm`, the batch passed in is treated as the whole mini-batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int, Scalar, Shaped

from agentrl_jax.rl import offpolicy

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 4.9e8 stays finite in float32; verl clamps the same way.
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

Mask = Shaped[Array, "B T"]


class PolicyLossOutput(NamedTuple):
  """Per-token outputs of a policy loss; every field is [B, T] float32 and exactly 0 where mask is 0.

  Attributes:
    loss: per-token policy-gradient loss, unweighted (`grpo_objective` multiplies it by the behaviour weight).
    clip_high: 1 where the upper clip bound was active (A > 0, ratio > 1 + clip_high).
    clip_low: 1 where the lower clip bound was active (A < 0, ratio < 1 - clip_low).
    dual_clip: 1 where the dual clip was active (A < 0, ratio > c).
  """

  loss: Float[Array, "B T"]
  clip_high: Float[Array, "B T"]
  clip_low: Float[Array, "B T"]
  dual_clip: Float[Array, "B T"]


PolicyLossFn = Callable[..., PolicyLossOutput]
KLFn = Callable[[Float[Array, "B T"], Float[Array, "B T"]], Float[Array, "B T"]]
_LOSSES: dict[str, PolicyLossFn] = {}
_KLS: dict[str, KLFn] = {}


def register_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
  """Registers a policy loss `fn(logp, logp_old, advantages, mask, cfg)` under `name`.

  The per-token loss it returns is unweighted: `grpo_objective` applies the off-policy behaviour weight."""

  def deco(fn: PolicyLossFn) -> PolicyLossFn:
    if name in _LOSSES and _LOSSES[name] is not fn:
      raise ValueError(f"policy loss {name!r} is already registered")
    _LOSSES[name] = fn
    return fn

  return deco


def get_loss(name: str) -> PolicyLossFn:
  """Returns the policy loss registered as `name`; raises ValueError listing the known names."""
  if name not in _LOSSES:
    raise ValueError(f"unknown policy loss {name!r}; known: {sorted(_LOSSES)}")
  return _LOSSES[name]


def register_kl(*names: str) -> Callable[[KLFn], KLFn]:
  """Registers a per-token KL estimator `fn(logp, logp_ref) -> [B, T]` under one or more names."""

  def deco(fn: KLFn) -> KLFn:
    for name in names:
      _KLS[name] = fn
    return fn

  return deco


def get_kl(name: str) -> KLFn:
  """Returns the KL estimator registered as `name`; raises ValueError listing the known names."""
  if name not in _KLS:
    raise ValueError(f"unknown KL estimator {name!r}; known: {sorted(_KLS)}")
  return _KLS[name]


# ------------------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Loss settings; the defaults are the GRPO-TCR recipe (token-mean, clip 0.2/0.28, dual clip 10, no KL).

  Attributes:
    policy_loss: registered policy loss name.
    clip_low: ratio lower bound is 1 - clip_low (for A < 0).
    clip_high: ratio upper bound is 1 + clip_high (for A > 0); clip-higher when > clip_low.
    dual_clip_c: for A < 0 the loss is capped at -A * c (ratio > c); None disables. Must be > 1.
    loss_agg_mode: one of AGG_MODES.
    loss_scale_factor: divisor of seq-mean-token-sum-norm (verl: defaults to the padded response length T).
      Set a constant when micro-batches are padded to different lengths, or the sum will not add up.
    entropy_coeff: loss -= entropy_coeff * agg(entropy). 0 (the recipe): entropy is only a metric.
    kl_coeff: loss += kl_coeff * agg(kl(logp, logp_ref)). 0 (the recipe): no reference model is needed.
    kl_type: registered KL estimator name (k1, k2, k3/low_var_kl, abs, k1+, k3+).
    tis_cap: truncated importance sampling (verl's TIS) between the sampler (behaviour policy) and the trainer's
      recomputation (proximal policy): each token's loss is weighted by the behaviour weight
      w = pi_prox / pi_behav at `is_level`, truncated: min(w, tis_cap). None disables.
    is_level: registered level of the behaviour weight (offpolicy.register_is_level): "token" (w per token) or
      "sequence" (the product of w over the token's sequence; verl's sequence IS). Used when a cap is set.
    behav_imp_weight_cap: AReaL's decoupled PPO: the loss is weighted by w, and set to 0 where w exceeds the cap
      (AReaL's token_mask mode; such tokens stay in the normaliser). Must be > 1 (inf: w uncapped). Composes
      with tis_cap (w zeroed above this cap, then truncated at tis_cap). None disables.
    rejection: verl's rollout_rs: comma-separated rejection options (offpolicy.REJECTIONS, e.g. "seq_mean_k1"
      geometric-mean rejection, "seq_mean_k3" K3 rejection, "token_k1"): tokens, or whole sequences, whose
      behaviour-vs-trainer divergence is out of bounds leave the loss mask (and the normalisers). None disables.
    rejection_threshold: verl's rollout_rs_threshold for `rejection` (one spec, or one per option; k1: "lo_hi"
      ratio bounds); None: verl's preset defaults (seq_mean_k1 "0.999_1.001", seq_mean_k3 0.01, seq_sum_k1
      "0.5_2.0"). `offpolicy.preset(name)` gives verl's and AReaL's presets as field values.
  """

  policy_loss: str = "ppo_clip"
  clip_low: float = 0.2
  clip_high: float = 0.28
  dual_clip_c: float | None = 10.0
  loss_agg_mode: str = "token-mean"
  loss_scale_factor: float | None = None
  entropy_coeff: float = 0.0
  kl_coeff: float = 0.0
  kl_type: str = "low_var_kl"
  tis_cap: float | None = None
  is_level: str = "token"
  behav_imp_weight_cap: float | None = None
  rejection: str | None = None
  rejection_threshold: str | float | None = None

  def __post_init__(self):
    def bad(field: str, why: str):
      raise ValueError(f"LossConfig.{field} {why}, got {getattr(self, field)!r}")

    for f in ("clip_low", "clip_high", "entropy_coeff", "kl_coeff"):
      v = getattr(self, f)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        bad(f, "must be a finite number")
    for f in ("dual_clip_c", "loss_scale_factor", "tis_cap"):
      v = getattr(self, f)
      if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
        bad(f, "must be None or a finite number")
    if self.policy_loss not in _LOSSES:
      bad("policy_loss", f"must be one of {sorted(_LOSSES)}")
    if not 0.0 <= self.clip_low < 1.0:
      bad("clip_low", "must be in [0, 1)")
    if self.clip_high < 0.0:
      bad("clip_high", "must be >= 0")
    if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
      bad("dual_clip_c", "must be > 1 (or None to disable)")
    if self.loss_agg_mode not in AGG_MODES:
      bad("loss_agg_mode", f"must be one of {AGG_MODES}")
    if self.loss_scale_factor is not None and self.loss_scale_factor <= 0:
      bad("loss_scale_factor", "must be > 0 (or None)")
    if self.kl_coeff < 0.0:
      bad("kl_coeff", "must be >= 0")
    if self.kl_type not in _KLS:
      bad("kl_type", f"must be one of {sorted(_KLS)}")
    if self.tis_cap is not None and self.tis_cap <= 0.0:
      bad("tis_cap", "must be > 0 (or None to disable)")
    if self.is_level not in offpolicy.is_levels():
      bad("is_level", f"must be one of {offpolicy.is_levels()}")
    v = self.behav_imp_weight_cap
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 1.0):
      bad("behav_imp_weight_cap", "must be None or a number > 1 (inf: uncapped), as AReaL requires")
    if self.rejection is None and self.rejection_threshold is not None:
      bad("rejection_threshold", "is set but LossConfig.rejection is None")
    if self.rejection is not None:
      if not isinstance(self.rejection, str):
        bad("rejection", "must be None or a string of comma-separated options")
      try:
        offpolicy.parse_rejection(self.rejection, self.rejection_threshold)
      except ValueError as e:
        field = "rejection_threshold" if "threshold" in str(e) else "rejection"
        bad(field, str(e))

  @property
  def needs_reference(self) -> bool:
    """Whether a reference model must be loaded and run (only when the KL term is on)."""
    return self.kl_coeff > 0.0

  @property
  def correction(self) -> offpolicy.CorrectionConfig | None:
    """The off-policy correction these fields ask for; None when the loss is on-policy (the recipe)."""
    if self.tis_cap is None and self.behav_imp_weight_cap is None and self.rejection is None:
      return None
    rules = () if self.rejection is None else offpolicy.parse_rejection(self.rejection, self.rejection_threshold)
    return offpolicy.CorrectionConfig(is_level=self.is_level, tis_cap=self.tis_cap,
                                      behav_imp_weight_cap=self.behav_imp_weight_cap, rules=rules)

  @property
  def needs_proximal_logp(self) -> bool:
    """Whether the loss corrects for the behaviour policy (tis_cap, behav_imp_weight_cap or rejection set).

    Then the update needs both "sampler_logp" (the behaviour policy's log-probs) and "old_logp" recomputed by the
    trainer before the update (the proximal policy): with old_logp = sampler_logp (rl.reuse_sampler_logp) every
    weight is exactly 1 and nothing is ever rejected, so the correction would silently do nothing.
    """
    return self.correction is not None


# ------------------------------------------------------------------------------------------------------------
# KL estimators (http://joschu.net/blog/kl-approx.html), per token, of KL(pi || pi_ref) on samples of pi
# ------------------------------------------------------------------------------------------------------------


@register_kl("k1", "kl")
def kl_k1(logp: Float[Array, "B T"], logp_ref: Float[Array, "B T"]) -> Float[Array, "B T"]:
  """k1 = log pi - log pi_ref (unbiased, high variance, can be negative)."""
  return logp - logp_ref


@register_kl("abs")
def kl_abs(logp: Float[Array, "B T"], logp_ref: Float[Array, "B T"]) -> Float[Array, "B T"]:
  """|log pi - log pi_ref|."""
  return jnp.abs(logp - logp_ref)


@register_kl("k2", "mse")
def kl_k2(logp: Float[Array, "B T"], logp_ref: Float[Array, "B T"]) -> Float[Array, "B T"]:
  """k2 = 0.5 * (log pi - log pi_ref)^2 (biased, low variance, its gradient is the KL's)."""
  return 0.5 * jnp.square(logp - logp_ref)


@register_kl("k3", "low_var_kl")
def kl_k3(logp: Float[Array, "B T"], logp_ref: Float[Array, "B T"]) -> Float[Array, "B T"]:
  """k3 = exp(d) - d - 1 with d = log pi_ref - log pi, clamped as verl does (d to +-20, k3 to +-10)."""
  d = jnp.clip(logp_ref - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jnp.clip(jnp.exp(d) - d - 1.0, -10.0, 10.0)


def _straight_through_k2(forward: KLFn) -> KLFn:
  def fn(logp, logp_ref):
    k2 = kl_k2(logp, logp_ref)
    return k2 - lax.stop_gradient(k2) + lax.stop_gradient(forward(logp, logp_ref))

  fn.__doc__ = f"Value of {forward.__name__}, gradient of k2 (unbiased KL gradient; verl's '+' variants)."
  return fn


register_kl("k1+")(_straight_through_k2(kl_k1))
register_kl("k3+", "low_var_kl+")(_straight_through_k2(kl_k3))


# ------------------------------------------------------------------------------------------------------------
# Policy losses
# ------------------------------------------------------------------------------------------------------------


@register_loss("ppo_clip")
def ppo_clip_loss(
    logp: Float[Array, "B T"],
    logp_old: Float[Array, "B T"],
    advantages: Float[Array, "B T"],
    mask: Mask,
    cfg: LossConfig,
) -> PolicyLossOutput:
  """Clipped PPO/GRPO surrogate with clip-higher, dual clip, per token.

  ratio = exp(clip(logp - logp_old, -20, 20)). Per token (eps_l, eps_h, c from cfg):
    A > 0: -A * min(ratio, 1 + eps_h)                      (clip_high where ratio > 1 + eps_h)
    A < 0: -A * min(max(ratio, 1 - eps_l), c)              (clip_low where ratio < 1 - eps_l,
                                                             dual_clip where ratio > c)
  which equals verl's max(-A r, -A clip(r)) then min(., -A c) for A < 0. A clipped token has zero
  gradient. Off-policy weights (cfg.tis_cap, ...) are applied by `grpo_objective`, as verl multiplies
  pg_losses by rollout_is_weights after the clip.

  Args:
    logp: [B, T] current policy log-probs (differentiated).
    logp_old: [B, T] log-probs of the policy that the advantages belong to (trainer-side recompute).
    advantages: [B, T] per-token advantages (0 on masked tokens).
    mask: [B, T] nonzero on trained tokens.
    cfg: LossConfig.

  Returns:
    PolicyLossOutput with all fields zero where mask is 0.
  """
  m = mask != 0
  # Masked positions may hold garbage (-inf log-probs of padding); select before any arithmetic so that
  # neither the value nor the gradient sees it.
  log_ratio = jnp.where(m, logp.astype(jnp.float32) - logp_old.astype(jnp.float32), 0.0)
  ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
  adv = jnp.where(m, advantages.astype(jnp.float32), 0.0)

  hi = 1.0 + cfg.clip_high
  lo = 1.0 - cfg.clip_low
  is_high = m & (adv > 0) & (ratio > hi)
  is_low = m & (adv < 0) & (ratio < lo)
  if cfg.dual_clip_c is not None:
    is_dual = m & (adv < 0) & (ratio > cfg.dual_clip_c)
    eff_ratio = jnp.where(is_dual, cfg.dual_clip_c, ratio)
  else:
    is_dual = jnp.zeros_like(m)
    eff_ratio = ratio
  eff_ratio = jnp.where(is_high, hi, jnp.where(is_low, lo, eff_ratio))
  loss = -adv * eff_ratio

  f = lambda b: b.astype(jnp.float32)  # noqa: E731
  return PolicyLossOutput(jnp.where(m, loss, 0.0), f(is_high), f(is_low), f(is_dual))


# ------------------------------------------------------------------------------------------------------------
# Aggregation with explicit normalisers
# ------------------------------------------------------------------------------------------------------------


class AggNorm(NamedTuple):
  """Normalisers of one mini-batch (float32 scalars); see the module docstring for the contract.

  Attributes:
    num_tokens: number of trained tokens (mask != 0) in the mini-batch.
    num_seqs: number of sequences with at least one trained token in the mini-batch.
    scale_factor: divisor of seq-mean-token-sum-norm.
  """

  num_tokens: Scalar
  num_seqs: Scalar
  scale_factor: Scalar


def agg_normaliser(mask: Mask, loss_scale_factor: float | None = None) -> AggNorm:
  """Normalisers of the whole mini-batch `mask` [B, T]; pass the result to every micro-batch.

  `loss_scale_factor` defaults (as in verl) to T, the padded length of `mask`.
  """
  m = mask != 0
  scale = mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
  return AggNorm(
      num_tokens=jnp.sum(m, dtype=jnp.float32),
      num_seqs=jnp.sum(jnp.any(m, axis=-1), dtype=jnp.float32),
      scale_factor=jnp.asarray(scale, jnp.float32),
  )


def aggregate(x: Float[Array, "B T"], mask: Mask, mode: str, norm: AggNorm | None = None) -> Scalar:
  """Reduces per-token values to a scalar (verl's agg_loss, with global normalisers passed in).

  With n_i = trained tokens of sequence i, N = norm.num_tokens, S = norm.num_seqs (sequences with n_i > 0):
    token-mean:              sum_i sum_t x_it / N
    seq-mean-token-mean:     sum_{i: n_i>0} (sum_t x_it / n_i) / S
    seq-mean-token-sum:      sum_i sum_t x_it / S
    seq-mean-token-sum-norm: sum_i sum_t x_it / norm.scale_factor     (verl: a sum over sequences,
                                                                        not a mean; Dr.GRPO-style)
  Masked positions are excluded by selection, so NaN/inf there never leaks. A zero normaliser gives 0.

  Args:
    x: [B, T] per-token values.
    mask: [B, T] nonzero on trained tokens.
    mode: one of AGG_MODES.
    norm: mini-batch normalisers; None uses `agg_normaliser(mask)` (x is then the whole mini-batch).

  Returns:
    float32 scalar; summing it over micro-batches that share `norm` gives the mini-batch value.
  """
  if mode not in AGG_MODES:
    raise ValueError(f"unknown loss_agg_mode {mode!r}; known: {AGG_MODES}")
  norm = agg_normaliser(mask) if norm is None else norm
  m = mask != 0
  x = jnp.where(m, x.astype(jnp.float32), 0.0)
  seq_sum = jnp.sum(x, axis=-1)
  if mode == "token-mean":
    return jnp.sum(seq_sum) / jnp.maximum(norm.num_tokens, 1.0)
  if mode == "seq-mean-token-mean":
    n_i = jnp.sum(m, axis=-1, dtype=jnp.float32)
    return jnp.sum(seq_sum / jnp.maximum(n_i, 1.0)) / jnp.maximum(norm.num_seqs, 1.0)
  if mode == "seq-mean-token-sum":
    return jnp.sum(seq_sum) / jnp.maximum(norm.num_seqs, 1.0)
  return jnp.sum(seq_sum) / norm.scale_factor


# ------------------------------------------------------------------------------------------------------------
# The full objective
# ------------------------------------------------------------------------------------------------------------


def grpo_objective(
    cfg: LossConfig,
    *,
    logp: Float[Array, "B T"],
    logp_old: Float[Array, "B T"],
    advantages: Float[Array, "B T"],
    mask: Mask,
    norm: AggNorm | None = None,
    entropy: Float[Array, "B T"] | None = None,
    logp_ref: Float[Array, "B T"] | None = None,
    logp_sampler: Float[Array, "B T"] | None = None,
    segment_ids: Int[Array, "B T"] | None = None,
    is_weight: Float[Array, "B T"] | None = None,
) -> tuple[Scalar, dict[str, Scalar]]:
  """Scalar loss = agg(w * policy loss) - entropy_coeff * agg(entropy) + kl_coeff * agg(kl to reference).

  All terms use cfg.loss_agg_mode and the shared `norm`; every metric is a token-mean with norm.num_tokens.
  So the loss, its gradient and every metric are additive over micro-batches (module docstring).

  Off-policy correction (cfg.needs_proximal_logp), w the behaviour weight (1 when on-policy) and `mask` the
  mask after rejection (see rl/offpolicy.py):
    - micro-batches (a shared `norm`): run `offpolicy.correct(cfg.correction, ...)` once on the whole mini-batch,
      and pass its `mask` (to agg_normaliser too) and its `weight` as `is_weight` (None for rejection only);
    - a whole mini-batch (`norm` None): pass `logp_sampler` (and `segment_ids` for packed rows) and the
      correction is computed here, its metrics included (only the metrics at the on-policy defaults).

  Args:
    cfg: LossConfig (static).
    logp: [B, T] current log-probs (differentiated).
    logp_old: [B, T] old-policy log-probs.
    advantages: [B, T] per-token advantages (see advantages.broadcast_to_tokens).
    mask: [B, T] nonzero on trained tokens.
    norm: mini-batch normalisers from agg_normaliser; None: this batch is the mini-batch.
    entropy: [B, T] per-token entropy; required when cfg.entropy_coeff != 0, else only a metric.
    logp_ref: [B, T] reference log-probs; required when cfg.kl_coeff > 0.
    logp_sampler: [B, T] sampler log-probs (behaviour policy; `logp_old` is then the proximal policy); required
      when cfg.needs_proximal_logp and no `is_weight` is given.
    segment_ids: [B, T] packed-sequence ids (sequence-level corrections); None: one sequence per row.
    is_weight: [B, T] precomputed behaviour weight (offpolicy.correct(...).weight); the loss is multiplied by it.

  Returns:
    (loss, metrics) with metrics: loss, pg_loss, clip_frac_high, clip_frac_low, clip_frac_dual, clip_frac,
    clip_high_reachable (tokens with A > 0 and old probability below 1 / (1 + clip_high): the only ones the
    upper bound can bind on),
    ppo_kl (k1 estimate of KL(old || current), verl's), approx_kl (k3 estimate of the same), and when given:
    entropy, kl_ref, and the off-policy metrics of `offpolicy.correct` when it runs here.
  """
  corr_metrics, nan_free = {}, None
  if is_weight is None and norm is None and logp_sampler is not None:  # the whole mini-batch: correct it here
    corr = offpolicy.correct(cfg.correction, logp_prox=logp_old, logp_behav=logp_sampler, mask=mask,
                             segment_ids=segment_ids)
    if cfg.needs_proximal_logp:
      mask, nan_free = corr.mask, corr.nan_free
    is_weight, corr_metrics = corr.weight, corr.metrics
  elif cfg.needs_proximal_logp and is_weight is None:
    if norm is None:
      raise ValueError("LossConfig corrects off-policy data (tis_cap, behav_imp_weight_cap or rejection) but "
                       "neither logp_sampler nor is_weight was given")
    if cfg.correction.weights_loss:
      raise ValueError("grpo_objective: with a shared `norm` (micro-batches) run offpolicy.correct on the whole "
                       "mini-batch first and pass its weight (is_weight) and mask")
  norm = agg_normaliser(mask, cfg.loss_scale_factor) if norm is None else norm
  out = get_loss(cfg.policy_loss)(logp, logp_old, advantages, mask, cfg)
  mode = cfg.loss_agg_mode
  pg_loss = aggregate(out.loss if is_weight is None else out.loss * is_weight, mask, mode, norm)
  tok_mean = lambda x: aggregate(lax.stop_gradient(x), mask, "token-mean", norm)  # noqa: E731

  loss = pg_loss
  metrics = {
      "pg_loss": pg_loss,
      "clip_frac_high": tok_mean(out.clip_high),
      "clip_frac_low": tok_mean(out.clip_low),
      "clip_frac_dual": tok_mean(out.dual_clip),
      "clip_frac": tok_mean(out.clip_high + out.clip_low),
  }
  m = mask != 0
  # Where the upper bound can bind at all: a token with A > 0 whose old probability is below 1 / (1 + clip_high)
  # (a likelier token's ratio cannot pass 1 / p_old <= 1 + clip_high). Clip-higher changes updates only here.
  reachable = m & (advantages > 0) & (logp_old < -jnp.log1p(cfg.clip_high))
  metrics["clip_high_reachable"] = tok_mean(reachable.astype(jnp.float32))
  log_ratio = jnp.where(m, logp - logp_old, 0.0)
  metrics["ppo_kl"] = tok_mean(-log_ratio)
  # k3 estimate of KL(pi_old || pi) on pi_old's samples: r - 1 - log r with r = pi / pi_old.
  metrics["approx_kl"] = tok_mean(kl_k3(jnp.zeros_like(log_ratio), log_ratio))

  if cfg.entropy_coeff != 0.0:
    if entropy is None:
      raise ValueError("LossConfig.entropy_coeff is nonzero but no entropy was given")
    loss = loss - cfg.entropy_coeff * aggregate(entropy, mask, mode, norm)
  if entropy is not None:
    metrics["entropy"] = tok_mean(entropy)
  if cfg.kl_coeff > 0.0:
    if logp_ref is None:
      raise ValueError("LossConfig.kl_coeff is > 0 but no logp_ref was given")
    lp = jnp.where(m, logp, 0.0)
    kl = get_kl(cfg.kl_type)(lp, jnp.where(m, logp_ref, 0.0))
    loss = loss + cfg.kl_coeff * aggregate(kl, mask, mode, norm)
    metrics["kl_ref"] = tok_mean(kl)
  metrics.update(corr_metrics)
  if nan_free is not None:  # a NaN behaviour log-prob: the loss is NaN (the caller skips the step) in every config
    loss = jnp.where(nan_free, loss, jnp.nan)
  metrics["loss"] = loss
  return loss, metrics
