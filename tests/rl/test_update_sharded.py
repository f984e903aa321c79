"""The update step on 8 fake CPU devices (fsdp=4 x tensor=2) equals the single-device step; the qwen3_4b
update step and log-prob pass lower (AOT, abstract shapes, no compile) on the same mesh, and the update step
exports for a TPU slice of that shape through the splash kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax import train_state as train_state_lib
from agentrl_jax.models import sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import losses
from agentrl_jax.rl import update as update_lib

B, T = 8, 32


def _batch(cfg, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  for i in range(B):
    mask[i, 6:T - i] = 1
    mask[i, 12:15] = 0  # tool output
  return {"tokens": tokens, "loss_mask": mask, "advantages": rng.standard_normal(B).astype(np.float32),
          "old_logp": (-6.0 + 0.5 * rng.standard_normal((B, T))).astype(np.float32)}


def _run(mesh, cfg, opt_cfg, loss_cfg, batches):
  graphdef, state = train_state_lib.init_train_state(testing.tiny_model(cfg, seed=2), opt_cfg, mesh)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, loss_cfg, opt_cfg, mesh, micro_batch_size=4,
                                     logits_chunk_size=16)
  logprobs = update_lib.make_logprobs_fn(graphdef, shardings.params, mesh, micro_batch_size=4)
  metrics, lps = [], []
  for batch in batches:
    lps.append(np.asarray(logprobs(state.params, {"tokens": batch["tokens"]})))
    state, m = update(state, batch, jax.random.key(0))
    metrics.append({k: float(v) for k, v in m.items()})
  return state, metrics, lps


def test_sharded_update_matches_single_device():
  assert len(jax.devices()) == 8, "conftest sets 8 fake CPU devices"
  cfg = ModelConfig.tiny_qwen3(remat=True)  # exercises nnx.remat inside the micro-batch loops too
  opt_cfg = train_state_lib.OptimizerConfig(learning_rate=1e-3, weight_decay=0.01)
  loss_cfg = losses.LossConfig()
  batches = [_batch(cfg, 0), _batch(cfg, 1)]
  single = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  s1, m1, lp1 = _run(single, cfg, opt_cfg, loss_cfg, batches)
  s8, m8, lp8 = _run(mesh, cfg, opt_cfg, loss_cfg, batches)

  # Params and both Adam moments really are sharded over all 8 devices, as the rules table says.
  q = s8.params["layers"]["attn"]["q_dnh"].get_value()
  assert q.sharding.spec == jax.P(None, "fsdp", "tensor", None) and len(q.sharding.device_set) == 8
  mu = s8.opt_state[0].mu["layers"]["attn"]["q_dnh"].get_value()
  assert mu.sharding.spec == q.sharding.spec
  assert s8.params["embed_vd"].get_value().sharding.spec == jax.P("tensor", "fsdp")

  for a, b in zip(lp1, lp8):
    assert float(np.max(np.abs(a - b))) <= 1e-5
  for a, b in zip(m1, m8):
    assert a.keys() == b.keys()
    for k in a:
      assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-5), k
  assert m1[1]["clip_frac"] > 0 and m1[0]["skipped"] == 0
  h1, h8 = jax.device_get(s1), jax.device_get(s8)
  diffs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(jax.tree.leaves(h1),
                                                                                jax.tree.leaves(h8))]
  assert max(diffs) <= 1e-5, max(diffs)


def _qwen3_4b_batch(mesh):
  """Abstract inputs of one recipe-sized update step: 16 sequences of 8192 tokens, sharded as the trainer's
  batches, and the step's key."""
  bs = update_lib.batch_sharding(mesh)
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=bs)  # noqa: E731
  b, t = 16, 8192
  batch = {"tokens": spec((b, t), jnp.int32), "loss_mask": spec((b, t), jnp.bool_),
           "advantages": spec((b,), jnp.float32), "old_logp": spec((b, t), jnp.float32)}
  return batch, jax.ShapeDtypeStruct((), jax.random.key(0).dtype)


def test_qwen3_4b_update_lowers_on_fsdp_tensor_mesh():
  """AOT lowering only (no compile, no memory): bf16 params, per-layer remat, 4 sequences of 8192 tokens per
  micro-batch (one per fsdp shard), 16 per mini-batch, on data=1 x fsdp=4 x tensor=2."""
  cfg = ModelConfig.qwen3_4b(param_dtype="bfloat16", dtype="bfloat16", remat=True)
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  opt_cfg = train_state_lib.OptimizerConfig()
  graphdef, abstract = train_state_lib.abstract_train_state(cfg, opt_cfg, mesh)
  assert abstract.params["layers"]["mlp"]["gate_df"].get_value().sharding.spec == jax.P(None, "fsdp", "tensor")
  shardings = train_state_lib.train_state_shardings(abstract, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, losses.LossConfig(), opt_cfg, mesh, micro_batch_size=4,
                                     logits_chunk_size=1024)
  batch, rng = _qwen3_4b_batch(mesh)
  b, t = batch["tokens"].shape
  lowered = update.lower(abstract, batch, rng)
  text = lowered.as_text()
  assert '{"fsdp"}, {"tensor"}' in text  # e.g. gate_df [D, F] -> (fsdp, tensor)
  # Donation: the params and Adam moments alias the outputs (updated in place).
  assert text.count("tf.aliasing_output") == len(jax.tree.leaves(abstract))
  out_state, metrics = jax.eval_shape(update, abstract, batch, rng)
  # The state keeps its dtypes (bf16 params and moments): the next step reuses the same executable.
  assert [a.dtype for a in jax.tree.leaves(out_state)] == [a.dtype for a in jax.tree.leaves(abstract)]
  assert set(metrics) >= {"loss", "pg_loss", "clip_frac_high", "clip_frac_low", "clip_frac_dual", "entropy",
                          "approx_kl", "grad_norm", "skipped", "tokens"}

  logprobs = update_lib.make_logprobs_fn(graphdef, shardings.params, mesh, micro_batch_size=8)
  lowered = logprobs.lower(abstract.params, {"tokens": batch["tokens"]})
  assert lowered.out_info.shape == (b, t)


def test_qwen3_4b_update_exports_for_a_tpu_slice_through_splash():
  """The recipe's update step as a TPU run builds it (Qwen3-4B, bf16, remat, splash attention, 16 x 8192 tokens
  on fsdp=4 x tensor=2 TPU v5e chips), exported from this CPU host: it traces and lowers through the real splash
  kernels (the non-segmented ones: RL rows are one sequence each), run per shard."""
  cfg = ModelConfig.qwen3_4b(param_dtype="bfloat16", dtype="bfloat16", remat=True, attention_impl="splash")
  mesh = testing.tpu_mesh((1, 4, 2), ("data", "fsdp", "tensor"))
  opt_cfg = train_state_lib.OptimizerConfig()
  with jax.sharding.use_abstract_mesh(mesh):
    graphdef, abstract = train_state_lib.abstract_train_state(cfg, opt_cfg, mesh)
    update = update_lib.make_update_fn(graphdef, train_state_lib.train_state_shardings(abstract, mesh), losses.LossConfig(),
                                       opt_cfg, mesh, micro_batch_size=4, logits_chunk_size=1024)
    batch, rng = _qwen3_4b_batch(mesh)
    text = jax.export.export(update, platforms=["tpu"])(abstract, batch, rng).mlir_module()
  assert testing.tpu_kernel_names(text) == {
      "splash_mqa_fwd_residuals", "splash_mqa_dq_no_residuals", "splash_mqa_dkv_no_residuals"}
  assert "sdy.manual_computation" in text
