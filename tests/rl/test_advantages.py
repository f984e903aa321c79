"""GRPO / Dr.GRPO / RLOO advantages on hand-computed groups; degenerate groups; token broadcast."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.rl import advantages as A

GRPO = A.AdvantageConfig()
DR_GRPO = A.AdvantageConfig(norm_by_std=False)
RLOO = A.AdvantageConfig("rloo")
compute = jax.jit(A.compute_advantages, static_argnames="cfg")  # one compile per shape, not per op


def test_grpo_hand_computed():
  # group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3)
  want = 0.5 / (math.sqrt(1 / 3) + 1e-6)
  adv = compute(jnp.array([[1.0, 0.0, 0.0, 1.0], [2.0, 4.0, 6.0, 0.0]]), cfg=GRPO)
  np.testing.assert_allclose(adv[0], [want, -want, -want, want], rtol=1e-6)
  r = np.array([2.0, 4.0, 6.0, 0.0])
  np.testing.assert_allclose(adv[1], (r - 3.0) / (np.std(r, ddof=1) + 1e-6), rtol=1e-6)


def test_dr_grpo_has_no_std_division():
  rewards = jnp.array([[1.0, 0.0, 0.0, 0.0]])
  np.testing.assert_allclose(compute(rewards, cfg=DR_GRPO)[0], [0.75, -0.25, -0.25, -0.25])
  np.testing.assert_array_equal(compute(rewards, cfg=A.AdvantageConfig("dr_grpo")),
                                compute(rewards, cfg=DR_GRPO))


def test_rloo_hand_computed():
  # r_i - mean of the others: 1 - (0 + 1) / 2, 0 - (1 + 1) / 2, ...
  adv = compute(jnp.array([1.0, 0.0, 1.0, 5.0, 3.0]), jnp.array([7, 7, 7, 2, 2]), cfg=RLOO)
  np.testing.assert_allclose(adv, [0.5, -1.0, 0.5, 2.0, -2.0], rtol=1e-6)


@pytest.mark.parametrize("cfg", [GRPO, DR_GRPO, RLOO], ids=["grpo", "dr_grpo", "rloo"])
def test_degenerate_groups_get_exactly_zero(cfg):
  rewards = jnp.array([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 3.0, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
  ids = jnp.array([0] * 3 + [1] * 7 + [2] + [3] * 5)  # all-equal groups and a group of size 1
  adv = compute(rewards, ids, cfg=cfg)
  assert bool(jnp.all(jnp.isfinite(adv)))
  np.testing.assert_array_equal(adv, 0.0)
  s = jax.jit(A.group_stats)(rewards, ids)
  assert bool(jnp.all(s.degenerate)) and float(s.std[10]) == 0.0 and float(s.count[10]) == 1.0


def test_flat_ids_match_grouped_layout_and_ids_are_arbitrary():
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 3, size=(5, 4)).astype(np.float32)
  rewards[2] = 1.0  # one degenerate group
  grouped = compute(rewards, cfg=GRPO)
  perm = rng.permutation(20)
  ids = np.array([1000, -5, 3, 42, 7])[np.repeat(np.arange(5), 4)]
  flat = compute(rewards.reshape(-1)[perm], ids[perm], cfg=GRPO)
  np.testing.assert_allclose(flat, np.asarray(grouped).reshape(-1)[perm], rtol=1e-6)
  for g in range(5):  # the reference definition, per group, in numpy
    r = rewards[g]
    want = 0.0 * r if r.min() == r.max() else (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(grouped[g], want, rtol=1e-5, atol=1e-7)


def test_invalid_rows_are_left_out():
  rewards = jnp.array([[1.0, 0.0, 99.0], [1.0, 99.0, 99.0]])
  valid = jnp.array([[1, 1, 0], [1, 0, 0]])
  adv = compute(rewards, cfg=DR_GRPO, valid=valid)
  np.testing.assert_array_equal(adv, [[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]])  # 2nd group: one valid sample


def test_jit_and_broadcast_to_tokens():
  adv = compute(jnp.array([1.0, 0.0, 1.0, 0.0]), jnp.array([0, 0, 1, 1]), cfg=DR_GRPO)
  np.testing.assert_allclose(adv, [0.5, -0.5, 0.5, -0.5])
  mask = jnp.array([[1, 1, 0, 0, 1], [1, 0, 0, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])  # 0: tool / pad
  tok = A.broadcast_to_tokens(adv, mask)
  assert tok.shape == (4, 5) and tok.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(tok)[np.asarray(mask) == 0], 0.0)
  np.testing.assert_array_equal(tok[0], [0.5, 0.5, 0.0, 0.0, 0.5])


def test_bad_inputs_and_config():
  with pytest.raises(ValueError, match="group_ids"):
    A.compute_advantages(jnp.zeros((4,)))
  with pytest.raises(ValueError, match="AdvantageConfig.estimator"):
    A.AdvantageConfig("ppo")
  with pytest.raises(ValueError, match="AdvantageConfig.epsilon"):
    A.AdvantageConfig(epsilon=0.0)
  with pytest.raises(ValueError, match="AdvantageConfig.norm_by_std"):
    A.AdvantageConfig(norm_by_std=1)
  with pytest.raises(ValueError, match="unknown advantage estimator"):
    A.get_advantage("gae")
