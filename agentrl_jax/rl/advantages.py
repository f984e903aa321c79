"""Group-relative advantage estimators (GRPO, Dr.GRPO, RLOO), pure functions registered by name.

Input: one scalar reward per sequence, either rewards [B] with group ids [B] (any integers; the n samples of
one prompt share an id) or rewards [G, n] (one row per group). Output: one advantage per sequence, same
shape; `broadcast_to_tokens` spreads it over the loss mask so tool-output and padding tokens get exactly 0.

Degenerate groups get advantage exactly 0 (never NaN): groups of size 1 and groups whose rewards are all
equal. (verl differs for size 1: GRPO gives r / (1 + eps) and RLOO gives r; a lone sample has no baseline,
so we give it no signal.) Rows with `valid` False (padding) are left out of every group and get 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, Shaped

AdvantageFn = Callable[..., Float[Array, "B"]]
_ESTIMATORS: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
  """Registers an estimator `fn(rewards [B], group_ids [B], valid [B], cfg) -> advantages [B]`."""

  def deco(fn: AdvantageFn) -> AdvantageFn:
    if name in _ESTIMATORS and _ESTIMATORS[name] is not fn:
      raise ValueError(f"advantage estimator {name!r} is already registered")
    _ESTIMATORS[name] = fn
    return fn

  return deco


def get_advantage(name: str) -> AdvantageFn:
  """Returns the estimator registered as `name`; raises ValueError listing the known names."""
  if name not in _ESTIMATORS:
    raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(_ESTIMATORS)}")
  return _ESTIMATORS[name]


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  """Advantage settings; defaults are the recipe's GRPO.

  Attributes:
    estimator: registered name: grpo, dr_grpo (grpo without std normalisation) or rloo.
    norm_by_std: GRPO divides (r - group mean) by (unbiased group std + epsilon); False is Dr.GRPO.
    epsilon: added to the std.
  """

  estimator: str = "grpo"
  norm_by_std: bool = True
  epsilon: float = 1e-6

  def __post_init__(self):
    if self.estimator not in _ESTIMATORS:
      raise ValueError(
          f"AdvantageConfig.estimator must be one of {sorted(_ESTIMATORS)}, got {self.estimator!r}"
      )
    if not isinstance(self.norm_by_std, bool):
      raise ValueError(f"AdvantageConfig.norm_by_std must be a bool, got {self.norm_by_std!r}")
    e = self.epsilon
    if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e) or e <= 0:
      raise ValueError(f"AdvantageConfig.epsilon must be a finite number > 0, got {e!r}")


class GroupStats(NamedTuple):
  """Statistics of each row's group, broadcast back to rows ([B] each; invalid rows see their own group).

  Attributes:
    sum: group reward sum.
    mean: group mean reward.
    std: unbiased (n - 1) group standard deviation; 0 for groups of size 1.
    count: group size (valid rows only).
    degenerate: True for groups of size < 2 or with all rewards equal (no learning signal); such groups are
      what dynamic sampling drops.
  """

  sum: Float[Array, "B"]
  mean: Float[Array, "B"]
  std: Float[Array, "B"]
  count: Float[Array, "B"]
  degenerate: Bool[Array, "B"]


def group_stats(
    rewards: Float[Array, "B"], group_ids: Int[Array, "B"], valid: Bool[Array, "B"] | None = None
) -> GroupStats:
  """Per-row statistics of its group. O(B log B); jit-compatible for arbitrary integer ids."""
  b = rewards.shape[0]
  r = rewards.astype(jnp.float32)
  valid = jnp.ones((b,), bool) if valid is None else valid.astype(bool)
  # Dense segment ids in [0, B) so that segment ops need no static number of groups.
  _, seg = jnp.unique(group_ids, return_inverse=True, size=b, fill_value=0)
  seg = seg.reshape(b)
  segsum = lambda x: jax.ops.segment_sum(x, seg, num_segments=b)[seg]  # noqa: E731
  count = segsum(valid.astype(jnp.float32))
  total = segsum(jnp.where(valid, r, 0.0))
  mean = total / jnp.maximum(count, 1.0)
  sq_dev = jnp.where(valid, jnp.square(r - mean), 0.0)
  std = jnp.sqrt(segsum(sq_dev) / jnp.maximum(count - 1.0, 1.0))
  hi = jax.ops.segment_max(jnp.where(valid, r, -jnp.inf), seg, num_segments=b)[seg]
  lo = jax.ops.segment_min(jnp.where(valid, r, jnp.inf), seg, num_segments=b)[seg]
  # Explicit equality test: float (r - mean) of equal rewards need not be exactly 0, and / (0 + eps)
  # would blow that rounding error up into a spurious advantage.
  degenerate = (count < 2) | (hi == lo)
  return GroupStats(sum=total, mean=mean, std=std, count=count, degenerate=degenerate)


@register_advantage("grpo")
def grpo_advantages(
    rewards: Float[Array, "B"], group_ids: Int[Array, "B"], valid: Bool[Array, "B"], cfg: AdvantageConfig
) -> Float[Array, "B"]:
  """GRPO: (r - group mean) / (unbiased group std + eps); without the std division if not cfg.norm_by_std."""
  s = group_stats(rewards, group_ids, valid)
  adv = rewards.astype(jnp.float32) - s.mean
  if cfg.norm_by_std:
    adv = adv / (s.std + cfg.epsilon)
  return jnp.where(s.degenerate | ~valid, 0.0, adv)


@register_advantage("dr_grpo")
def dr_grpo_advantages(
    rewards: Float[Array, "B"], group_ids: Int[Array, "B"], valid: Bool[Array, "B"], cfg: AdvantageConfig
) -> Float[Array, "B"]:
  """Dr.GRPO: r - group mean (GRPO with norm_by_std forced off)."""
  return grpo_advantages(rewards, group_ids, valid, dataclasses.replace(cfg, norm_by_std=False))


@register_advantage("rloo")
def rloo_advantages(
    rewards: Float[Array, "B"], group_ids: Int[Array, "B"], valid: Bool[Array, "B"], cfg: AdvantageConfig
) -> Float[Array, "B"]:
  """RLOO: r_i - mean of the other n - 1 rewards of the group = n / (n - 1) * (r_i - group mean)."""
  del cfg
  s = group_stats(rewards, group_ids, valid)
  r = rewards.astype(jnp.float32)
  adv = r - (s.sum - r) / jnp.maximum(s.count - 1.0, 1.0)
  return jnp.where(s.degenerate | ~valid, 0.0, adv)


def compute_advantages(
    rewards: Float[Array, "B"] | Float[Array, "G N"],
    group_ids: Int[Array, "B"] | None = None,
    cfg: AdvantageConfig = AdvantageConfig(),
    valid: Shaped[Array, "B"] | Shaped[Array, "G N"] | None = None,
) -> Float[Array, "B"] | Float[Array, "G N"]:
  """Per-sequence advantages with the estimator named in `cfg`.

  Args:
    rewards: [B] with `group_ids`, or [G, n] (row g is one group) with group_ids None.
    group_ids: [B] integer group of each sequence (e.g. prompt index); any values.
    cfg: AdvantageConfig.
    valid: optional mask of real (non-padding) sequences, same shape as rewards.

  Returns:
    float32 advantages with the shape of `rewards`; 0 for degenerate groups and invalid rows.
  """
  rewards = jnp.asarray(rewards)
  shape = rewards.shape
  if rewards.ndim == 2 and group_ids is None:
    g, n = shape
    group_ids = jnp.repeat(jnp.arange(g), n)
  elif rewards.ndim != 1 or group_ids is None or jnp.shape(group_ids) != shape:
    raise ValueError(f"need rewards [B] with group_ids [B], or rewards [G, n]; got {shape}, "
                     f"group_ids {None if group_ids is None else jnp.shape(group_ids)}")
  flat_valid = jnp.ones(rewards.size, bool) if valid is None else jnp.asarray(valid).reshape(-1) != 0
  adv = get_advantage(cfg.estimator)(rewards.reshape(-1), jnp.asarray(group_ids), flat_valid, cfg)
  return adv.reshape(shape)


def broadcast_to_tokens(advantages: Float[Array, "B"], mask: Shaped[Array, "B T"]) -> Float[Array, "B T"]:
  """Spreads per-sequence advantages over the loss mask: exactly 0 where mask is 0 (tool, prompt, pad)."""
  return jnp.where(mask != 0, advantages.astype(jnp.float32)[:, None], 0.0)
