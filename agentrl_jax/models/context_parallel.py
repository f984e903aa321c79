"""Context parallelism: the tokens of each row split over the `context` mesh axis (MaxText's
`ici_context_parallelism`), for the passes without a KV cache (the RL update, log-prob scoring, SFT).

Every activation of a row is `[B, T / N, ...]` on each of the N devices of the axis, so a 23,040-token row's
activations (the update's memory) shrink N-fold. The matmuls and norms are per token and need nothing more;
attention needs every earlier key, which two strategies provide (`ModelConfig.context_strategy`):

* `all_gather` (MaxText's default): each device gathers the row's keys and values (`lax.all_gather`, GQA's few kv
  heads: 1/G of the queries' bytes) and attends its own queries over them; the backward pass reduce-scatters
  their gradients.
* `ulysses` (DeepSpeed-Ulysses, verl's sequence parallelism): an all-to-all trades the token split for a
  kv-head split, attention runs on whole rows with K / N kv heads per device, and a second all-to-all trades
  back. N must divide the kv heads left per tensor shard (Qwen3-4B's 8 kv heads bound N * tensor at 8).

Causal load balancing (`ModelConfig.context_load_balance`, MaxText's `context_parallel_load_balance`): with the
tokens split in N contiguous pieces, the last device's queries see N times the keys of the first one's. The
row is cut in 2N chunks and device i holds chunks i and 2N - 1 - i (`layout_order`), so every device attends
over the same number of query-key pairs. Tokens, positions and segment ids enter in that order
(`to_layout`), RoPE takes the true positions, and the causal mask compares true token indices: on the splash
kernel through a mask whose query rows follow the layout (`_LayoutCausalMask`, sharded with the kernel's own
`q_seq_shards` support), on the XLA path through an explicit mask. The model returns its outputs in the
natural order (`from_layout`) unless the caller works in the layout itself (`rl.update.token_logprobs`: only
the `[B, T]` log-probs are put back).

Ring attention (keys passed around the axis while each device's block is computed, overlapping the transfer)
is not implemented: the all-gather's keys and values are 2 x T x K x H bf16 per layer (94 MB for a Qwen3-4B
row of 23,040 tokens), small next to the step's activations, and the compiler's numbers are in the README.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int
import numpy as np

from agentrl_jax.models import attention_kernels
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import CONTEXT_STRATEGIES as STRATEGIES

AXIS = "context"


@dataclasses.dataclass(frozen=True)
class Layout:
  """How a row's T tokens lie over the N devices of the context axis.

  Attributes:
    shards: N.
    t: T, the row's tokens.
    load_balance: device i holds chunks i and 2N - 1 - i of 2N (else chunk i of N).
    strategy: "all_gather" or "ulysses".
  """

  shards: int
  t: int
  load_balance: bool
  strategy: str

  def order(self) -> np.ndarray:
    """`[T]` int32: the token index at each layout position (device i holds positions [i T / N, (i + 1) T / N))."""
    return np.asarray(layout_order(self.t, self.shards, self.load_balance), np.int32)


def layout_order(t: int, shards: int, load_balance: bool = True) -> np.ndarray:
  """Token index at each layout position; with load balancing, chunk order 0, 2N-1, 1, 2N-2, ..."""
  idx = np.arange(t)
  if not load_balance or shards == 1:
    return idx
  return np.asarray(_to_layout_np(idx[None], shards)[0])


def _to_layout_np(x, shards):
  b, t = x.shape[:2]
  c = x.reshape(b, 2 * shards, t // (2 * shards), *x.shape[2:])
  first, second = c[:, :shards], c[:, shards:][:, ::-1]
  return np.stack([first, second], axis=2).reshape(x.shape)


def context_shards() -> int:
  """N, the context axis' size in the mesh being traced under (1 without one)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or AXIS not in mesh.axis_names:
    return 1
  return int(mesh.shape[AXIS])


def layout_for(t: int, cfg) -> Layout | None:
  """The layout of a T-token row under the current mesh for a model of config `cfg`, or None when the context
  axis is absent, of size 1, or does not divide the row (T a multiple of N, or of 2N with load balancing): the
  rules table then keeps the row whole on each device, as it does for any dimension an axis does not divide."""
  n = context_shards()
  if n == 1:
    return None
  if t % ((2 if cfg.context_load_balance else 1) * n):
    return None
  return Layout(shards=n, t=t, load_balance=cfg.context_load_balance, strategy=cfg.context_strategy)


def to_layout(x: Array, layout: Layout | None) -> Array:
  """`[B, T, ...]` in token order -> in the layout's order (a chunk permutation; identity without balancing)."""
  if layout is None or not layout.load_balance:
    return x
  n = layout.shards
  b, t = x.shape[:2]
  c = x.reshape(b, 2 * n, t // (2 * n), *x.shape[2:])
  first, second = c[:, :n], jnp.flip(c[:, n:], axis=1)
  return jnp.stack([first, second], axis=2).reshape(x.shape)


def from_layout(x: Array, layout: Layout | None) -> Array:
  """The inverse of `to_layout`."""
  if layout is None or not layout.load_balance:
    return x
  n = layout.shards
  b, t = x.shape[:2]
  c = x.reshape(b, n, 2, t // (2 * n), *x.shape[2:])
  first, second = c[:, :, 0], jnp.flip(c[:, :, 1], axis=1)
  return jnp.concatenate([first, second], axis=1).reshape(x.shape)


# ------------------------------------------------------------------------------------------------ attention
def attention(qg: Float[Array, "B T K G H"], k: Float[Array, "B T K H"], v: Float[Array, "B T K H"],
              segment_ids: Int[Array, "B T"] | None, scale: float, layout: Layout, *, impl: str,
              interpret: bool = False) -> Float[Array, "B T K G H"]:
  """Causal attention (within packed segments) of rows laid out as `layout` says, T split over the context
  axis; `impl` is "xla" or "splash" (the per-device kernel). Inputs and output are in the layout's order."""
  mesh = jax.sharding.get_abstract_mesh()
  b, t, nk = qg.shape[:3]
  batch = sharding_lib.logical_to_spec(("batch",), (b,), mesh)[0]
  heads = sharding_lib.logical_to_spec(("act_kv_heads",), (nk,), mesh)[0]
  tensor = 1 if heads is None else int(np.prod([mesh.shape[a] for a in ((heads,) if isinstance(heads, str)
                                                                        else heads)]))
  q_spec = jax.P(batch, AXIS, heads, None, None)
  kv_spec = jax.P(batch, AXIS, heads, None)
  seg_spec = None if segment_ids is None else jax.P(batch, AXIS)
  if layout.strategy == "ulysses":
    if (nk // tensor) % layout.shards:
      raise ValueError(f"context_strategy='ulysses': {layout.shards} context shards must divide the {nk // tensor} kv "
                       f"heads of each tensor shard ({nk} kv heads over tensor={tensor}); use 'all_gather'")
    fn = functools.partial(_ulysses_local, layout=layout, scale=scale, impl=impl, interpret=interpret)
    return jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec), out_specs=q_spec,
                         check_vma=False)(qg, k, v, segment_ids)
  if layout.strategy != "all_gather":
    raise ValueError(f"ModelConfig.context_strategy: expected one of {STRATEGIES}, got {layout.strategy!r}")
  if impl == "splash":
    if (t // layout.shards) % 128:
      raise ValueError(f"attention_impl='splash' over the context axis needs each chip's share of a row, "
                       f"{t} / {layout.shards} tokens, to be a multiple of 128: pad the rows (rl.pack_len) to it")
    g = qg.shape[3]
    kernel = _splash_layout_kernel(g, layout.t, layout.shards, layout.load_balance,
                                   attention_kernels.splash_block(layout.t // layout.shards), interpret)
    kernel_spec = kernel.manual_sharding_spec(jax.sharding.NamedSharding(mesh, jax.P(None, AXIS)))
    fn = functools.partial(_all_gather_splash_local, layout=layout, scale=scale)
    return jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec, kernel_spec),
                         out_specs=q_spec, check_vma=False)(qg, k, v, segment_ids, kernel)
  fn = functools.partial(_all_gather_xla_local, layout=layout, scale=scale)
  return jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec), out_specs=q_spec,
                       check_vma=False)(qg, k, v, segment_ids)


def _gather_row(x: Array | None, layout: Layout) -> Array | None:
  """This device's rows, whole and in token order: the all-gather over the context axis, then the layout's
  inverse permutation."""
  if x is None:
    return None
  return from_layout(jax.lax.all_gather(x, AXIS, axis=1, tiled=True), layout)


def _local_query_index(layout: Layout) -> Int[Array, "Tl"]:
  """The token indices of this device's queries."""
  tl = layout.t // layout.shards
  return jax.lax.dynamic_slice_in_dim(jnp.asarray(layout.order()), jax.lax.axis_index(AXIS) * tl, tl)


def _all_gather_xla_local(qg, k, v, seg, *, layout: Layout, scale: float):
  """Per device: its T / N queries over the row's T keys under the causal (+ segment) mask of true indices.
  Dense over the keys (no block is skipped: which blocks are empty depends on the device), which the CPU tests
  and small rows afford; a TPU takes the splash path."""
  k_all, v_all, seg_all = _gather_row(k, layout), _gather_row(v, layout), _gather_row(seg, layout)
  q_idx = _local_query_index(layout)
  mask = jnp.arange(layout.t)[None, None, :] <= q_idx[None, :, None]
  if seg is not None:
    mask = mask & (seg[:, :, None] == seg_all[:, None, :])
  mask = jnp.broadcast_to(mask, (qg.shape[0], q_idx.shape[0], layout.t))
  return attention_kernels.dense_attention(qg, k_all, v_all, mask, scale)


def _all_gather_splash_local(qg, k, v, seg, kernel, *, layout: Layout, scale: float):
  """Per device: the splash kernel of its query rows (a `q_seq_shards` slice of the layout's causal mask) over
  the row's gathered keys."""
  k_all, v_all, seg_all = _gather_row(k, layout), _gather_row(v, layout), _gather_row(seg, layout)
  return attention_kernels.splash_call(kernel, qg, k_all, v_all, seg, seg_all, scale)


@functools.cache
def _layout_mask_cls():
  """The mask class (the Pallas TPU package is imported lazily, as in `attention_kernels`)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  class LayoutCausalMask(sm._ComputableMask):  # pylint: disable=protected-access
    """Causal over true token indices, with the query rows in the layout's order and the keys in token order:
    row r may see key j iff order[r] >= j (MaxText's LoadBalancedCausalMask)."""

    def __init__(self, order: np.ndarray):
      t = int(order.shape[0])
      super().__init__(shape=(t, t), mask_function=lambda q, kv: q >= kv)
      self.q_sequence = np.asarray(order, np.int32)

    def __eq__(self, other):
      if not isinstance(other, type(self)):
        return NotImplemented
      return self.shape == other.shape and np.array_equal(self.q_sequence, other.q_sequence)

    def __hash__(self):
      return hash((type(self), self.shape, self.q_sequence.tobytes()))

  return LayoutCausalMask


@functools.cache
def _splash_layout_kernel(groups: int, t: int, shards: int, load_balance: bool, block: int, interpret: bool):
  """The MQA splash kernel of one kv head's `groups` query heads over a T-token row whose query rows are split
  over `shards` devices in the layout's order (`q_seq_shards`: each device holds its slice of the block tables)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  mask = _layout_mask_cls()(layout_order(t, shards, load_balance))
  heads = sm.MultiHeadMask([mask for _ in range(groups)])
  sizes = attention_kernels.splash_block_sizes(block)
  with jax.ensure_compile_time_eval():
    return sk.make_splash_mqa(heads, block_sizes=sizes, head_shards=1, q_seq_shards=shards, interpret=interpret)


def _ulysses_local(qg, k, v, seg, *, layout: Layout, scale: float, impl: str, interpret: bool):
  """Per device: all-to-all from (T / N tokens, K' kv heads) to (T tokens, K' / N kv heads), causal attention
  over whole rows in token order, and back."""
  swap = lambda x: jax.lax.all_to_all(x, AXIS, split_axis=2, concat_axis=1, tiled=True)  # noqa: E731
  back = lambda x: jax.lax.all_to_all(x, AXIS, split_axis=1, concat_axis=2, tiled=True)  # noqa: E731
  qg, k, v = (from_layout(swap(x), layout) for x in (qg, k, v))
  seg = _gather_row(seg, layout)
  if impl == "splash":
    out = attention_kernels.splash_local(qg, k, v, seg, scale, interpret=interpret)
  else:
    idx = jnp.arange(layout.t)
    mask = idx[None, :, None] >= idx[None, None, :]
    if seg is not None:
      mask = mask & (seg[:, :, None] == seg[:, None, :])
    mask = jnp.broadcast_to(mask, (qg.shape[0], layout.t, layout.t))
    out = attention_kernels.causal_blocked_attention(qg, k, v, mask, scale, block=256)
  return back(to_layout(out, layout))
