"""`ModelConfig.attention_impl`: the TPU splash kernel (Pallas interpret mode on CPU) and the cuDNN call against
the XLA path, with packed segments, forward and gradients, on one device and sharded over 8 fake CPU devices;
a kernel chosen on the wrong backend fails with the reason."""

import dataclasses
import re

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


def _loss_and_grads(cfg, params_seed=1, mesh=None, packed=True):
  model = testing.tiny_model(cfg, seed=params_seed)
  graphdef, params = nnx.split(model)
  tokens, segments, positions = _batch()
  if not packed:
    segments, positions = None, None

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


@pytest.fixture(scope="module")
def xla_unpacked():
  return _loss_and_grads(ModelConfig.tiny_qwen3(attention_block=64), packed=False)


def _close(got, want, tol):
  value, logits, grads = got
  np.testing.assert_allclose(value, want[0], rtol=tol)
  np.testing.assert_allclose(logits, want[1], atol=tol, rtol=0)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want[2])):
    np.testing.assert_allclose(a, b, atol=tol, rtol=0)


def test_splash_kernel_matches_xla_with_packed_segments(xla_reference):
  cfg = ModelConfig.tiny_qwen3(attention_impl="splash", attention_interpret=True)
  _close(_loss_and_grads(cfg), xla_reference, 2e-5)


def test_splash_kernel_matches_xla_on_unpacked_rows(xla_unpacked):
  """No segment ids (one sequence per row): the kernel gets one segment per row."""
  cfg = ModelConfig.tiny_qwen3(attention_impl="splash", attention_interpret=True)
  _close(_loss_and_grads(cfg, packed=False), xla_unpacked, 2e-5)


@pytest.mark.parametrize("packed", [True, False])
def test_splash_kernel_sharded_over_batch_and_kv_heads(xla_reference, xla_unpacked, packed):
  """fsdp=2 x tensor=2 (rows and kv heads split): the kernel runs per shard under shard_map."""
  cfg = ModelConfig.tiny_qwen3(attention_impl="splash", attention_interpret=True)
  mesh = sharding_lib.make_mesh(data=1, fsdp=2, tensor=2, devices=jax.devices()[:4])
  _close(_loss_and_grads(cfg, mesh=mesh, packed=packed), xla_reference if packed else xla_unpacked, 2e-5)


def _tpu_gradient_module(cfg, mesh_shape, packed):
  """The gradient of a loss through the model on 4 x 256 tokens (packed or not), exported for TPU v5e chips on an
  abstract `(data, fsdp, tensor)` mesh (StableHLO text): what the update step differentiates, lowered from this CPU
  host."""
  graphdef, params = nnx.split(nnx.eval_shape(lambda: testing.tiny_model(cfg)))
  tokens = jax.ShapeDtypeStruct((4, 256), jnp.int32)
  segments = tokens if packed else None

  def loss(params, tokens, segments):
    logits, _ = nnx.merge(graphdef, params)(tokens, segment_ids=segments)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  with jax.sharding.use_abstract_mesh(testing.tpu_mesh(mesh_shape, ("data", "fsdp", "tensor"))):
    return jax.export.export(jax.jit(jax.grad(loss)), platforms=["tpu"])(params, tokens, segments).mlir_module()


@pytest.mark.parametrize("mesh_shape", [(1, 1, 1), (1, 2, 2)])
@pytest.mark.parametrize("packed", [True, False])
def test_the_gradient_lowers_for_tpu_through_the_splash_kernels(mesh_shape, packed):
  """The real kernel (not interpret mode) on its target: the forward and both backward splash kernels are in the
  exported program, their segmented variants only for packed rows; on a 2 x 2 mesh they run per shard
  (shard_map's manual computation)."""
  cfg = ModelConfig.tiny_qwen3(head_dim=128, dtype="bfloat16", attention_impl="splash")
  text = _tpu_gradient_module(cfg, mesh_shape, packed)
  seg = "_segmented" if packed else ""
  assert testing.tpu_kernel_names(text) == {f"splash_mqa_fwd{seg}_residuals", f"splash_mqa_dq{seg}_no_residuals",
                     f"splash_mqa_dkv{seg}_no_residuals"}
  assert ("sdy.manual_computation" in text) == (mesh_shape != (1, 1, 1))


@pytest.mark.parametrize("packed", [True, False])
def test_cudnn_call_matches_xla_attention(packed):
  """The cuDNN path's call (layout, GQA, scale, cuDNN's causal mask type + the segment mask of packed rows) with
  implementation='xla', which any backend runs, against the model's own dense attention."""
  rng = np.random.default_rng(1)
  b, t, nk, g, h = 2, 32, 2, 2, 16
  qg = jnp.asarray(rng.standard_normal((b, t, nk, g, h)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, t, nk, h)), jnp.float32) for _ in range(2))
  seg = np.zeros((b, t), np.int32)
  if packed:
    seg[0, 20:] = 1
  idx = np.arange(t)
  mask = jnp.asarray((idx[None, :, None] >= idx[None, None, :]) & (seg[:, :, None] == seg[:, None, :]))
  want = attention_kernels.dense_attention(qg, k, v, mask, h ** -0.5)
  got = attention_kernels.cudnn_attention(qg, k, v, jnp.asarray(seg) if packed else None, h ** -0.5,
                                          implementation="xla")
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


@pytest.mark.parametrize("packed", [True, False])
def test_the_model_feeds_the_cudnn_path_its_segments(monkeypatch, xla_reference, xla_unpacked, packed):
  """The model's cudnn wiring, forward and gradients: packed rows pass their segment ids, unpacked rows (the RL
  update, scoring) pass none, so the call needs no mask; the call itself runs with implementation='xla'."""
  monkeypatch.setattr(attention_kernels, "check_backend", lambda *a, **k: None)
  seen = []
  call = attention_kernels.cudnn_attention
  monkeypatch.setattr(attention_kernels, "cudnn_attention",
                      lambda *a, **k: seen.append(a[3] is None) or call(*a, implementation="xla", **k))
  want = xla_reference if packed else xla_unpacked
  _close(_loss_and_grads(ModelConfig.tiny_qwen3(attention_impl="cudnn"), packed=packed), want, 2e-5)
  assert seen and set(seen) == {not packed}


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


def test_auto_is_xla_off_tpu():
  from agentrl_jax.models import loading
  from agentrl_jax.rl import recipe

  assert recipe.rl_config().model.attention_impl == "auto"
  assert loading.tokenizer_and_config(loading.model_block(size="tiny_qwen3", attention_impl="auto",
                                                          tokenizer_path=testing.tiny_tokenizer_dir()))[1].attention_impl == "xla"
  assert attention_kernels.auto_impl("gpu") == "xla" and attention_kernels.auto_impl("cpu") == "xla"


@pytest.mark.parametrize("topology", ["v5e:2x2", "v5p:2x2x1", "v6e:2x2"])
def test_the_kernels_compile_for_each_chip_and_auto_takes_what_compiles(topology, caplog):
  """Splash (forward and backward) and the ragged paged decode step compile through Mosaic for each chip (the
  real TPU compiler, from this host); `auto` takes ragged paged where it compiles and says why it refuses it
  where it does not (a head_dim the kernel cannot tile)."""
  from agentrl_jax.aot import target

  device = target.target(topology).devices[0]
  assert attention_kernels.kernel_refusal("splash", device, 128) is None
  assert attention_kernels.kernel_refusal("ragged_paged", device, 128) is None
  assert attention_kernels.auto_impl("tpu", device=device, head_dim=128) == "ragged_paged"
  with caplog.at_level("WARNING"):
    assert attention_kernels.auto_impl("tpu", device=device, head_dim=64) == "splash"
  assert "not 'ragged_paged'" in caplog.text and "multiple of 128, got 64" in caplog.text


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-2)])
def test_single_query_attention_matches_the_batched_matmuls(dtype, tol):
  """The decode step's reduction form (XLA:CPU) computes the batched-matmul form's attention: one query per row
  and head over a cache with masked (empty or foreign) slots, GQA groups of 2."""
  b, nk, g, h, s = 3, 2, 2, 16, 40
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (b, nk, g, h)).astype(dtype)
  k_t = jax.random.normal(keys[1], (b, nk, h, s)).astype(dtype)
  v = jax.random.normal(keys[2], (b, nk, s, h)).astype(dtype)
  mask = np.arange(s)[None, :] < np.array([[5], [40], [17]])  # rows hold 5, 40, 17 tokens
  mask[1, 3] = False  # a masked slot inside a row
  scale = h ** -0.5
  got = jax.jit(attention_kernels.single_query_attention, static_argnums=4)(q, k_t, v, mask, scale)
  scores = attention_kernels.bmm(q, k_t) * scale
  probs = jax.nn.softmax(jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min), -1)
  want = attention_kernels.bmm(probs, v.astype(jnp.float32))
  assert got.dtype == dtype
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), atol=tol, rtol=0)


def test_cpu_decode_compiler_options_keep_only_ynnpack_reductions():
  """The decode program's XLA:CPU options are known to this jaxlib and do what they say: dots compile to XLA's
  own kernels, reductions to YNNPACK fusions (a renamed option would fail here, not slow decode silently)."""
  def f(x, w):
    y = x @ w
    return jnp.max(y, axis=-1), jnp.sum(y, axis=-1)

  x, w = jnp.ones((16, 256)), jnp.ones((256, 1024))
  lowered = jax.jit(f).lower(x, w)
  fusion = re.compile(r"%ynn_fusion[.\d]* = .*?op_name=\"jit\(f\)/(\w+)")  # a YNNPACK fusion and its op
  ynn_ops = lambda text: {m.group(1) for m in fusion.finditer(text)}  # noqa: E731
  default = lowered.compile().as_text()  # jaxlib 0.10.2 on AVX2: dot, max and sum all YNNPACK fusions
  tuned = lowered.compile(compiler_options=attention_kernels.CPU_SAMPLER_COMPILER_OPTIONS).as_text()
  assert ynn_ops(tuned) == ynn_ops(default) - {"dot_general"}
  assert re.search(r"%dot_general[.\d]* = f32\[16,1024\]\{1,0\} dot\(", tuned)
