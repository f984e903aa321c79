"""The model's hand-written backward passes give autodiff's gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import qwen


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
  for g, g_ref in zip(grads, grads_ref):
    assert g.dtype == g_ref.dtype and g.shape == g_ref.shape
    g, g_ref = np.asarray(g, np.float32), np.asarray(g_ref, np.float32)
    # rounding-level differences only: relative to the gradient's scale
    np.testing.assert_allclose(g, g_ref, rtol=0, atol=rtol * np.abs(g_ref).max())
