"""Context parallelism (`models/context_parallel.py`) on 8 fake CPU devices: the load-balanced layout, the rules
table's `context` axis, and the model with each row's tokens split over it (all-gather and Ulysses, XLA and
splash in interpret mode, packed rows, remat) against the unsharded model: logits, loss and gradients to float32
rounding. The TPU lowering and compile of the context-parallel splash kernels are tested at the end."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import context_parallel
from agentrl_jax.models import sharding
from agentrl_jax.models.config import ModelConfig


def test_layout_puts_chunks_i_and_2n_minus_1_minus_i_on_device_i():
  # T = 16 over N = 2 devices: 4 chunks of 4; device 0 holds chunks 0 and 3, device 1 chunks 1 and 2.
  order = context_parallel.layout_order(16, 2)
  assert order.tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
  assert context_parallel.layout_order(16, 2, load_balance=False).tolist() == list(range(16))
  # Every device attends over the same number of causal (query, key) pairs.
  for n in (2, 4):
    per_device = (context_parallel.layout_order(64, n) + 1).reshape(n, -1).sum(axis=1)
    assert len(set(per_device.tolist())) == 1, per_device
  layout = context_parallel.Layout(shards=4, t=32, load_balance=True, strategy="all_gather")
  x = jnp.arange(2 * 32 * 3).reshape(2, 32, 3)
  laid = context_parallel.to_layout(x, layout)
  np.testing.assert_array_equal(laid[0, :, 0] // 3, layout.order())
  np.testing.assert_array_equal(context_parallel.from_layout(laid, layout), x)


def test_rules_split_tokens_over_context_and_rows_over_it_in_the_cache_passes():
  mesh = sharding.make_mesh(data=1, fsdp=2, context=2, tensor=2)
  assert mesh.axis_names == ("data", "fsdp", "context", "tensor")
  assert sharding.logical_to_spec(("batch", "seq", "act_embed"), (4, 32, 64), mesh) == jax.P("fsdp", "context", None)
  # Parameters: sharded over context as over fsdp.
  assert sharding.logical_to_spec(("embed", "heads", "head_dim"), (64, 4, 16), mesh) == jax.P(
      ("fsdp", "context"), "tensor", None)
  # A row the axis does not divide (a decode step's one token) stays whole.
  assert sharding.logical_to_spec(("batch", "seq"), (4, 1), mesh) == jax.P("fsdp", None)
  # The rollout's cache rows, and the activations of the passes over it, put rows over context instead.
  assert sharding.logical_to_spec(("cache_batch",), (8,), mesh) == jax.P(("fsdp", "context"))
  with sharding.rows_layout():
    assert sharding.logical_to_spec(("batch", "seq"), (8, 64), mesh) == jax.P(("fsdp", "context"), None)
  assert sharding.logical_to_spec(("batch", "seq"), (8, 64), mesh) == jax.P("fsdp", "context")


def _packed_batch(b, t, vocab, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (b, t)).astype(np.int32)
  seg = np.ones((b, t), np.int32)
  seg[0, t // 3:] = 2  # row 0: two sequences; row 1: three; the rest: one
  seg[1, 5:t // 2], seg[1, t // 2:] = 2, 3
  pos = np.zeros((b, t), np.int32)
  for r in range(b):
    for s in np.unique(seg[r]):
      idx = np.flatnonzero(seg[r] == s)
      pos[r, idx] = np.arange(len(idx))
  return tokens, pos, seg


def _loss_grads(cfg, state, graphdef, batch, mesh=None):
  tokens, pos, seg = batch
  weights = jnp.arange(tokens.shape[1], dtype=jnp.float32)  # every position's logits count differently

  def loss(state):
    logits = nnx.merge(graphdef, state)(tokens, positions=pos, segment_ids=seg)[0]
    return jnp.sum(jax.nn.log_softmax(logits)[..., 3] * weights) / weights.sum(), logits

  fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
  if mesh is None:
    (value, logits), grads = fn(state)
  else:
    with jax.set_mesh(mesh):
      (value, logits), grads = fn(jax.device_put(state, sharding.state_shardings(state, mesh)))
  return float(value), np.asarray(logits), [np.asarray(g) for g in jax.tree.leaves(grads)]


CASES = [  # (strategy, kernel, load balance, mesh (data, fsdp, context, tensor))
    ("all_gather", "xla", True, (1, 2, 2, 2)),
    ("all_gather", "xla", False, (1, 2, 2, 2)),
    ("all_gather", "xla", True, (1, 1, 8, 1)),
    ("ulysses", "xla", True, (1, 4, 2, 1)),
    ("all_gather", "splash", True, (1, 2, 2, 2)),
    pytest.param("ulysses", "splash", True, (1, 4, 2, 1), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("strategy,impl,balance,mesh_shape", CASES)
def test_context_parallel_model_matches_the_unsharded_model(strategy, impl, balance, mesh_shape):
  """Packed rows (positions and segment ids), remat, GQA: the loss, every logit and every parameter gradient of
  the model with each row's tokens split over the context axis equal one device's to float32 rounding."""
  assert len(jax.devices()) == 8, "conftest sets 8 fake CPU devices"
  t = 256 if impl == "splash" else 64  # splash blocks are 128 tokens, each device's share a whole number of them
  cfg = ModelConfig.tiny_qwen3(remat=True, attention_block=16, context_strategy=strategy, context_load_balance=balance,
                               attention_impl=impl, attention_interpret=impl == "splash")
  graphdef, state = nnx.split(testing.tiny_model(cfg, seed=4))
  batch = _packed_batch(4, t, cfg.vocab_size)
  want = _loss_grads(cfg, state, graphdef, batch)
  d, f, c, tp = mesh_shape
  mesh = sharding.make_mesh(data=d, fsdp=f, context=c, tensor=tp)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    assert context_parallel.layout_for(t, cfg) == context_parallel.Layout(c, t, balance, strategy)
  got = _loss_grads(cfg, state, graphdef, batch, mesh)
  assert got[0] == pytest.approx(want[0], rel=2e-6)
  np.testing.assert_allclose(got[1], want[1], atol=2e-5, rtol=0)
  for a, b in zip(got[2], want[2]):
    np.testing.assert_allclose(a, b, atol=2e-6 * max(float(np.max(np.abs(b))), 1e-3), rtol=0)


def test_callers_may_work_in_the_layout():
  """`in_context_layout=True`: inputs already laid out give the laid-out hidden states (what `rl.update`'s
  log-prob pass uses, putting back only the [B, T] results)."""
  cfg = ModelConfig.tiny_qwen3()
  model = testing.tiny_model(cfg, seed=1)
  tokens, pos, seg = _packed_batch(2, 32, cfg.vocab_size)
  mesh = sharding.make_mesh(data=1, fsdp=1, context=2, tensor=1, devices=jax.devices()[:2])
  graphdef, state = nnx.split(model)

  def both(state):
    m = nnx.merge(graphdef, state)
    natural = m(tokens, positions=pos, segment_ids=seg, return_hidden=True)[0]
    layout = context_parallel.layout_for(32, cfg)
    lay = lambda x: context_parallel.to_layout(jnp.asarray(x), layout)  # noqa: E731
    laid = m(lay(tokens), positions=lay(pos), segment_ids=lay(seg), return_hidden=True, in_context_layout=True)[0]
    return natural, context_parallel.from_layout(laid, layout)

  with jax.set_mesh(mesh):
    natural, laid_back = jax.jit(both)(state)
  np.testing.assert_allclose(laid_back, natural, atol=1e-6, rtol=0)
  with pytest.raises(ValueError, match="needs the positions"), jax.set_mesh(mesh):
    jax.jit(lambda s: nnx.merge(graphdef, s)(tokens, in_context_layout=True))(state)


def test_ulysses_is_bounded_by_the_kv_heads():
  cfg = ModelConfig.tiny_qwen3(context_strategy="ulysses")  # 2 kv heads
  graphdef, state = nnx.split(testing.tiny_model(cfg))
  mesh = sharding.make_mesh(data=1, fsdp=1, context=4, tensor=1, devices=jax.devices()[:4])
  with pytest.raises(ValueError, match="4 context shards must divide the 2 kv heads"), jax.set_mesh(mesh):
    jax.jit(lambda s: nnx.merge(graphdef, s)(jnp.zeros((1, 64), jnp.int32)))(state)
  with pytest.raises(ValueError, match="context_strategy"):
    ModelConfig.tiny_qwen3(context_strategy="ring")


def _tpu_gradient_module(cfg, mesh_shape, t=1024):
  """The gradient of a loss through the model on 4 packed rows of `t` tokens, exported for TPU v5e chips on an
  abstract (data, fsdp, context, tensor) mesh (StableHLO text)."""
  graphdef, params = nnx.split(nnx.eval_shape(lambda: testing.tiny_model(cfg)))
  tokens = jax.ShapeDtypeStruct((4, t), jnp.int32)

  def loss(params, tokens, segments):
    logits, _ = nnx.merge(graphdef, params)(tokens, positions=segments, segment_ids=segments)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  with jax.sharding.use_abstract_mesh(testing.tpu_mesh(mesh_shape, sharding.MESH_AXES)):
    return jax.export.export(jax.jit(jax.grad(loss)), platforms=["tpu"])(params, tokens, tokens).mlir_module()


@pytest.mark.parametrize("strategy", ["all_gather", "ulysses"])
def test_the_context_parallel_gradient_lowers_for_tpu_through_the_splash_kernels(strategy):
  """The real kernels (not interpret mode), per device under shard_map, with the keys gathered over the context
  axis (all-gather) or exchanged for kv heads (all-to-all)."""
  cfg = ModelConfig.tiny_qwen3(head_dim=128, dtype="bfloat16", attention_impl="splash", context_strategy=strategy)
  text = _tpu_gradient_module(cfg, (1, 1, 2, 1))
  assert testing.tpu_kernel_names(text) == {"splash_mqa_fwd_segmented_residuals",
                                            "splash_mqa_dq_segmented_no_residuals",
                                            "splash_mqa_dkv_segmented_no_residuals"}
  assert "sdy.manual_computation" in text
  assert "all_gather" in text  # the keys and values (all-gather), or the kv segment ids (Ulysses)
  assert ("all_to_all" in text) == (strategy == "ulysses")
