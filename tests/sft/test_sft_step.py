"""The SFT train step: exact token-mean CE whatever the packing / micro-batching, bounded compiles, sharded,
non-finite steps skipped."""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax import train_state as train_state_lib
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig
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


OPT = train_state_lib.OptimizerConfig(learning_rate=1e-2, b2=0.95, grad_clip=1.0)


def _step(cfg, mesh, micro_rows):
  graphdef, state = train_state_lib.init_train_state(testing.tiny_model(cfg, seed=1), OPT, mesh)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  return graphdef, state, step_lib.make_train_step(graphdef, shardings, OPT, mesh, micro_rows=micro_rows,
                                                   seq_len=SEQ)


def _reference_loss_and_grads(graphdef, params, convs):
  """Token-mean CE over all assistant targets and its gradient: one conversation per row (right-padded), no
  packing, no micro-batches, one forward."""
  tokens = np.zeros((len(convs), SEQ), np.int32)
  for i, c in enumerate(convs):
    tokens[i, :len(c)] = c.tokens
  rows = np.concatenate([np.full(len(c) - 1, i) for i, c in enumerate(convs)])
  cols = np.concatenate([np.arange(len(c) - 1) for c in convs])
  targets = np.concatenate([c.tokens[1:] for c in convs])
  weights = np.concatenate([c.loss_mask[1:] for c in convs]).astype(np.float32)

  def loss(p):
    logits, _ = nnx.merge(graphdef, p)(jnp.asarray(tokens))
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(logp[rows, cols, targets] * weights) / weights.sum()

  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  return float(value), jax.tree.map(np.asarray, grads)


def test_sft_step_is_exact_over_micro_batches_and_packing(setup):
  cfg, convs = setup
  mesh = sharding_lib.make_mesh(1, 2, 1, devices=jax.devices()[:2])  # FSDP: params and rows over 2 devices
  results, steps = [], {}
  with jax.set_mesh(mesh):
    for micro_rows in (2, 8):  # 6 conversations in 4 rows: two micro-batches of 2, or one of 8 (half padding)
      graphdef, state, step = _step(cfg, mesh, micro_rows)
      p0 = jax.tree.map(np.asarray, state.params)  # before the step donates them
      packed = packing.pack(convs, seq_len=SEQ, micro_rows=micro_rows, max_rows=len(convs))
      state, metrics = step(state, step_lib.batch_arrays(packed, mesh), KEY)
      results.append((jax.device_get(metrics), jax.tree.map(np.asarray, state.params)))
      steps[micro_rows] = state, step
  (m2, p2), (m8, p8) = results
  ref_loss, ref_grads = _reference_loss_and_grads(graphdef, p0, convs)
  g = jax.tree.leaves(ref_grads)
  ref_norm = float(np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g)))

  # What is exact up to float rounding: the loss and the gradient (its global norm), whatever the packing.
  assert m2["tokens"] == m8["tokens"] == sum(c.loss_mask[1:].sum() for c in convs)
  np.testing.assert_allclose([m2["loss"], m8["loss"]], ref_loss, rtol=2e-5)
  np.testing.assert_allclose([m2["grad_norm"], m8["grad_norm"]], ref_norm, rtol=2e-4)
  assert m2["skipped"] == m8["skipped"] == 0.0 and 0 < m8["fill"] < m2["fill"]

  # Adam's first step moves each parameter by lr * (g / (|g| + eps) + wd * p): ~lr * sign(g), which rounding
  # decides where g is ~0. So: where |g| is decisive (far above rounding), both steps land where the reference
  # gradient says; everywhere, a parameter moves by at most lr (plus decay), whichever sign rounding picked.
  scale = min(1.0, OPT.grad_clip / ref_norm)
  decisive_total = n_total = 0
  for p_init, grad, a, b in zip(jax.tree.leaves(p0), g, jax.tree.leaves(p2), jax.tree.leaves(p8)):
    gc = grad * scale
    expected = p_init - OPT.learning_rate * (gc / (np.abs(gc) + OPT.eps) + OPT.weight_decay * p_init)
    # Exact zeros (embeddings of unseen tokens) are decisive too: no rounding reaches them.
    decisive = (np.abs(grad) > 1e-4 * np.abs(grad).max()) | (grad == 0)
    decisive_total, n_total = decisive_total + decisive.sum(), n_total + decisive.size
    for got in (a, b):
      np.testing.assert_allclose(got[decisive], expected[decisive], rtol=1e-5, atol=1e-6)
      moved = np.abs(got - p_init * (1 - OPT.learning_rate * OPT.weight_decay))
      assert np.all(moved <= OPT.learning_rate * (1 + 1e-4)), "a parameter moved further than Adam's first step"
  assert decisive_total > 0.98 * n_total  # the tight comparison covers almost every parameter

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
  cfg = step_lib.SFTConfig(batch_size=3, max_seq_len=SEQ, micro_batch_rows=2, logits_chunk_size=None,
                           truncation="skip")
  good = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
  batch = [Conversation(good, [], 0), Conversation([{"role": "tool", "content": "1"}], [], 1),
           Conversation([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y " * 80}], [], 2)]
  data = step_lib.encode_batch(tok, batch, cfg)
  assert [c.index for c in data.encoded] == [0]
  assert [i for i, _ in data.skipped] == [1, 2]
  assert "message 0 is 'tool'" in data.skipped[0][1] and "max_seq_len=64" in data.skipped[1][1]
  assert data.packed.inputs.shape == (2, 2, SEQ)  # fixed rows: the largest packing of 3 conversations
  assert step_lib.encode_batch(tok, batch[1:], cfg).packed is None


def test_sft_encode_batch_truncates_on_the_right_as_the_reference():
  """verl's multi-turn SFT dataset with data.truncation=right keeps the first max_length tokens and their loss
  mask (verl/utils/dataset/multiturn_sft_dataset.py:321-324): so does truncation='right' (the default)."""
  from agentrl_jax.data import Conversation

  tok = testing.tiny_tokenizer()
  long_turn = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y " * 80}]
  full = masking.encode_conversation(tok, long_turn, index=2)
  assert len(full) > SEQ
  cfg = step_lib.SFTConfig(batch_size=2, max_seq_len=SEQ, micro_batch_rows=2, logits_chunk_size=None)
  assert cfg.truncation == "right" and step_lib.SFTConfig().max_seq_len == 32768
  data = step_lib.encode_batch(tok, [Conversation(long_turn, [], 2)], cfg)
  (kept,) = data.encoded
  assert data.truncated == (2,) and not data.skipped
  np.testing.assert_array_equal(kept.tokens, full.tokens[:SEQ])
  np.testing.assert_array_equal(kept.loss_mask, full.loss_mask[:SEQ])
  assert 0 < kept.num_trained < full.num_trained and data.packed.inputs.shape == (1, 2, SEQ)
  left = step_lib.encode_batch(tok, [Conversation(long_turn, [], 2)],
                               step_lib.SFTConfig(batch_size=2, max_seq_len=SEQ, micro_batch_rows=2,
                                                  logits_chunk_size=None, truncation="left"))
  np.testing.assert_array_equal(left.encoded[0].tokens, full.tokens[-SEQ:])
  # A conversation whose first max_seq_len tokens hold no assistant token is skipped, not trained on.
  long_question = [{"role": "user", "content": "q " * 80}, {"role": "assistant", "content": "y"}]
  data = step_lib.encode_batch(tok, [Conversation(long_question, [], 5)], cfg)
  assert data.packed is None and data.skipped[0][0] == 5 and "no assistant token" in data.skipped[0][1]
  with pytest.raises(ValueError, match="truncation"):
    step_lib.SFTConfig(truncation="middle")
  with pytest.raises(ValueError, match="side"):
    masking.truncate(full, SEQ, "middle")


def test_sft_step_traces_qwen3_4b_at_recipe_shapes():
  """The full-size step traces (no memory, no compile): Qwen3-4B, 8-way FSDP, rows of 32768 (the recipe's
  max_length), chunked LM head."""
  cfg = ModelConfig.qwen3_4b(dtype="bfloat16", remat=True)
  mesh = sharding_lib.make_mesh(1, -1, 1)
  opt = train_state_lib.OptimizerConfig(learning_rate=1e-5, b2=0.95, schedule="cosine", warmup_steps=47, total_steps=470)
  graphdef, abstract = train_state_lib.abstract_train_state(cfg, opt, mesh)
  step = step_lib.make_train_step(graphdef, train_state_lib.train_state_shardings(abstract, mesh), opt, mesh,
                                  micro_rows=8, seq_len=32768, logits_chunk_size=1024)
  batch = {f: jax.ShapeDtypeStruct((4, 8, 32768), jnp.float32 if f == "weights" else jnp.int32)
           for f in packing.FIELDS}
  with jax.set_mesh(mesh):
    new_state, metrics = jax.eval_shape(step, abstract, batch, KEY)
  assert jax.tree.structure(new_state) == jax.tree.structure(abstract)
  assert all(m.shape == () for m in metrics.values())
