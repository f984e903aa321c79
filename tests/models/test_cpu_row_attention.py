"""Causal self-attention of whole rows on XLA:CPU (`cpu_kernels.causal_attention`, `cpu_attention.cc`).

It must give the dense form's outputs and gradients (`attention_kernels.causal_blocked_attention` under the
model's causal + segment mask) for every token that is not padding, with segments packed back to back, an id that
comes back after another segment, and one sequence per row (`segment_ids` None); padding (id 0 of packed rows)
outputs zeros and takes no gradient; and it is what the model's training forward takes for packed rows on one CPU
device longer than `ROW_KERNEL_MIN_LEN`, with the same logits and parameter gradients (rows of one sequence keep
the dense form)."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import attention_kernels, cpu_kernels
from agentrl_jax.models.config import ModelConfig


def _inputs(b, t, nk, g, h, seed=0):
  keys = jax.random.split(jax.random.key(seed), 4)
  return (jax.random.normal(keys[0], (b, t, nk, g, h)), jax.random.normal(keys[1], (b, t, nk, h)),
          jax.random.normal(keys[2], (b, t, nk, h)), jax.random.normal(keys[3], (b, t, nk, g, h)))


def _segments(t):
  """Row 0: three episodes back to back, then padding; row 1: ids 1, 2, 1 (the id comes back), then padding;
  row 2: one episode filling the row."""
  seg = np.zeros((3, t), np.int32)
  seg[0, :t // 3], seg[0, t // 3:2 * t // 3], seg[0, 2 * t // 3:t - t // 8] = 1, 2, 3
  seg[1, :t // 4], seg[1, t // 4:t // 2], seg[1, t // 2:t - 5] = 1, 2, 1
  seg[2] = 1
  return jnp.asarray(seg)


def _dense(q, k, v, seg, scale, block=64):
  t = q.shape[1]
  i = jnp.arange(t)
  mask = i[None, :, None] >= i[None, None, :]
  if seg is not None:
    mask = mask & (seg[:, :, None] == seg[:, None, :])
  return attention_kernels.causal_blocked_attention(q, k, v, jnp.broadcast_to(mask, (q.shape[0], t, t)), scale, block)


@pytest.fixture(autouse=True)
def _built():
  assert cpu_kernels.available(), "the CPU kernels did not build (launch/setup.sh installs g++)"


@pytest.mark.parametrize("shape", [(300, 2, 2, 16), (200, 1, 4, 8), (129, 3, 1, 64), (77, 2, 3, 5)])
def test_outputs_and_gradients_match_the_dense_form_off_padding(shape):
  t, nk, g, h = shape
  q, k, v, w = _inputs(3, t, nk, g, h)
  seg = _segments(t)
  real = (seg > 0)[:, :, None, None, None]
  w = w * real  # a loss that reads no padding, as every loss of the project
  scale = h ** -0.5

  def loss(fn):
    return lambda q, k, v: (fn(q, k, v) * w).sum()

  kernel = lambda q, k, v: cpu_kernels.causal_attention(q, k, v, seg, scale)  # noqa: E731
  dense = lambda q, k, v: _dense(q, k, v, seg, scale)  # noqa: E731
  got, want = jax.jit(kernel)(q, k, v), dense(q, k, v)
  np.testing.assert_allclose(np.asarray(got * real), np.asarray(want * real), rtol=1e-5, atol=2e-6)
  assert not np.asarray(got * ~real).any(), "padding must output zeros"
  g_got = jax.jit(jax.grad(loss(kernel), argnums=(0, 1, 2)))(q, k, v)
  g_want = jax.jit(jax.grad(loss(dense), argnums=(0, 1, 2)))(q, k, v)
  for name, a, b in zip("qkv", g_got, g_want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5, err_msg=f"d{name}")
  assert not np.asarray(g_got[0] * ~real).any(), "padding queries take no gradient"


def test_one_sequence_per_row_is_plain_causal_attention_everywhere():
  q, k, v, w = _inputs(2, 270, 2, 2, 8, seed=1)
  got = jax.jit(lambda *a: cpu_kernels.causal_attention(*a, None, 0.4))(q, k, v)
  np.testing.assert_allclose(np.asarray(got), np.asarray(_dense(q, k, v, None, 0.4)), rtol=1e-5, atol=2e-6)
  g_got = jax.grad(lambda *a: (cpu_kernels.causal_attention(*a, None, 0.4) * w).sum(), argnums=(0, 1, 2))(q, k, v)
  g_want = jax.grad(lambda *a: (_dense(*a, None, 0.4) * w).sum(), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(g_got, g_want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)


def test_only_on_one_cpu_device_in_float32_past_the_minimum_length():
  n = attention_kernels.ROW_KERNEL_MIN_LEN
  assert attention_kernels.row_attention_kernel(jnp.float32, n + 1)
  assert not attention_kernels.row_attention_kernel(jnp.float32, n)
  assert not attention_kernels.row_attention_kernel(jnp.bfloat16, n + 1)
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((2,), ("data",))):
    assert not attention_kernels.row_attention_kernel(jnp.float32, n + 1)


def test_the_models_packed_forward_and_gradients_match_the_dense_form(monkeypatch):
  """The model on packed rows of 320 tokens (over the minimum) with the kernel, then with it turned off: the
  logits of every real token and the parameter gradients of a loss over them agree."""
  model = testing.tiny_model(ModelConfig.tiny_qwen3(attention_block=128))
  t = 320
  seg = _segments(t)
  tokens = testing.random_tokens(jax.random.key(3), 3, t, model.cfg.vocab_size)
  starts = jnp.concatenate([jnp.ones((3, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  idx = jnp.broadcast_to(jnp.arange(t), (3, t))
  positions = idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)  # restarting at each segment
  real = (seg > 0)[..., None]
  graphdef, params = nnx.split(model)

  def loss(p):
    logits, _ = nnx.merge(graphdef, p)(tokens, positions=positions, segment_ids=seg)
    return (jax.nn.log_softmax(logits)[..., 0] * real[..., 0]).sum(), logits

  calls = []
  kernel = cpu_kernels.causal_attention
  monkeypatch.setattr(cpu_kernels, "causal_attention", lambda *a: calls.append(1) or kernel(*a))
  (_, got), g_got = jax.value_and_grad(loss, has_aux=True)(params)
  assert calls, "the model's forward did not take the kernel"
  calls.clear()
  model(tokens)  # rows of one sequence: the dense form
  assert not calls, "rows of one sequence must keep the dense form"
  monkeypatch.setattr(attention_kernels, "row_attention_kernel", lambda *a: False)
  (_, want), g_want = jax.value_and_grad(loss, has_aux=True)(params)
  np.testing.assert_allclose(np.asarray(got * real), np.asarray(want * real), rtol=1e-4, atol=1e-5)
  for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
