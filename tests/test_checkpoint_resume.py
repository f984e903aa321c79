"""Checkpoints: sharded save/restore with resharding, PRNG keys, metadata, grain iterator, keep-last-N; and exact
resume of a SIGKILLed SFT run (`python -m agentrl_jax.main`) to bit-identical params.

The resume test runs three processes (uninterrupted, killed, resumed) that share a persistent JAX compilation
cache, so only the first one pays for compiling.
"""

from __future__ import annotations

import json
import os
import signal
import time

import grain
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from agentrl_jax import checkpoint, testing
from agentrl_jax.models import sharding as sharding_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state(mesh):
  fsdp = NamedSharding(mesh, P("fsdp", None))
  return {
      "params": {"w": jax.device_put(jnp.arange(32.0).reshape(8, 4), fsdp), "layers": {0: {"b": jnp.ones(3)}}},
      "step": jnp.int32(7),
      "rng": jax.random.key(3),
  }


def test_checkpoint_resume_roundtrip_reshards_keys_meta_and_iterator(tmp_path):
  mesh8 = sharding_lib.make_mesh(1, 8, 1)
  state = _state(mesh8)
  it = iter(grain.MapDataset.range(20).shuffle(seed=1).to_iter_dataset())
  consumed = [next(it) for _ in range(5)]
  with checkpoint.Checkpointer(tmp_path, checkpoint.CheckpointConfig(every_steps=1, max_to_keep=2)) as ckpt:
    assert ckpt.latest_step() is None
    ckpt.save(7, state, data_iterator=it, metadata={"counters": {"skipped": 2}})
    expected_next = [next(it) for _ in range(4)]

  # A fresh manager (as after a restart) restores into a different mesh and sharding.
  mesh = sharding_lib.make_mesh(2, 2, 2)
  target = checkpoint.abstract_state(jax.eval_shape(lambda: _state(mesh8)),
                                     {"params": {"w": NamedSharding(mesh, P(None, "tensor")),
                                                 "layers": {0: {"b": NamedSharding(mesh, P())}}},
                                      "step": NamedSharding(mesh, P()), "rng": NamedSharding(mesh, P())})
  fresh = iter(grain.MapDataset.range(20).shuffle(seed=1).to_iter_dataset())
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 7
    restored, meta = ckpt.restore(target, data_iterator=fresh)
  assert meta == {"counters": {"skipped": 2}, "step": 7}
  np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
  assert restored["params"]["w"].sharding == target["params"]["w"].sharding
  assert int(restored["step"]) == 7
  assert jax.dtypes.issubdtype(restored["rng"].dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(jax.random.key_data(restored["rng"]), jax.random.key_data(state["rng"]))
  assert [next(fresh) for _ in range(4)] == expected_next and consumed


def test_checkpoint_resume_keeps_last_n_and_reports_missing(tmp_path):
  mesh = sharding_lib.make_mesh(1, 8, 1)
  state = _state(mesh)
  with checkpoint.Checkpointer(tmp_path, checkpoint.CheckpointConfig(every_steps=2, max_to_keep=2)) as ckpt:
    saved = [s for s in range(1, 8) if ckpt.maybe_save(s, state, force=s == 7)]
    assert saved == [2, 4, 6, 7]
    assert ckpt.all_steps() == [6, 7] and ckpt.latest_step() == 7
    assert not ckpt.maybe_save(7, state, force=True)  # already saved
    with pytest.raises(ValueError, match="no checkpoint at step 2"):
      ckpt.restore(checkpoint.abstract_state(state), step=2)
    with pytest.raises(ValueError, match="no data-iterator state"):
      ckpt.restore(checkpoint.abstract_state(state), data_iterator=iter(grain.MapDataset.range(3).to_iter_dataset()))
    partial, _ = ckpt.restore({"params": checkpoint.abstract_state(state["params"])})  # reads only the params
    assert set(partial) == {"params"}
    assert ckpt.read_metadata(6) == {"step": 6}
    assert ckpt.saved_shapes()["params"]["w"] == jax.ShapeDtypeStruct((8, 4), jnp.float32)
  with pytest.raises(ValueError, match="every_steps"):
    checkpoint.CheckpointConfig(every_steps=0)


# ------------------------------------------------------------------------------------------------------------
# Exact resume after SIGKILL, through the real entry point
# ------------------------------------------------------------------------------------------------------------

# 14 toy rows (2 malformed), batch 4, 12 epochs -> 42 steps; checkpoints every 5 steps.
FLAGS = ["--config=configs/sft_tiny.py", "--config.sft.num_epochs=12", "--config.sft.max_seq_len=128",
         "--config.data.toy_tools=False", "--config.checkpoint.every_steps=5", "--config.log_every_steps=1"]
TOTAL_STEPS = 42
KILL_AFTER = "saved checkpoint at step 10 "


def _launch(workdir, cache_dir, log_path=None):
  return testing.launch_main(FLAGS, workdir, log_path=log_path, cache_dir=cache_dir)


def _final_state(workdir):
  return testing.latest_checkpoint_state(os.path.join(workdir, "checkpoints"))


def _metrics(workdir):
  lines = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  # Wall-clock rates and compile work belong to the process, not to the run.
  return [{k: v for k, v in m.items() if k != "steps_per_sec" and not k.startswith("compile/")} for m in lines]


def test_sft_resume_after_sigkill_is_bit_identical(tmp_path):
  full, killed, cache = tmp_path / "full", tmp_path / "killed", tmp_path / "jax_cache"
  reference = _launch(full, cache, log_path=tmp_path / "full.log")  # the uninterrupted run
  deadline = time.monotonic() + 240
  while "saved checkpoint at step 5 " not in (tmp_path / "full.log").read_text():  # it has compiled by then
    assert reference.poll() is None and time.monotonic() < deadline, (tmp_path / "full.log").read_text()[-3000:]
    time.sleep(0.2)
  victim = _launch(killed, cache)
  log = []
  for line in victim.stdout:
    log.append(line)
    if KILL_AFTER in line:
      victim.send_signal(signal.SIGKILL)
      break
  victim.wait(timeout=60)
  reference.wait(timeout=300)
  assert reference.returncode == 0, (tmp_path / "full.log").read_text()[-3000:]
  assert victim.returncode == -signal.SIGKILL, "".join(log)[-3000:]
  with checkpoint.Checkpointer(killed / "checkpoints") as ckpt:
    killed_at = ckpt.latest_step()
  assert killed_at is not None and 10 <= killed_at < TOTAL_STEPS

  resumed = _launch(killed, cache)
  out = resumed.communicate(timeout=300)[0]
  assert resumed.returncode == 0, out[-3000:]
  assert f"resumed at step {killed_at} of {TOTAL_STEPS}" in out

  step_a, state_a, meta_a = _final_state(full)
  step_b, state_b, meta_b = _final_state(killed)
  assert step_a == step_b == TOTAL_STEPS
  assert meta_a == meta_b and meta_a["counters"]["skipped_conversations"] > 0
  leaves_a, tree_a = jax.tree.flatten(state_a)
  leaves_b, tree_b = jax.tree.flatten(state_b)
  assert tree_a == tree_b and len(leaves_a) > 20
  for a, b in zip(leaves_a, leaves_b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()  # bit-identical params, Adam moments, step and PRNG key
  # The logs read as one run too: the killed run's lines past its checkpoint were dropped on resume.
  assert _metrics(full) == _metrics(killed)
  assert [m["step"] for m in _metrics(killed)] == list(range(1, TOTAL_STEPS + 1))


def test_checkpoint_of_unstacked_layers_restores_into_the_stacked_layout(tmp_path):
  """A train state written with one subtree per decoder layer (`layers/0/...`, the layout before the layers were
  stacked) restores into today's stacked params and Adam moments, in their shardings, value for value."""
  from flax import nnx

  from agentrl_jax.models.config import ModelConfig
  from agentrl_jax import train_state as train_state_lib

  cfg = ModelConfig.tiny_qwen3(num_layers=3)
  mesh = sharding_lib.make_mesh(data=1, fsdp=4, tensor=2)
  opt = train_state_lib.OptimizerConfig()
  _, state = train_state_lib.init_train_state(testing.tiny_model(cfg, seed=2), opt, mesh)
  state = state.replace(opt_state=jax.tree.map(lambda x: x + 0.5 if x.ndim else x, state.opt_state))

  def unstack(s):  # the stored layout of the old model: layers as an nnx.List, one State per layer
    if not (isinstance(s, nnx.State) and "layers" in s):
      return s
    layers = {i: jax.tree.map(lambda x, i=i: x[i], s["layers"]) for i in range(cfg.num_layers)}
    return nnx.State({**s, "layers": nnx.State(layers)})

  legacy = jax.tree.map(unstack, state, is_leaf=lambda x: isinstance(x, nnx.State))
  with checkpoint.Checkpointer(tmp_path / "ckpt") as ckpt:
    ckpt.save(3, {"train": legacy})
  _, abstract = train_state_lib.abstract_train_state(cfg, opt, mesh)
  with checkpoint.Checkpointer(tmp_path / "ckpt") as ckpt:
    restored, meta = ckpt.restore({"train": abstract})
  assert meta["step"] == 3
  for got, want in zip(jax.tree.leaves(restored["train"]), jax.tree.leaves(state)):
    assert got.shape == want.shape and got.sharding == want.sharding
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  q = restored["train"].params["layers"]["attn"]["q_dnh"].get_value()
  assert q.shape[0] == 3 and q.sharding.spec == P(None, "fsdp", "tensor", None)
