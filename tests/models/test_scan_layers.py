"""The scanned decoder stack (`ModelConfig.scan_layers`, the default) against the same parameters run unrolled:
logits, gradients (with and without remat), the KV cache and sampled tokens; and a program whose size does not
grow with depth."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import KVCache, PagedKVCache
from agentrl_jax.sampling.config import SamplingConfig
from agentrl_jax.sampling.generate import generate
from agentrl_jax.sampling.sampler import make_sampler

CONFIGS = {"qwen3": ModelConfig.tiny_qwen3(num_layers=3), "qwen2": ModelConfig.tiny_qwen2(num_layers=3)}


def _both(cfg: ModelConfig, seed: int = 0):
  """(graphdef, params) of the scanned model and the unrolled graph over the same params."""
  model = testing.tiny_model(cfg.replace(scan_layers=True), seed=seed)
  graphdef, params = nnx.split(model)
  unrolled_def, _ = nnx.split(testing.tiny_model(cfg.replace(scan_layers=False), seed=seed))
  return graphdef, unrolled_def, params


def _loss(graphdef, params, tokens, target):
  logits, _ = nnx.merge(graphdef, params)(tokens)
  return jnp.sum(jax.nn.log_softmax(logits) * target)


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("remat", [False, True])
def test_scanned_logits_and_gradients_match_unrolled(family, remat):
  cfg = CONFIGS[family].replace(remat=remat)
  scanned, unrolled, params = _both(cfg)
  tokens = testing.random_tokens(jax.random.key(1), 2, 24, cfg.vocab_size)
  target = jax.random.normal(jax.random.key(2), (2, 24, cfg.vocab_size))
  got = jax.jit(jax.value_and_grad(functools.partial(_loss, scanned)))(params, tokens, target)
  want = jax.jit(jax.value_and_grad(functools.partial(_loss, unrolled)))(params, tokens, target)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
  for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True):
    assert g.shape == w.shape
    np.testing.assert_allclose(g, w, rtol=0, atol=2e-6 * float(np.abs(w).max()) + 1e-12)
  # The layer axis of every stacked gradient is the layers' own: layer 1's gradient moves with layer 1 only.
  q = got[1]["layers"]["attn"]["q_dnh"].get_value()
  assert q.shape[0] == cfg.num_layers and not np.allclose(q[0], q[1])


@pytest.mark.parametrize("paged", [False, True])
def test_scanned_cache_matches_unrolled(paged):
  """Prefill then three decode steps: the same logits and the same cache, every layer (paged: the ragged
  paged kernel's XLA statement, which reads the stacked cache through per-layer page tables)."""
  cfg = CONFIGS["qwen3"].replace(attention_impl="ragged_paged", attention_interpret=True, kv_page_size=8) \
      if paged else CONFIGS["qwen3"]
  scanned, unrolled, params = _both(cfg)
  cache_cls = PagedKVCache if paged else KVCache
  tokens = testing.random_tokens(jax.random.key(3), 2, 8, cfg.vocab_size)
  lengths = jnp.asarray([8, 5], jnp.int32)

  @functools.partial(jax.jit, static_argnums=0)
  def run(graphdef, params):
    model = nnx.merge(graphdef, params)
    cache = cache_cls.init(cfg, 2, 32)
    logits, cache = model(tokens, cache=cache, chunk_lengths=lengths)
    outs = [logits]
    for i in range(3):
      logits, cache = model(tokens[:, i:i + 1], cache=cache)
      outs.append(logits)
    return outs, cache

  got, got_cache = run(scanned, params)
  want, want_cache = run(unrolled, params)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)
  np.testing.assert_array_equal(got_cache.lengths, [11, 8])
  for g, w in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache)):
    assert g.shape == w.shape and g.shape[0] == 2 and (g.ndim == 1 or g.shape[1] == cfg.num_layers)
    np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)


def test_scanned_sampler_draws_the_unrolled_tokens():
  cfg = CONFIGS["qwen3"]
  scanned, unrolled, params = _both(cfg, seed=4)
  sc = SamplingConfig(segment_len=4)
  prompts = [list(range(5, 15)), [3, 9, 200, 11]]
  outs = [generate(make_sampler(g, cfg, sc, batch=4), params, prompts, key=jax.random.key(5), max_new_tokens=10,
                   n=2) for g in (scanned, unrolled)]
  for a, b in zip(outs[0].tokens, outs[1].tokens):
    assert a.tolist() == b.tolist()
  np.testing.assert_allclose(np.concatenate(outs[0].logp_raw), np.concatenate(outs[1].logp_raw), atol=2e-5)


def test_scanned_program_does_not_grow_with_depth():
  """The scanned forward and backward hold one layer's code: the same number of operations at 2 and 8 layers
  (unrolled, the program grows with the layers)."""

  def size(layers, scan):
    cfg = ModelConfig.tiny_qwen3(num_layers=layers, scan_layers=scan, remat=True)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: testing.tiny_model(cfg)))
    tokens = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    target = jax.ShapeDtypeStruct((2, 16, cfg.vocab_size), jnp.float32)
    text = jax.jit(jax.grad(functools.partial(_loss, graphdef))).trace(params, tokens, target).lower().as_text()
    return text.count("\n")

  assert size(2, True) == size(8, True)
  assert size(8, False) > 2 * size(2, False)
