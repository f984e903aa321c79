"""`ModelConfig.attention_impl`: the TPU splash kernel (Pallas interpret mode on CPU) and the cuDNN call against
the XLA path, with packed segments, forward and gradients, on one device and sharded over 8 fake CPU devices;
a kernel chosen on the wrong backend fails with the reason."""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import attention_kernels
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig

B, T = 2, 256


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 512, (B, T)).astype(np.int32)
  segments = np.zeros((B, T), np.int32)
  segments[0, 100:] = 1  # row 0 packs two sequences; row 1 is one sequence
  positions = np.concatenate([np.arange(100), np.arange(T - 100)])[None].repeat(B, 0).astype(np.int32)
  positions[1] = np.arange(T)
  return tokens, segments, positions


def _loss_and_grads(cfg, params_seed=1, mesh=None):
  model = testing.tiny_model(cfg, seed=params_seed)
  graphdef, params = nnx.split(model)
  tokens, segments, positions = _batch()

  def loss(params):
    logits, _ = nnx.merge(graphdef, params)(tokens, positions=positions, segment_ids=segments)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits

  fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
  if mesh is None:
    (value, logits), grads = fn(params)
  else:
    with jax.set_mesh(mesh):
      params = jax.device_put(params, sharding_lib.state_shardings(params, mesh))
      (value, logits), grads = fn(params)
  return float(value), np.asarray(logits), jax.tree.map(np.asarray, grads)


@pytest.fixture(scope="module")
def xla_reference():
  return _loss_and_grads(ModelConfig.tiny_qwen3(attention_block=64))


def _close(got, want, tol):
  value, logits, grads = got
  np.testing.assert_allclose(value, want[0], rtol=tol)
  np.testing.assert_allclose(logits, want[1], atol=tol, rtol=0)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want[2])):
    np.testing.assert_allclose(a, b, atol=tol, rtol=0)


def test_splash_kernel_matches_xla_with_packed_segments(xla_reference):
  cfg = ModelConfig.tiny_qwen3(attention_impl="splash", attention_interpret=True)
  _close(_loss_and_grads(cfg), xla_reference, 2e-5)


def test_splash_kernel_sharded_over_batch_and_kv_heads(xla_reference):
  """fsdp=2 x tensor=2 (rows and kv heads split): the kernel runs per shard under shard_map."""
  cfg = ModelConfig.tiny_qwen3(attention_impl="splash", attention_interpret=True)
  mesh = sharding_lib.make_mesh(data=1, fsdp=2, tensor=2, devices=jax.devices()[:4])
  _close(_loss_and_grads(cfg, mesh=mesh), xla_reference, 2e-5)


def test_cudnn_call_matches_xla_attention():
  """The cuDNN path's call (layout, GQA, scale, causal + segment mask) with implementation='xla', which any
  backend runs, against the model's own dense attention."""
  rng = np.random.default_rng(1)
  b, t, nk, g, h = 2, 32, 2, 2, 16
  qg = jnp.asarray(rng.standard_normal((b, t, nk, g, h)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, t, nk, h)), jnp.float32) for _ in range(2))
  seg = np.zeros((b, t), np.int32)
  seg[0, 20:] = 1
  idx = np.arange(t)
  mask = jnp.asarray((idx[None, :, None] >= idx[None, None, :]) & (seg[:, :, None] == seg[:, None, :]))
  want = attention_kernels.dense_attention(qg, k, v, mask, h ** -0.5)
  got = attention_kernels.cudnn_attention(qg, k, v, mask, h ** -0.5, implementation="xla")
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


@pytest.mark.parametrize("impl", ["splash", "cudnn"])
def test_a_kernel_on_the_wrong_backend_fails_with_the_reason(impl):
  cfg = ModelConfig.tiny_qwen3(attention_impl=impl)
  model = testing.tiny_model(cfg)
  with pytest.raises(ValueError, match=f"attention_impl='{impl}' runs on .* backend is 'cpu'"):
    model(jnp.zeros((1, 128), jnp.int32))
  with pytest.raises(ValueError, match="attention_impl"):
    dataclasses.replace(cfg, attention_impl="flash")


def test_splash_needs_a_length_its_blocks_divide():
  with pytest.raises(ValueError, match="multiple of 128"):
    attention_kernels.splash_block(200)
  assert [attention_kernels.splash_block(t) for t in (128, 256, 1280, 2048)] == [128, 256, 256, 512]


def test_auto_chooses_splash_on_tpu_only(monkeypatch):
  from agentrl_jax.models import loading
  from agentrl_jax.rl import recipe

  assert recipe.rl_config().model.attention_impl == "auto"
  assert loading.tokenizer_and_config(loading.model_block(size="tiny_qwen3", attention_impl="auto",
                                                          tokenizer_path=testing.tiny_tokenizer_dir()))[1].attention_impl == "xla"
  for backend, want in (("tpu", "splash"), ("gpu", "xla"), ("cpu", "xla")):
    monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
    assert attention_kernels.auto_impl() == want
