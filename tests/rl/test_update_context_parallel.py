"""The RL update and log-prob pass with each row's tokens split over the `context` mesh axis, on fake CPU devices:
packed rows on fsdp x context x tensor equal one device, and the main job's own update (`configs/default.py`:
its model, loss, optimizer, packed 224-token rows, 8-row micro-batches) with context parallelism 2 on 2 devices
gives the same loss curve as on one."""

import jax
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax import train_state as train_state_lib
from agentrl_jax.models import context_parallel, sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import batch as batch_lib
from agentrl_jax.rl import losses
from agentrl_jax.rl import update as update_lib


def _episodes(vocab: int, num: int, max_len: int, seed: int):
  """`num` episode rows (prompt then response, one per row) of random lengths, `update_batch`'s layout."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(max_len // 4, max_len, num)
  tokens = rng.integers(0, vocab, (num, max_len)).astype(np.int32)
  mask = np.zeros((num, max_len), np.float32)
  for i, n in enumerate(lengths):
    mask[i, min(12, n - 1):n] = 1  # the response; the first 12 tokens are the prompt
    mask[i, n // 2:n // 2 + 4] = 0  # a tool response inside it
  return {"tokens": tokens, "loss_mask": mask,
          "sampler_logp": (-2.0 + 0.3 * rng.standard_normal((num, max_len))).astype(np.float32),
          "advantages": rng.standard_normal(num).astype(np.float32)}, lengths


def _packed(vocab, num, pack_len, micro, seed):
  mb, lengths = _episodes(vocab, num, pack_len, seed)
  packed = batch_lib.pack_minibatch(mb, lengths, pack_len=pack_len, micro_batch_size=micro)
  packed["old_logp"] = packed.pop("sampler_logp")  # reuse_sampler_logp, as the main job does
  return packed


def _curve(cfg, loss_cfg, opt_cfg, mesh, batches, micro, chunk):
  graphdef, state = train_state_lib.init_train_state(testing.tiny_model(cfg, seed=2), opt_cfg, mesh)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, loss_cfg, opt_cfg, mesh, micro_batch_size=micro,
                                     logits_chunk_size=chunk)
  logprobs = update_lib.make_logprobs_fn(graphdef, shardings.params, mesh, micro_batch_size=micro,
                                         logits_chunk_size=chunk)
  curve, scores = [], []
  for b in batches:
    scores.append(np.asarray(logprobs(state.params, {k: b[k] for k in update_lib.LOGPROB_KEYS})))
    state, m = update(state, b, jax.random.key(0))
    curve.append({k: float(v) for k, v in m.items()})
  return curve, scores, jax.device_get(state.params)


def _close_curves(got, want, rel):
  for a, b in zip(got[0], want[0]):
    assert a.keys() == b.keys()
    for k in a:
      assert a[k] == pytest.approx(b[k], rel=rel, abs=rel), k
  for a, b in zip(got[1], want[1]):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
  for a, b in zip(jax.tree.leaves(got[2]), jax.tree.leaves(want[2])):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_packed_update_over_fsdp_context_tensor_matches_one_device():
  """fsdp=2 x context=2 x tensor=2 over the 8 fake devices, remat, packed rows, a chunked LM head (2 chunks of
  each device's share of a row): metrics, log-probs and params equal one device's."""
  cfg = ModelConfig.tiny_qwen3(remat=True)
  opt_cfg = train_state_lib.OptimizerConfig(learning_rate=1e-3)
  batches = [_packed(cfg.vocab_size, 8, 32, 4, seed) for seed in range(3)]
  one = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  mesh = sharding.make_mesh(data=1, fsdp=2, context=2, tensor=2)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    assert context_parallel.layout_for(32, cfg) is not None
  want = _curve(cfg, losses.LossConfig(), opt_cfg, one, batches, micro=4, chunk=8)
  got = _curve(cfg, losses.LossConfig(), opt_cfg, mesh, batches, micro=4, chunk=8)
  assert want[0][0]["skipped"] == 0 and want[0][0]["tokens"] > 0
  _close_curves(got, want, 2e-5)


def test_main_job_update_with_context_parallelism_2_on_2_devices_has_the_same_loss_curve():
  """The main job's RL update (configs/default.py: its demo model, GRPO-TCR loss, optimizer schedule, 32 episodes
  a mini-batch packed into 224-token rows, 8-row micro-batches) for a few steps with `mesh.context=2` on 2 fake
  CPU devices against `mesh.context=1` on one: the same loss curve (loss, clipping, entropy, gradient norm)."""
  config = testing.load_config("default")
  rl = config.rl
  cfg = ModelConfig.by_name(config.model.size, param_dtype=config.model.param_dtype, dtype=config.model.dtype)
  loss_cfg = losses.LossConfig(**rl.loss)
  opt_cfg = train_state_lib.OptimizerConfig(**config.optimizer)
  rows = rl.mini_batch_prompts * rl.n
  batches = [_packed(cfg.vocab_size, rows, rl.pack_len, rl.micro_batch_size, seed) for seed in range(3)]
  chunk = rl.logits_chunk_size or None
  one = sharding.mesh_from_config(config.mesh)
  two = sharding.mesh_from_config(dict(config.mesh, context=2, fsdp=1, num_devices=2))
  assert one.size == 1 and dict(two.shape) == {"data": 1, "fsdp": 1, "context": 2, "tensor": 1}
  want = _curve(cfg, loss_cfg, opt_cfg, one, batches, rl.micro_batch_size, chunk)
  got = _curve(cfg, loss_cfg, opt_cfg, two, batches, rl.micro_batch_size, chunk)
  assert [m["skipped"] for m in want[0]] == [0.0] * len(batches)
  assert len({round(m["loss"], 6) for m in want[0]}) == len(batches)  # a curve, not one point repeated
  _close_curves(got, want, 2e-5)
