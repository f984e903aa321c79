"""The sampler's state and the pieces its three programs share (`sampling.sampler`).

`SamplingState` is what the compiled functions carry over B row slots; `Draw` and `Segment` are what they return
to the host. `cache_per_layer` / `carry_per_layer` decide the KV cache's form by the platform compiled for;
`draw_and_record` is the one place a drawn token enters the state.
"""

from __future__ import annotations

import collections

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from agentrl_jax.models import attention_kernels
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import KVCache, PagedKVCache, make_cache
from agentrl_jax.sampling import logits as logits_lib
from agentrl_jax.sampling.config import SamplingConfig, StopReason

# Number of times each sampler function was traced (= compiled) in this process.
TRACE_COUNTS: collections.Counter[str] = collections.Counter()


@flax.struct.dataclass
class SamplingState:
  """Everything the decode loop carries, for B row slots.

  Attributes:
    cache: the KV cache `[B, S]` (S = capacity; a `PagedKVCache` for attention_impl="ragged_paged");
      `cache.lengths` are the tokens already in it.
    last_token: `[B]` the row's last drawn token, not yet in the cache.
    active: `[B]` the row is decoding.
    stop_reason: `[B]` `StopReason` of an inactive row (RUNNING while active).
    budget: `[B]` tokens the row may still draw before it stops with LENGTH.
    forced: `[B, F]` teacher-forced tokens of the row's current turn (-1 = sample), or None.
    forced_pos: `[B]` next index into `forced`, or None.
    key: the PRNG key; split once per draw.
    steps: scalar int32, decode steps run so far (all calls).
  """

  cache: KVCache | PagedKVCache
  last_token: Int[Array, "B"]
  active: Array
  stop_reason: Int[Array, "B"]
  budget: Int[Array, "B"]
  forced: Int[Array, "B F"] | None
  forced_pos: Int[Array, "B"] | None
  key: jax.Array
  steps: Int[Array, ""]

  @property
  def batch(self) -> int:
    return self.last_token.shape[0]

  @property
  def capacity(self) -> int:
    return self.cache.max_len


@flax.struct.dataclass
class Draw:
  """Tokens drawn by `prefill_groups` / `extend` (one per row they touched), with the rows' stop state."""

  token: Int[Array, "R"]
  logp_raw: Float[Array, "R"]
  logp_sample: Float[Array, "R"]
  stop_reason: Int[Array, "R"]


@flax.struct.dataclass
class Segment:
  """What one `decode` call drew. Row b drew `num[b]` tokens, at `tokens[b, :num[b]]`.

  `stop_reason`/`active`/`lengths` are the rows' state after the call (so the host needs one transfer).
  """

  tokens: Int[Array, "B L"]
  logp_raw: Float[Array, "B L"]
  logp_sample: Float[Array, "B L"]
  num: Int[Array, "B"]
  stop_reason: Int[Array, "B"]
  active: Array
  lengths: Int[Array, "B"]
  steps: Int[Array, ""]


# --------------------------------------------------------------------------- cache form
# "stacked" / "per_layer" overrides `carry_per_layer` for the programs traced while it is set (to time the forms
# side by side); None: chosen by the platform.
FORCE_CARRY: str | None = None


def cache_per_layer(cfg: ModelConfig) -> bool:
  """Whether the sampler keeps its KV cache one array per layer (`KVCache.per_layer`) between calls, rather than
  as the stacked arrays: on XLA:CPU (`carry_per_layer`), where decode carries that form through its loop, so
  that no call splits the cache at its start and restacks it at its end (two copies of the whole cache a call),
  and extend reads each layer's cache in place instead of slicing it out of the stack. Prefill, extend, grow
  and the row moves take either form. bench.rollout's default loop (bench_5m, 64 rows growing to ~1,100 tokens),
  alternating on an idle host: a round 24.3 / 24.0 -> 23.2 / 23.1 s, its compile 10.3 / 10.4 -> 9.5 / 9.5 s; its
  overlap mode (202 decode calls a round) 1.34 -> 2.06 episodes a second.
  Decided by the platform compiled for, as `carry_per_layer` is; the paged cache stays stacked."""
  return cfg.attention_impl != "ragged_paged" and _per_layer_platform()


def _per_layer_platform() -> bool:
  """The platform rule `cache_per_layer` and `carry_per_layer` share: XLA:CPU (or `FORCE_CARRY`, set to time the
  forms side by side)."""
  if FORCE_CARRY is not None:
    return FORCE_CARRY == "per_layer"
  return attention_kernels.target_platform() == "cpu"


def carry_per_layer(cache) -> bool:
  """Whether `decode`'s loop carries the cache one array per layer (`KVCache.per_layer`: as the sampler keeps it
  on XLA:CPU, `cache_per_layer`; a stacked cache is split at the call's start and restacked at its end) and
  reads each layer's weights from copies split off the stack once per weight version (`sampler._LayerParts`,
  passed in by `Sampler.decode`; `sampler._restacked`), instead of slicing layer i out of the stacked cache and
  weights on every step.

  Decided by what the compiler is given, the platform: on XLA:CPU a slice out of a stacked array inside the loop
  is a copy (the decode step's reductions and XLA's dots do not read through it), so every step copied each
  layer's weights, and in the scanned form its cache too, before reading them. Accelerators keep the scanned,
  stacked form (one layer's code whatever the depth; the TPU compiler reads the slices in place, and the
  pre-flight's decode programs stay as they are). On XLA:CPU the per-layer form is the faster at every size
  measured, so the cache size does not enter: decode step alternating in one process (min over 5 rounds of 3
  calls, 2 cores under a load of ~20), stacked and scanned / per-layer cache with the weights sliced each step
  (2246f40) / this form: bench_58m B=16 at capacity 320, 163 / 189 / 158 ms; bench_5m, 7.2 / 5.5 / 4.9 ms; the
  main job's demo_1m, B=128 at capacity 224, 7.2 / 5.6 / 4.5 ms."""
  if isinstance(cache, KVCache) and cache.is_per_layer:
    return True
  if FORCE_CARRY is not None:  # either form forced, whatever the cache's class
    return FORCE_CARRY == "per_layer"
  return isinstance(cache, KVCache) and _per_layer_platform()


def init_state(cfg: ModelConfig, batch: int, capacity: int, key: jax.Array, *, forced_len: int = 0) -> SamplingState:
  """An empty state: B inactive slots with an empty cache of `capacity` tokens per row.

  Args:
    forced_len: F > 0 enables teacher forcing (per-row forced tokens per turn, for scripted policies).
  """
  return SamplingState(
      cache=make_cache(cfg, batch, capacity, per_layer=cache_per_layer(cfg)),
      last_token=jnp.zeros((batch,), jnp.int32),
      active=jnp.zeros((batch,), jnp.bool_),
      stop_reason=jnp.full((batch,), int(StopReason.END), jnp.int32),
      budget=jnp.zeros((batch,), jnp.int32),
      forced=jnp.full((batch, forced_len), -1, jnp.int32) if forced_len else None,
      forced_pos=jnp.zeros((batch,), jnp.int32) if forced_len else None,
      key=key,
      steps=jnp.zeros((), jnp.int32),
  )


def grow(state: SamplingState, capacity: int) -> SamplingState:
  """Pads the cache to `capacity` slots per row (the sampler grows it in buckets as rows get longer)."""
  TRACE_COUNTS["grow"] += 1
  return state.replace(cache=state.cache.grow(capacity))


def reset_rows(state: SamplingState, rows: Int[Array, "R"]) -> SamplingState:
  """Empties the caches of row slots `rows` (index B = padding): their next extend writes from position 0. The
  rows' pending tokens and stop state are kept (a recomputed context resumes where it stopped)."""
  TRACE_COUNTS["reset_rows"] += 1
  return state.replace(cache=state.cache.replace(lengths=state.cache.lengths.at[rows].set(0, mode="drop")))


# --------------------------------------------------------------------------- shared pieces
def stop_after(token, budget, sampling: SamplingConfig):
  """Stop reason of rows that just drew `token` with `budget` draws left (before this one)."""
  reason = jnp.full(token.shape, int(StopReason.RUNNING), jnp.int32)
  reason = jnp.where(budget <= 1, int(StopReason.LENGTH), reason)
  if sampling.tool_end_token_ids:
    reason = jnp.where(jnp.isin(token, jnp.asarray(sampling.tool_end_token_ids)), int(StopReason.TOOL), reason)
  if sampling.end_token_ids:
    reason = jnp.where(jnp.isin(token, jnp.asarray(sampling.end_token_ids)), int(StopReason.END), reason)
  return reason


def last_hidden(hidden: Float[Array, "R T D"], chunk_lengths: Int[Array, "R"]) -> Float[Array, "R D"]:
  idx = jnp.maximum(chunk_lengths - 1, 0)
  return jnp.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0]


def unembed_dv(model) -> jax.Array:
  """The unembedding as a `[D, V]` matrix in the compute dtype.

  With tied embeddings the model multiplies by the `[V, D]` table transposed; XLA:CPU then re-lays out the
  whole table on every decode step (10.8 ms vs 4.6 ms per step for the 32000 x 512 table at B=16). `decode`
  builds this matrix once per call, outside its loop.
  """
  dt = model.cfg.jnp_dtype
  if model.cfg.tie_embeddings:
    return model.embed_vd[...].astype(dt).T
  return model.unembed_dv[...].astype(dt)


def forced_token(forced, forced_pos):
  """The forced token at each row's position (-1 past its end)."""
  f = forced.shape[1]
  tok = jnp.take_along_axis(forced, jnp.minimum(forced_pos, f - 1)[:, None], axis=1)[:, 0]
  return jnp.where(forced_pos < f, tok, -1)


def set_rows(x, rows, values):
  """x[rows] = values, dropping rows that are out of range (padding rows use index B)."""
  return x.at[rows].set(values.astype(x.dtype), mode="drop")


def draw_and_record(state: SamplingState, cache: KVCache, logits, rows, budgets, forced, sampling: SamplingConfig):
  """Draws one token per row from `logits` and records it in `state` (with the updated `cache`).

  `rows` index the row slots that drew; index B (out of range) marks a row that does not (padding, or an
  extend chunk that is not its row's last): its draw is computed and dropped.
  """
  key, draw_key = jax.random.split(state.key)
  forced_tok = None if forced is None else forced[:, 0]
  token, logp_raw, logp_sample = logits_lib.sample(logits, draw_key, sampling, forced_tok)
  reason = stop_after(token, budgets, sampling)
  new = state.replace(
      cache=cache,
      last_token=set_rows(state.last_token, rows, token),
      active=set_rows(state.active, rows, reason == StopReason.RUNNING),
      stop_reason=set_rows(state.stop_reason, rows, reason),
      budget=set_rows(state.budget, rows, budgets - 1),
      key=key,
  )
  if state.forced is not None:
    new = new.replace(forced=set_rows(state.forced, rows, forced),
                      forced_pos=set_rows(state.forced_pos, rows, jnp.ones_like(rows)))
  return new, Draw(token, logp_raw, logp_sample, reason)
