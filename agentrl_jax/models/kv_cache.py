"""KV cache with per-row lengths, shared by prefill, decode and extend.

Row b holds its tokens contiguously in slots `[0, lengths[b])`. Every forward pass with a cache appends a
chunk of T tokens per row (T = prompt length for prefill, 1 for decode, a tool response for extend) at slots
`lengths[b] + t`, so rows of one batch sit at different positions and the earlier context is never
recomputed. Only the first `chunk_lengths[b]` tokens of a row's chunk count: the rest are padding, written to
slots that the next chunk overwrites.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models import sharding

CACHE_AXES = ("cache_batch", "cache_seq", "cache_kv_heads", "cache_head_dim")


@flax.struct.dataclass
class KVCache:
  """Per-layer keys/values `[B, S, K, H]` and the number of valid tokens of each row.

  Attributes:
    k: one array per layer, `[B, S, K, H]`.
    v: one array per layer, `[B, S, K, H]`.
    lengths: `[B]` int32, valid tokens per row (also the position of the row's next token).
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  lengths: Int[Array, "B"]

  @classmethod
  def init(cls, cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache for `batch` rows of up to `max_len` tokens each (dtype: the compute dtype)."""
    dtype = dtype or cfg.jnp_dtype
    shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    zeros = lambda: sharding.shard(jnp.zeros(shape, dtype), CACHE_AXES)
    return cls(k=tuple(zeros() for _ in range(cfg.num_layers)), v=tuple(zeros() for _ in range(cfg.num_layers)),
               lengths=jnp.zeros((batch,), jnp.int32))

  @property
  def batch(self) -> int:
    return self.lengths.shape[0]

  @property
  def max_len(self) -> int:
    return self.k[0].shape[1]

  def select_rows(self, rows: Int[Array, "R"]) -> KVCache:
    """Gathers rows (e.g. `jnp.repeat(arange(P), n)` to share one prompt prefill across n samples)."""
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), self)


def write_chunk(cache_k: jax.Array, new_k: jax.Array, lengths: jax.Array) -> jax.Array:
  """Writes `new_k [B, T, K, H]` into `cache_k [B, S, K, H]` at slots `lengths[b] + t`.

  A per-row scatter with mode="drop": slots past the cache end are dropped instead of clamped (clamping, as
  `dynamic_update_slice` does, would overwrite valid context). Written with vmap so the batch dimension is a
  scatter batching dimension, which the SPMD partitioner keeps local when the batch is sharded.
  """
  t = new_k.shape[1]

  def one_row(row_cache, row_new, start):
    return row_cache.at[start + jnp.arange(t)].set(row_new.astype(row_cache.dtype), mode="drop")

  return jax.vmap(one_row)(cache_k, new_k, lengths)
