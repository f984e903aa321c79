"""The hand-written backward passes of the model (SwiGLU MLP, dense attention) give autodiff's gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import attention_kernels, qwen


def _assert_grads_close(grads, grads_ref, rtol):
  """Same dtypes and shapes; values equal up to rounding, relative to each gradient's scale."""
  for g, g_ref in zip(grads, grads_ref, strict=True):
    assert g.dtype == g_ref.dtype and g.shape == g_ref.shape
    g, g_ref = np.asarray(g, np.float32), np.asarray(g_ref, np.float32)
    np.testing.assert_allclose(g, g_ref, rtol=0, atol=rtol * np.abs(g_ref).max())


def _plain_swiglu(x, gate, up, down):
  return jnp.einsum("BTF,FD->BTD", jax.nn.silu(jnp.einsum("BTD,DF->BTF", x, gate)) * jnp.einsum("BTD,DF->BTF", x, up),
                    down)


def _args(dtype, b=2, t=24, d=32, f=48):
  ks = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(ks[0], (b, t, d))
  w = [0.2 * jax.random.normal(k, s) for k, s in zip(ks[1:4], [(d, f), (d, f), (f, d)])]
  target = jax.random.normal(ks[4], (b, t, d))
  return [a.astype(dtype) for a in (x, *w)], target


@pytest.mark.parametrize("dtype, rtol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-2)])
def test_swiglu_gradients_match_autodiff(dtype, rtol):
  args, target = _args(dtype)
  loss = lambda fn: lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * target)  # noqa: E731
  value, grads = jax.value_and_grad(loss(qwen.swiglu), argnums=(0, 1, 2, 3))(*args)
  value_ref, grads_ref = jax.value_and_grad(loss(_plain_swiglu), argnums=(0, 1, 2, 3))(*args)
  assert float(value) == float(value_ref)  # the same forward computation
  _assert_grads_close(grads, grads_ref, rtol)


def _plain_attention(qg, k, v, mask, scale):
  scores = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  return jnp.einsum("BKGTS,BSKH->BTKGH", jax.nn.softmax(scores, axis=-1).astype(qg.dtype), v)


@pytest.mark.parametrize("dtype, rtol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-2)])
def test_dense_attention_gradients_match_autodiff(dtype, rtol):
  """Causal attention within packed segments (row 0: two segments; row 1: one segment and padding), queries
  of a block that starts past the first key (T < S, as the blocked path calls it)."""
  b, t, s, nk, g, h = 2, 12, 20, 2, 3, 8
  ks = jax.random.split(jax.random.key(1), 4)
  qg = jax.random.normal(ks[0], (b, t, nk, g, h)).astype(dtype)
  k, v = (jax.random.normal(kk, (b, s, nk, h)).astype(dtype) for kk in ks[1:3])
  target = jax.random.normal(ks[3], (b, t, nk, g, h))
  seg = jnp.asarray([[0] * 9 + [1] * 11, [0] * 15 + [2] * 5])  # [B, S]; row 1's last 5 keys are padding
  q_pos = jnp.arange(s - t, s)
  mask = (q_pos[None, :, None] >= jnp.arange(s)[None, None, :]) & (seg[:, s - t:, None] == seg[:, None, :])
  loss = lambda fn: lambda q, kk, vv: jnp.sum(fn(q, kk, vv, mask, h ** -0.5).astype(jnp.float32) * target)  # noqa
  value, grads = jax.value_and_grad(loss(attention_kernels.dense_attention), argnums=(0, 1, 2))(qg, k, v)
  value_ref, grads_ref = jax.value_and_grad(loss(_plain_attention), argnums=(0, 1, 2))(qg, k, v)
  assert float(value) == float(value_ref)
  _assert_grads_close(grads, grads_ref, rtol)
