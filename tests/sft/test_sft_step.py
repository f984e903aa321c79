"""The SFT train step: exact token-mean CE whatever the packing / micro-batching, bounded compiles, sharded,
non-finite steps skipped."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import update as rl_update
from agentrl_jax.sft import masking, packing
from agentrl_jax.sft import step as step_lib

SEQ = 64
KEY = jax.random.key(0)


@pytest.fixture(scope="module")
def setup():
  tok = testing.tiny_tokenizer()
  convs = []
  for i, (q, a) in enumerate([("2+2?", "4"), ("Name a color.", "Blue, or red."), ("Hi", "Hello there!"),
                              ("3*3?", "It is 9."), ("Count to 3.", "1 2 3"), ("Bye", "Bye!")]):
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    if i % 2:
      msgs += [{"role": "user", "content": "Again?"}, {"role": "assistant", "content": a}]
    convs.append(masking.encode_conversation(tok, msgs, max_tokens=SEQ, index=i))
  cfg = ModelConfig.tiny_qwen3(vocab_size=len(tok))
  return cfg, convs


def _step(cfg, mesh, micro_rows):
  opt = rl_update.OptimizerConfig(learning_rate=1e-2, b2=0.95, grad_clip=1.0)
  graphdef, state = rl_update.init_train_state(testing.tiny_model(cfg, seed=1), opt, mesh)
  shardings = rl_update.train_state_shardings(state, mesh)
  return state, step_lib.make_train_step(graphdef, shardings, opt, mesh, micro_rows=micro_rows, seq_len=SEQ)


def _reference_loss(cfg, convs):
  """Token-mean CE over all assistant targets: one conversation per row (right-padded), no packing."""
  tokens = np.zeros((len(convs), SEQ), np.int32)
  for i, c in enumerate(convs):
    tokens[i, :len(c)] = c.tokens
  logits, _ = testing.jit_forward(testing.tiny_model(cfg, seed=1))(jnp.asarray(tokens))
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll, n = 0.0, 0
  for i, c in enumerate(convs):
    nll -= float(jnp.sum(logp[i, np.arange(len(c) - 1), c.tokens[1:]] * c.loss_mask[1:]))
    n += int(c.loss_mask[1:].sum())
  return nll / n


def test_sft_step_is_exact_over_micro_batches_and_packing(setup):
  cfg, convs = setup
  mesh = sharding_lib.make_mesh(1, 2, 1, devices=jax.devices()[:2])  # FSDP: params and rows over 2 devices
  results, steps = [], {}
  with jax.set_mesh(mesh):
    for micro_rows in (2, 8):  # 6 conversations in 4 rows: two micro-batches of 2, or one of 8 (half padding)
      state, step = _step(cfg, mesh, micro_rows)
      packed = packing.pack(convs, seq_len=SEQ, micro_rows=micro_rows, max_rows=len(convs))
      state, metrics = step(state, step_lib.batch_arrays(packed, mesh), KEY)
      results.append((jax.device_get(metrics), jax.tree.map(np.asarray, state.params)))
      steps[micro_rows] = state, step
  (m2, p2), (m8, p8) = results
  assert m2["tokens"] == m8["tokens"] == sum(c.loss_mask[1:].sum() for c in convs)
  np.testing.assert_allclose(m2["loss"], _reference_loss(cfg, convs), rtol=2e-5)
  np.testing.assert_allclose(m8["loss"], m2["loss"], rtol=2e-5)
  np.testing.assert_allclose(m8["grad_norm"], m2["grad_norm"], rtol=2e-4)
  assert m2["skipped"] == m8["skipped"] == 0.0 and 0 < m8["fill"] < m2["fill"]
  # Adam's first update is ~lr * sign(grad): where a gradient is ~0 its sign follows rounding, hence the atol.
  for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(p8)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)

  # Compiles: one per micro-batch count (row bucket); batches of other sizes in the same bucket reuse it.
  state, step = steps[8]
  with jax.set_mesh(mesh):
    for batch in (convs[:1], convs[1:3], convs[3:]):
      packed = packing.pack(batch, seq_len=SEQ, micro_rows=8, max_rows=6)
      assert packed.inputs.shape[0] == 1
      state, _ = step(state, step_lib.batch_arrays(packed, mesh), KEY)
    assert step._cache_size() == 1

    # A non-finite loss skips the update: params, moments and the update count stay as they were.
    before = jax.tree.map(np.asarray, state), int(state.step)
    bad = packing.pack(convs[:1], seq_len=SEQ, micro_rows=8, max_rows=6)
    bad.weights[0, 0, 0] = np.nan
    state, metrics = step(state, step_lib.batch_arrays(bad, mesh), KEY)
  assert metrics["skipped"] == 1.0 and int(state.step) == before[1] == 4
  for a, b in zip(jax.tree.leaves(before[0]), jax.tree.leaves(jax.tree.map(np.asarray, state))):
    np.testing.assert_array_equal(a, b)


def test_sft_encode_batch_skips_and_reports(setup):
  from agentrl_jax.data import Conversation

  tok = testing.tiny_tokenizer()
  cfg = step_lib.SFTConfig(batch_size=3, max_seq_len=SEQ, micro_batch_rows=2, logits_chunk_size=None)
  good = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
  batch = [Conversation(good, [], 0), Conversation([{"role": "tool", "content": "1"}], [], 1),
           Conversation([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y " * 80}], [], 2)]
  data = step_lib.encode_batch(tok, batch, cfg)
  assert [c.index for c in data.encoded] == [0]
  assert [i for i, _ in data.skipped] == [1, 2]
  assert "message 0 is 'tool'" in data.skipped[0][1] and "max_seq_len=64" in data.skipped[1][1]
  assert data.packed.inputs.shape == (1, 2, SEQ)
  assert step_lib.encode_batch(tok, batch[1:], cfg).packed is None


def test_sft_step_traces_qwen3_4b_at_recipe_shapes():
  """The full-size step traces (no memory, no compile): Qwen3-4B, 8-way FSDP, rows of 16384, chunked LM head."""
  cfg = ModelConfig.qwen3_4b(dtype="bfloat16", remat=True)
  mesh = sharding_lib.make_mesh(1, -1, 1)
  opt = rl_update.OptimizerConfig(learning_rate=1e-5, b2=0.95, schedule="cosine", warmup_steps=47, total_steps=470)
  graphdef, abstract = rl_update.abstract_train_state(cfg, opt, mesh)
  step = step_lib.make_train_step(graphdef, rl_update.train_state_shardings(abstract, mesh), opt, mesh,
                                  micro_rows=8, seq_len=16384, logits_chunk_size=1024)
  batch = {f: jax.ShapeDtypeStruct((4, 8, 16384), jnp.float32 if f == "weights" else jnp.int32)
           for f in packing.FIELDS}
  with jax.set_mesh(mesh):
    new_state, metrics = jax.eval_shape(step, abstract, batch, KEY)
  assert jax.tree.structure(new_state) == jax.tree.structure(abstract)
  assert all(m.shape == () for m in metrics.values())
