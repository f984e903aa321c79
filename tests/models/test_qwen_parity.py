"""Parity of our Qwen2/Qwen3 decoders (full forward, cached decode, extend, padded batches) with transformers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import hf_io
from agentrl_jax.models.kv_cache import KVCache

TOL = 1e-4


@pytest.fixture(scope="module")
def models(hf_checkpoint):
  cfg, path = hf_checkpoint
  return cfg, testing.jit_forward(hf_io.load_hf_checkpoint(path)), testing.load_hf_torch(path)


def _maxdiff(a, b):
  return float(jnp.max(jnp.abs(jnp.asarray(a) - jnp.asarray(b))))


def test_full_logits_parity(models):
  cfg, ours, hf = models
  tokens = testing.random_tokens(jax.random.key(0), 3, 17, cfg.vocab_size)
  logits, cache = ours(tokens)
  assert cache is None
  assert logits.dtype == jnp.float32 and logits.shape == (3, 17, cfg.vocab_size)
  assert _maxdiff(logits, testing.hf_logits(hf, tokens)) <= TOL


def test_cached_decode_parity(models):
  cfg, ours, hf = models
  tokens = testing.random_tokens(jax.random.key(1), 2, 12, cfg.vocab_size)
  ref = testing.hf_logits(hf, tokens)
  cache = KVCache.init(cfg, batch=2, max_len=16)
  logits, cache = ours(tokens[:, :5], cache=cache)
  got = [logits]
  for t in range(5, 12):
    logits, cache = ours(tokens[:, t:t + 1], cache=cache)
    got.append(logits)
  assert np.all(np.asarray(cache.lengths) == 12)
  assert _maxdiff(jnp.concatenate(got, axis=1), ref) <= TOL


def test_extend_by_chunk_parity(models):
  """Prefill, decode one token, then extend by a multi-token chunk (a tool response) and decode again."""
  cfg, ours, hf = models
  tokens = testing.random_tokens(jax.random.key(2), 2, 20, cfg.vocab_size)
  ref = testing.hf_logits(hf, tokens)
  cache = KVCache.init(cfg, batch=2, max_len=24)
  pieces = []
  for lo, hi in [(0, 6), (6, 7), (7, 15), (15, 16), (16, 20)]:
    logits, cache = ours(tokens[:, lo:hi], cache=cache)
    pieces.append(logits)
  assert _maxdiff(jnp.concatenate(pieces, axis=1), ref) <= TOL


def test_padded_batch_parity(models):
  """Rows of different lengths, right-padded, match each row run alone: full forward and cache mode."""
  cfg, ours, hf = models
  lengths = [5, 11, 8]
  rows = [testing.random_tokens(jax.random.key(10 + i), 1, n, cfg.vocab_size)[0] for i, n in enumerate(lengths)]
  t = max(lengths)
  padded = jnp.stack([jnp.pad(r, (0, t - len(r))) for r in rows])
  full, _ = ours(padded)
  # cache mode: each row prefilled with its own length, then extended by per-row chunks of different sizes,
  # so rows sit at different positions throughout.
  cache = KVCache.init(cfg, batch=3, max_len=32)
  first = jnp.asarray([3, 6, 2])
  pre, cache = ours(padded[:, :6], cache=cache, chunk_lengths=first)
  assert np.asarray(cache.lengths).tolist() == [3, 6, 2]
  rest = [r[int(f):] for r, f in zip(rows, first)]
  rest_len = max(len(r) for r in rest)
  chunk = jnp.stack([jnp.pad(r, (0, rest_len - len(r))) for r in rest])
  ext, cache = ours(chunk, cache=cache, chunk_lengths=jnp.asarray([len(r) for r in rest]))
  assert np.asarray(cache.lengths).tolist() == lengths
  for i, (row, n) in enumerate(zip(rows, lengths)):
    alone = testing.hf_logits(hf, row[None])[0]
    assert _maxdiff(full[i, :n], alone) <= TOL
    f = int(first[i])
    cached = jnp.concatenate([pre[i, :f], ext[i, :n - f]], axis=0)
    assert _maxdiff(cached, alone) <= TOL


def test_jitted_decode_matches_eager(hf_checkpoint):
  """The compiled cache path (as the sampler runs it) gives the same result as eager execution."""
  cfg, path = hf_checkpoint
  eager = hf_io.load_hf_checkpoint(path)
  tokens = testing.random_tokens(jax.random.key(3), 2, 6, cfg.vocab_size)
  a, cache_a = testing.jit_forward(eager)(tokens, cache=KVCache.init(cfg, batch=2, max_len=8))
  b, cache_b = eager(tokens, cache=KVCache.init(cfg, batch=2, max_len=8))
  assert _maxdiff(a, b) <= 1e-5
  assert _maxdiff(cache_a.k[0], cache_b.k[0]) <= 1e-5


def test_blocked_attention_parity(hf_checkpoint):
  """Causal query-block attention (training path, long T) equals transformers and our dense form, packed too."""
  cfg, path = hf_checkpoint
  blocked = testing.jit_forward(hf_io.load_hf_checkpoint(path, attention_block=5))
  dense = testing.jit_forward(hf_io.load_hf_checkpoint(path, attention_block=0))
  tokens = testing.random_tokens(jax.random.key(7), 2, 17, cfg.vocab_size)
  hf = testing.load_hf_torch(path)
  assert _maxdiff(blocked(tokens)[0], testing.hf_logits(hf, tokens)) <= TOL
  segments = jnp.asarray([[1] * 6 + [2] * 11, [1] * 12 + [2] * 3 + [0] * 2])
  positions = jnp.asarray([list(range(6)) + list(range(11)), list(range(12)) + list(range(3)) + [0, 0]])
  a = blocked(tokens, segment_ids=segments, positions=positions)[0]
  b = dense(tokens, segment_ids=segments, positions=positions)[0]
  assert _maxdiff(a, b) <= 1e-5
