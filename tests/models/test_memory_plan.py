"""The memory plan's exact parts (parameters under the sharding rules, the KV cache) equal the bytes one device
holds of the real sharded arrays on 8 fake CPU devices; slices parse; the CLI prints one JSON line."""

import json

import jax
from flax import nnx
import pytest

from agentrl_jax.models import kv_cache, loading, memory_plan
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig


def _shard_bytes(arrays):
  return sum(a.addressable_shards[0].data.nbytes for a in arrays)


@pytest.mark.parametrize("data,fsdp,context,tensor", [(1, 8, 1, 1), (1, 4, 1, 2), (2, 2, 1, 2), (1, 2, 2, 2)])
def test_param_and_cache_bytes_equal_the_sharded_arrays(data, fsdp, context, tensor):
  cfg = ModelConfig.tiny_qwen3(vocab_size=512, dtype="bfloat16", num_heads=4, num_kv_heads=2)
  mesh = sharding_lib.make_mesh(data, fsdp, tensor, context=context)
  shape = {"data": data, "fsdp": fsdp, "context": context, "tensor": tensor}
  model = loading.init_model(cfg, jax.random.key(0), mesh)
  assert memory_plan.param_bytes(cfg, shape) == _shard_bytes(jax.tree.leaves(nnx.state(model)))
  with jax.set_mesh(mesh):
    cache = jax.jit(lambda: kv_cache.KVCache.init(cfg, batch=16, max_len=64))()
  assert memory_plan.kv_cache_bytes(cfg, 16, 64, shape) == _shard_bytes([cache.k, cache.v])


def test_plan_of_qwen3_4b_on_a_slice():
  assert memory_plan.parse_slice("v5p-16") == (8, 95 << 30)
  assert memory_plan.parse_slice("v4-32") == (16, 32 << 30)
  assert memory_plan.parse_slice("v6e-8") == (8, 32 << 30)
  with pytest.raises(ValueError, match="unknown slice"):
    memory_plan.parse_slice("v9-8")
  cfg = ModelConfig.qwen3_4b(dtype="bfloat16")
  p = memory_plan.plan(cfg, chips=8, hbm=95 << 30, seq=4096, rows=64)
  assert abs(p.params - cfg.param_count() * 4 / 8) < 0.01 * p.params  # float32 master weights over 8 chips
  # float32 moments; a micro-batch's float32 gradients, their accumulator and the optimizer's step
  assert p.optimizer == 2 * p.params and p.gradients == 3 * p.params
  # 64 rows x 4096 tokens x 36 layers x (K + V) x 8 kv heads x 128 x 2 bytes, rows over the 8 chips
  assert p.kv_cache == 64 * 4096 * 36 * 2 * 8 * 128 * 2 // 8
  assert p.activations_remat < p.activations
  # Rows that fit: a multiple of the 8 batch devices whose cache fills no more than 90% of HBM with the params
  # and moments (resident during rollouts), and 8 rows more would not.
  per_row, resident = 4096 * 36 * 2 * 8 * 128 * 2 // 8, p.params + p.optimizer + p.decode_working
  # A decode step's bf16 weights (sharded as the master copy) and the whole bf16 LM head (tied: the embedding).
  assert p.decode_working == p.params // 2 + cfg.vocab_size * cfg.hidden_size * 2
  assert p.rollout_total == resident + p.kv_cache
  assert p.rollout_rows_fit % 8 == 0 and resident + p.rollout_rows_fit * per_row <= 0.9 * (95 << 30)
  assert resident + (p.rollout_rows_fit + 8) * per_row > 0.9 * (95 << 30)


def test_cli_prints_one_json_line(capsys):
  memory_plan.main(["--model", "qwen2p5_7b", "--slice", "v6e-16", "--seq", "8192", "--rows", "32", "--tensor", "2",
                    "--json"])
  out = json.loads(capsys.readouterr().out)
  assert out["mesh"] == {"data": 1, "fsdp": 8, "context": 1, "tensor": 2} and out["kv_cache"] > 0


@pytest.mark.parametrize("data,fsdp,tensor", [(1, 8, 1), (1, 4, 2)])
def test_plan_state_bytes_equal_the_compiled_update_steps_arguments(data, fsdp, tensor):
  """XLA's own accounting of the compiled (sharded) update step on 8 fake CPU devices: its per-device argument
  bytes are the plan's params + AdamW moments, plus the batch rows and the scalars (step, Adam count, key)."""
  import jax.numpy as jnp

  from agentrl_jax import train_state as train_state_lib
  from agentrl_jax.rl import losses
  from agentrl_jax.rl import update as update_lib

  cfg = ModelConfig.tiny_qwen3(vocab_size=512, num_heads=4, num_kv_heads=2)
  mesh = sharding_lib.make_mesh(data, fsdp, tensor)
  opt_cfg = train_state_lib.OptimizerConfig()
  graphdef, abstract = train_state_lib.abstract_train_state(cfg, opt_cfg, mesh)
  shardings = train_state_lib.train_state_shardings(abstract, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, losses.LossConfig(), opt_cfg, mesh, micro_batch_size=8,
                                     logits_chunk_size=None)
  b, t = 8, 64
  bs = update_lib.batch_sharding(mesh)
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=bs)  # noqa: E731
  batch = {"tokens": spec((b, t), jnp.int32), "loss_mask": spec((b, t), jnp.float32),
           "advantages": spec((b,), jnp.float32), "old_logp": spec((b, t), jnp.float32)}
  compiled = update.lower(abstract, batch, jax.ShapeDtypeStruct((), jax.random.key(0).dtype)).compile()
  args = compiled.memory_analysis().argument_size_in_bytes
  p = memory_plan.plan(cfg, chips=8, hbm=16 << 30, seq=t, rows=8, data=data, tensor=tensor)
  rows = b // (data * fsdp)
  batch_bytes = rows * t * (4 + 4 + 4) + rows * 4
  scalars = args - (p.params + p.optimizer + batch_bytes)
  assert 0 <= scalars <= 64, (args, p.params, p.optimizer, batch_bytes)  # step, Adam's count, the key


@pytest.mark.parametrize("remat", [False, True])
def test_activation_count_equals_the_residuals_autodiff_saves(remat):
  """The plan's activations are what JAX's autodiff saves between the forward and the backward pass of the
  update's log-probs with the fused splash kernel (interpret mode on CPU), in float32, element for element:
  every saved float array that has a token dimension (weights and their transposes excluded)."""
  import numpy as np
  from jax._src.ad_checkpoint import saved_residuals
  import jax.numpy as jnp

  from agentrl_jax.models.qwen import Qwen
  from agentrl_jax.rl import update as update_lib

  t = 256
  cfg = ModelConfig.tiny_qwen3(hidden_size=96, intermediate_size=160, num_layers=3, num_heads=6, num_kv_heads=2,
                               head_dim=16, vocab_size=512, remat=remat, attention_impl="splash",
                               attention_interpret=True)
  graphdef, params = nnx.split(Qwen(cfg, rngs=nnx.Rngs(0)))
  tokens = jnp.zeros((1, t), jnp.int32)
  loss = lambda p: jnp.sum(update_lib.token_logprobs(graphdef, p, {"tokens": tokens}, logits_chunk_size=128)[0])
  saved = sum(int(np.prod(aval.shape)) * aval.dtype.itemsize for aval, desc in saved_residuals(loss, params)
              if "from the argument" not in desc and jnp.issubdtype(aval.dtype, jnp.floating) and t in aval.shape)
  assert saved == memory_plan.residual_bytes(cfg, t, remat=remat)
