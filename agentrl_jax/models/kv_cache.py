"""KV cache with per-row lengths, shared by prefill, decode and extend.

Row b holds its tokens contiguously in slots `[0, lengths[b])`. Every forward pass with a cache appends a
chunk of T tokens per row (T = prompt length for prefill, 1 for decode, a tool response for extend) at slots
`lengths[b] + t`, so rows of one batch sit at different positions and the earlier context is never
recomputed. Only the first `chunk_lengths[b]` tokens of a row's chunk count: the rest are padding, written to
slots that the next chunk overwrites.

Every array holds all layers, row by row (`[B, L, ...]`), as the model stacks its layer parameters: a scanned
decoder carries the whole cache through its layers and writes each layer's chunk in place. On XLA:CPU the
sampler keeps one `[B, 1, ...]` array per layer instead (`KVCache.per_layer`, `sampling.state.cache_per_layer`):
there a layer sliced out of the stacked array is a copy. Rows outermost is
the layout the TPU compiler keeps inside the decode loop (with the layers outermost it copied the whole cache
into that order on every decode call, and back), and it keeps a row's cache in one piece for the row moves
(`select_rows`, `put_rows`).

Layout: keys are stored transposed, `[B, L, K, H, S]` (slots minor), values as `[B, L, K, S, H]`. With these, both
attention products of a decode step are plain batched matmuls over the (B, K) batch that read the cache in
place: scores `q [G, H] @ keys [H, S]` and output `probs [G, S] @ values [S, H]`, each streaming its half of the
cache once. With the token-major `[B, S, K, H]` layout of the model's activations, XLA:CPU either copies the
cache into this order on every step or reads it through slower kernels (attention per layer at B=16, S=320,
K=4, G=2, H=64: 0.35 ms, against 0.51-0.60 ms for the best token-major form; the decode step of the 58M
benchmark model went from 14.0 to 11.8 ms).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models import sharding

K_AXES = ("cache_batch", "cache_layers", "cache_kv_heads", "cache_head_dim", "cache_seq")  # keys [B, L, K, H, S]
V_AXES = ("cache_batch", "cache_layers", "cache_kv_heads", "cache_seq", "cache_head_dim")  # values [B, L, K, S, H]
K_SEQ_AXIS, V_SEQ_AXIS = 4, 3
LAYER_AXIS = 1  # of every cache array (rows are axis 0)


@flax.struct.dataclass
class KVCache:
  """The layers' keys `[B, L, K, H, S]`, values `[B, L, K, S, H]` and the number of valid tokens of each row.

  Attributes:
    k: `[B, L, K, H, S]` (transposed keys; see the module docstring).
    v: `[B, L, K, S, H]`.
    lengths: `[B]` int32, valid tokens per row (also the position of the row's next token).
  """

  k: jax.Array | tuple[jax.Array, ...]
  v: jax.Array | tuple[jax.Array, ...]
  lengths: Int[Array, "B"]

  @classmethod
  def init(cls, cfg: ModelConfig, batch: int, max_len: int, dtype=None, *, per_layer: bool = False) -> KVCache:
    """An empty cache for `batch` rows of up to `max_len` tokens each (dtype: `cfg.kv_cache_dtype`, by default
    the compute dtype); `per_layer`: one `[B, 1, ...]` array per layer instead of the stacked arrays (the form
    a sampler on XLA:CPU keeps between calls: `sampling.state.cache_per_layer`)."""
    dtype = dtype or cfg.jnp_kv_dtype
    layers = 1 if per_layer else cfg.num_layers
    k_shape = (batch, layers, cfg.num_kv_heads, cfg.head_dim, max_len)
    v_shape = (batch, layers, cfg.num_kv_heads, max_len, cfg.head_dim)
    zeros = lambda shape, axes: sharding.shard(jnp.zeros(shape, dtype), axes)  # noqa: E731
    lengths = jnp.zeros((batch,), jnp.int32)
    if per_layer:
      return cls(k=tuple(zeros(k_shape, K_AXES) for _ in range(cfg.num_layers)),
                 v=tuple(zeros(v_shape, V_AXES) for _ in range(cfg.num_layers)), lengths=lengths)
    return cls(k=zeros(k_shape, K_AXES), v=zeros(v_shape, V_AXES), lengths=lengths)

  @property
  def batch(self) -> int:
    return self.lengths.shape[0]

  @property
  def max_len(self) -> int:
    return self._v0.shape[V_SEQ_AXIS]

  @property
  def dtype(self):
    return self._v0.dtype

  @property
  def _v0(self) -> jax.Array:
    return self.v[0] if isinstance(self.v, tuple) else self.v

  def arrays(self) -> tuple[jax.Array, jax.Array] | tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """The arrays as the model's attention takes them: `(k, v)`, stacked or one `[B, 1, ...]` array per layer."""
    return self.k, self.v

  @property
  def is_per_layer(self) -> bool:
    """True when the cache holds one `[B, 1, ...]` array per layer (`per_layer`)."""
    return isinstance(self.k, tuple)

  def per_layer(self) -> KVCache:
    """The same cache with one `[B, 1, ...]` array per layer (a copy; the cache itself when it is per layer
    already). On XLA:CPU a layer sliced out of the stacked array is a copy of that layer's cache (the decode
    step's reductions cannot read through the slice), in every step of a loop that slices it, so a sampler on
    XLA:CPU keeps its cache in this form (`sampling.state.cache_per_layer`)."""
    if self.is_per_layer:
      return self
    split = lambda x: tuple(x[:, i:i + 1] for i in range(x.shape[LAYER_AXIS]))  # noqa: E731
    return self.replace(k=split(self.k), v=split(self.v))

  def stacked(self) -> KVCache:
    """The inverse of `per_layer`."""
    if not isinstance(self.k, tuple):
      return self
    return self.replace(k=sharding.shard(jnp.concatenate(self.k, axis=LAYER_AXIS), K_AXES),
                        v=sharding.shard(jnp.concatenate(self.v, axis=LAYER_AXIS), V_AXES))

  def with_arrays(self, arrays: tuple[jax.Array, ...], lengths: Int[Array, "B"]) -> KVCache:
    """The cache holding the updated arrays (as `arrays` gives them) and the new lengths."""
    k, v = arrays
    return self.replace(k=k, v=v, lengths=lengths)

  def select_rows(self, rows: Int[Array, "R"]) -> KVCache:
    """Gathers rows (e.g. `jnp.repeat(arange(P), n)` to share one prompt prefill across n samples)."""
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), self)

  def token_major(self, layer: int) -> tuple[jax.Array, jax.Array]:
    """Layer `layer`'s keys and values as `[B, S, K, H]` (for tests and inspection; copies)."""
    if self.is_per_layer:
      k, v = self.k[layer][:, 0], self.v[layer][:, 0]
    else:
      k, v = self.k[:, layer], self.v[:, layer]
    return jnp.transpose(k, (0, 3, 1, 2)), jnp.transpose(v, (0, 2, 1, 3))

  def grow(self, capacity: int) -> KVCache:
    """Pads every row to `capacity` slots (the new slots are empty)."""
    pad = capacity - self.max_len
    if pad < 0:
      raise ValueError(f"KVCache.grow: capacity {capacity} is below the current {self.max_len}")

    def pad_seq(x, seq_axis, axes):
      widths = [(0, pad if i == seq_axis else 0) for i in range(x.ndim)]
      return sharding.shard(jnp.pad(x, widths), axes)

    return self.replace(k=jax.tree.map(lambda x: pad_seq(x, K_SEQ_AXIS, K_AXES), self.k),
                        v=jax.tree.map(lambda x: pad_seq(x, V_SEQ_AXIS, V_AXES), self.v))

  def put_rows(self, rows: Int[Array, "R"], other: KVCache) -> KVCache:
    """Writes `other`'s R rows into row slots `rows` (index >= B drops the row): slots `[0, other.max_len)` of
    each row are replaced, later slots are kept, and the rows' lengths become `other`'s. Both caches have the
    same form (stacked or per layer)."""
    t = other.max_len
    if other.is_per_layer != self.is_per_layer:
      raise ValueError("KVCache.put_rows: both caches must be stacked, or both per layer")
    rows, other = _two_rows_at_least(rows, other, self.batch)

    def put_k(x, o):
      return sharding.shard(x.at[rows, :, :, :, :t].set(o.astype(x.dtype), mode="drop"), K_AXES)

    def put_v(x, o):
      return sharding.shard(x.at[rows, :, :, :t].set(o.astype(x.dtype), mode="drop"), V_AXES)

    return self.replace(k=jax.tree.map(put_k, self.k, other.k), v=jax.tree.map(put_v, self.v, other.v),
                        lengths=self.lengths.at[rows].set(other.lengths, mode="drop"))


def _two_rows_at_least(rows, other, batch: int):
  """A one-row write gets a second row aimed past the end (dropped). XLA turns a one-index scatter into a
  dynamic-update-slice, which the SPMD partitioner cannot apply to a row-sharded cache without gathering every
  row onto every device (the TPU compiler's plan for a one-prompt prefill into a 48-row cache over 16 chips:
  165 GiB per chip instead of 14); a two-index scatter stays one per shard."""
  if rows.shape[0] != 1:
    return rows, other
  rows = jnp.concatenate([rows, jnp.full((1,), batch, rows.dtype)])
  return rows, jax.tree.map(lambda x: jnp.concatenate([x, x], axis=0), other)


def _write_rows(cache: jax.Array, chunk: jax.Array, lengths: jax.Array, layer, put) -> jax.Array:
  """Per-row scatter of `chunk [B, T, ...]` into layer `layer` of the stacked `cache [B, L, ...]`; `put(row,
  layer, slots, chunk_row)` writes one row (`row` is `[L, ...]`).

  Written with vmap over the batch axis so that it is a scatter batching dimension, which the SPMD partitioner
  keeps local when the batch is sharded; the layer index is part of the scatter, so the stacked buffer (a scan
  carry, or a donated argument) is updated in place, one chunk's worth of slots, with no copy of the layer.
  """
  t = chunk.shape[1]
  layer = jnp.asarray(layer, jnp.int32)

  def one_row(row, c, start):
    return put(row, layer, start + jnp.arange(t), c)

  return jax.vmap(one_row)(cache, chunk, lengths)


def write_chunk(cache_k: jax.Array, cache_v: jax.Array, new_k: jax.Array, new_v: jax.Array, lengths: jax.Array,
                layer) -> tuple[jax.Array, jax.Array]:
  """Writes one layer's chunk `new_k, new_v [B, T, K, H]` at slots `lengths[b] + t` of layer `layer` of the
  stacked cache arrays (`layer` an int or a traced scalar).

  Slots past the cache end are dropped (mode="drop") instead of clamped: clamping, as `dynamic_update_slice`
  does, would overwrite valid context.
  """
  # Indexing a row [L, K, H, S] (or [L, K, S, H]) with the layer and the slots, two indices a slice apart, puts
  # the slots' axis first: the indexed block is [T, K, H], the chunk's own layout.
  put_k = lambda row, i, slots, c: row.at[i, :, :, slots].set(c.astype(row.dtype), mode="drop")  # noqa: E731
  put_v = lambda row, i, slots, c: row.at[i, :, slots].set(c.astype(row.dtype), mode="drop")  # noqa: E731
  return _write_rows(cache_k, new_k, lengths, layer, put_k), _write_rows(cache_v, new_v, lengths, layer, put_v)


# ------------------------------------------------------------------------------------------------ paged layout
PAGED_AXES = ("cache_batch", "cache_layers", "cache_seq", "cache_kv_heads", "cache_head_dim")  # kv [B, L, S, 2K, H]


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def static_page_table(batch: int, pages: int, layers: int = 1, layer=0) -> Int[Array, "B P"]:
  """Row b's pages of layer `layer` (an int or a traced scalar) in a `[B, L, S]` page pool of `pages` pages per
  row and layer: pages `[(b * layers + layer) * pages, ...)`, in order (the page table of a `PagedKVCache`)."""
  rows = (jnp.arange(batch, dtype=jnp.int32) * layers + layer) * pages
  return rows[:, None] + jnp.arange(pages, dtype=jnp.int32)[None, :]


@flax.struct.dataclass
class PagedKVCache:
  """The KV cache as pages of `page_size` tokens, for the ragged paged attention kernel (`attention_impl=
  "ragged_paged"`, TPU): one array `kv [B, L, S, 2K, H]` with keys and values interleaved by head (k0, v0, k1,
  v1, ...), which is the kernel's `kv_pages [B * L * S / page_size, page_size, 2K, H]` without a copy.

  Row b's layer l owns pages `[(b * L + l) * S / page_size, (b * L + l + 1) * S / page_size)` (a static page
  table per layer, `page_indices`), so rows move between slots by copying their pages, as the other layout copies
  its rows. What
  the layout buys is the kernel: each row's queries read the pages its own length covers, not the batch's
  capacity. Capacities are rounded up to whole pages. Same interface as `KVCache` (init, select_rows, put_rows,
  grow, lengths).

  Attributes:
    kv: `[B, L, S, 2K, H]`.
    lengths: `[B]` int32, valid tokens per row.
    page_size: tokens per page (static).
  """

  kv: jax.Array
  lengths: Int[Array, "B"]
  page_size: int = flax.struct.field(pytree_node=False, default=64)

  @classmethod
  def init(cls, cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> PagedKVCache:
    dtype = dtype or cfg.jnp_kv_dtype
    shape = (batch, cfg.num_layers, _round_up(max_len, cfg.kv_page_size), 2 * cfg.num_kv_heads, cfg.head_dim)
    return cls(kv=sharding.shard(jnp.zeros(shape, dtype), PAGED_AXES), lengths=jnp.zeros((batch,), jnp.int32),
               page_size=cfg.kv_page_size)

  @property
  def batch(self) -> int:
    return self.lengths.shape[0]

  @property
  def max_len(self) -> int:
    return self.kv.shape[2]

  @property
  def dtype(self):
    return self.kv.dtype

  @property
  def is_per_layer(self) -> bool:
    """Always False: the paged cache stays one stacked array (the ragged paged kernel reads it so)."""
    return False

  def page_indices(self, layer: int = 0) -> Int[Array, "B P"]:
    """The page table of layer `layer`: row b's pages of that layer, in order."""
    return static_page_table(self.batch, self.max_len // self.page_size, self.kv.shape[LAYER_AXIS], layer)

  def arrays(self) -> tuple[jax.Array]:
    """The stacked array as the model's attention takes it: `(kv,)`."""
    return (self.kv,)

  def with_arrays(self, arrays: tuple[jax.Array, ...], lengths: Int[Array, "B"]) -> PagedKVCache:
    """The cache holding the updated array (as `arrays` gives it) and the new lengths."""
    (kv,) = arrays
    return self.replace(kv=kv, lengths=lengths)

  def select_rows(self, rows: Int[Array, "R"]) -> PagedKVCache:
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), self)

  def token_major(self, layer: int) -> tuple[jax.Array, jax.Array]:
    """Layer `layer`'s keys and values as `[B, S, K, H]` (for tests and inspection; copies)."""
    return self.kv[:, layer][:, :, 0::2], self.kv[:, layer][:, :, 1::2]

  def grow(self, capacity: int) -> PagedKVCache:
    """Adds empty pages so every row holds at least `capacity` slots."""
    pad = _round_up(capacity, self.page_size) - self.max_len
    if pad < 0:
      raise ValueError(f"PagedKVCache.grow: capacity {capacity} is below the current {self.max_len}")
    return self.replace(kv=sharding.shard(jnp.pad(self.kv, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0))), PAGED_AXES))

  def put_rows(self, rows: Int[Array, "R"], other: PagedKVCache) -> PagedKVCache:
    """Writes `other`'s R rows into row slots `rows` (index >= B drops the row), as `KVCache.put_rows`."""
    t = other.max_len
    rows, other = _two_rows_at_least(rows, other, self.batch)
    kv = self.kv.at[rows, :, :t].set(other.kv.astype(self.kv.dtype), mode="drop")
    return self.replace(kv=sharding.shard(kv, PAGED_AXES), lengths=self.lengths.at[rows].set(other.lengths, mode="drop"))


def write_chunk_paged(cache_kv: jax.Array, new_k: jax.Array, new_v: jax.Array, lengths: jax.Array,
                      layer) -> jax.Array:
  """Writes one layer's chunk `new_k, new_v [B, T, K, H]` at slots `lengths[b] + t` of layer `layer` of the
  stacked `kv [B, L, S, 2K, H]` (keys at even, values at odd combined heads); slots past the end are dropped,
  as in `write_chunk`."""
  b, t, nk, h = new_k.shape
  chunk = jnp.stack([new_k, new_v], axis=3).reshape(b, t, 2 * nk, h).astype(cache_kv.dtype)
  put = lambda row, i, slots, c: row.at[i, slots].set(c, mode="drop")  # noqa: E731  row [L, S, 2K, H]
  return _write_rows(cache_kv, chunk, lengths, layer, put)


def make_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None, *, per_layer: bool = False
               ) -> KVCache | PagedKVCache:
  """The cache layout the model's attention reads: paged for `attention_impl="ragged_paged"`, else `KVCache`
  (one array per layer with `per_layer`: `KVCache.init`)."""
  if cfg.attention_impl == "ragged_paged":
    return PagedKVCache.init(cfg, batch, max_len, dtype)
  return KVCache.init(cfg, batch, max_len, dtype, per_layer=per_layer)
