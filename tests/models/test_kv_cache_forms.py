"""The KV cache's two forms (`KVCache`: stacked `[B, L, ...]` arrays, or one `[B, 1, ...]` array per layer as the
sampler keeps it on XLA:CPU) hold the same contents through every operation the sampler applies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import KVCache, make_cache


def _filled(cfg, batch, cap, seed, per_layer):
  stacked = KVCache.init(cfg, batch, cap)
  keys = jax.random.split(jax.random.key(seed), 2)
  stacked = stacked.replace(k=jax.random.normal(keys[0], stacked.k.shape),
                            v=jax.random.normal(keys[1], stacked.v.shape), lengths=jnp.arange(batch, dtype=jnp.int32) + 1)
  return stacked.per_layer() if per_layer else stacked


def _same(a: KVCache, b: KVCache):
  assert a.max_len == b.max_len and a.batch == b.batch
  np.testing.assert_array_equal(a.lengths, b.lengths)
  for layer in range(len(a.k) if a.is_per_layer else a.k.shape[1]):
    for x, y in zip(a.token_major(layer), b.token_major(layer)):
      np.testing.assert_array_equal(x, y)


def test_per_layer_and_stacked_caches_agree_through_grow_put_and_select():
  cfg = ModelConfig.tiny_qwen3(num_layers=3)
  empty = make_cache(cfg, 4, 8, per_layer=True)
  assert empty.is_per_layer and len(empty.k) == 3 and empty.k[0].shape == (4, 1, cfg.num_kv_heads, cfg.head_dim, 8)
  assert not make_cache(cfg, 4, 8).is_per_layer
  big = {f: _filled(cfg, 4, 8, 0, f) for f in (False, True)}
  small = {f: _filled(cfg, 2, 5, 1, f) for f in (False, True)}
  _same(big[True], big[False])
  rows = jnp.array([3, 0], jnp.int32)
  put = {f: big[f].put_rows(rows, small[f]) for f in (False, True)}
  _same(put[True], put[False])
  grown = {f: put[f].grow(16) for f in (False, True)}
  _same(grown[True], grown[False])
  assert grown[True].max_len == 16
  picked = {f: grown[f].select_rows(jnp.array([1, 3], jnp.int32)) for f in (False, True)}
  _same(picked[True], picked[False])
  _same(grown[True].stacked(), grown[False])
  assert grown[True].per_layer() is grown[True]


def test_put_rows_refuses_mixed_forms():
  cfg = ModelConfig.tiny_qwen3()
  with pytest.raises(ValueError, match="both per layer"):
    _filled(cfg, 4, 8, 0, True).put_rows(jnp.array([0, 1], jnp.int32), _filled(cfg, 2, 5, 1, False))
