"""The compiled sampler: one `SamplingState` over B row slots, advanced by three pure functions.

  prefill_groups  prefill P prompts ONCE each, copy every prompt's cache into its n row slots (`select_rows`),
                  draw each row's first token;
  extend          append a chunk to chosen rows' caches (a tool response; other rows get chunk length 0) and
                  draw their next token: earlier context is never recomputed;
  decode          a `lax.while_loop` of one-token steps over all active rows until every row stopped, the
                  step limit is hit, or (optionally) enough rows paused at a tool call.

A row's last drawn token is pending: it enters the cache with the next step (decode) or as the first token of
the next chunk (extend), so stop tokens cost no forward pass unless the episode continues.

Every function reads the model's parameters as an `nnx.State` argument (the trainer's current params; nothing
is copied into the sampler) and the model's static `GraphDef`. `make_sampler` jits them, with explicit
shardings when a mesh is given, and donates the state. Shapes are bucketed by the caller (`config.bucket`), so a
run compiles a bounded number of times; `TRACE_COUNTS` counts traces per function for tests and benchmarks.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any, Callable

import flax.struct
from flax import nnx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from agentrl_jax.models import attention_kernels, sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import K_AXES, PAGED_AXES, V_AXES, KVCache, PagedKVCache, make_cache
from agentrl_jax.models.qwen import unstack_layers
from agentrl_jax.sampling import logits as logits_lib
from agentrl_jax.sampling.config import SamplingConfig, StopReason
from agentrl_jax.sampling.state import (  # noqa: F401  (the state's names are the sampler's API too)
    TRACE_COUNTS, Draw, SamplingState, Segment, cache_per_layer, carry_per_layer, draw_and_record, forced_token,
    grow, init_state, last_hidden, reset_rows, stop_after, unembed_dv)


# --------------------------------------------------------------------------- prefill
def prefill_groups(
    graphdef: nnx.GraphDef,
    sampling: SamplingConfig,
    n: int,
    params: nnx.State,
    state: SamplingState,
    tokens: Int[Array, "P T"],
    lengths: Int[Array, "P"],
    slots: Int[Array, "Pn"],
    budgets: Int[Array, "Pn"],
    forced: Int[Array, "Pn F"] | None = None,
) -> tuple[SamplingState, Draw]:
  """Prefills P prompts once each and starts n rows per prompt in the given slots.

  Args:
    graphdef: the model's static graph (`nnx.split(model)[0]`).
    sampling: sampling settings (static).
    n: samples per prompt (static); prompt p's rows are `slots[p*n:(p+1)*n]`.
    params: the model's parameters (`nnx.State`).
    state: the sampler state; rows not in `slots` are untouched.
    tokens: `[P, T]` right-padded prompt tokens (T bucketed); padding prompts have length 0.
    lengths: `[P]` prompt lengths (>= 1 for real prompts).
    slots: `[P*n]` row slots to fill; index B (out of range) marks a padding row.
    budgets: `[P*n]` tokens each new row may draw.
    forced: `[P*n, F]` teacher-forced tokens of each row's first turn (-1 = sample), when enabled.

  Returns:
    `(state, Draw)`: the first token of each of the P*n rows.
  """
  TRACE_COUNTS["prefill_groups"] += 1
  model = nnx.merge(graphdef, params)
  p, t = tokens.shape
  small = make_cache(model.cfg, p, t, dtype=state.cache.dtype, per_layer=state.cache.is_per_layer)
  hidden, small = model(tokens, cache=small, chunk_lengths=lengths, return_hidden=True)
  logits = model.unembed(last_hidden(hidden, lengths))  # [P, V]: one unembed per prompt, not per token
  rows = jnp.repeat(jnp.arange(p), n)
  logits = jnp.take(logits, rows, axis=0)
  # The n samples share the one prefill: sample j of every prompt is written to its slots in turn, a P-row copy
  # each, rather than through a [P*n, T] fan-out of the prompts' caches (on a sharded cache that fan-out lands
  # whole on every device).
  by_sample = jnp.asarray(slots).reshape(p, n)
  cache = jax.lax.fori_loop(0, n, lambda j, c: c.put_rows(by_sample[:, j], small), state.cache)
  return draw_and_record(state, cache, logits, slots, budgets, forced, sampling)


# --------------------------------------------------------------------------- extend
def extend(
    graphdef: nnx.GraphDef,
    sampling: SamplingConfig,
    params: nnx.State,
    state: SamplingState,
    rows: Int[Array, "R"],
    chunk: Int[Array, "R T"],
    chunk_lengths: Int[Array, "R"],
    final: Array,
    budgets: Int[Array, "R"],
    forced: Int[Array, "R F"] | None = None,
) -> tuple[SamplingState, Draw]:
  """Appends `chunk[r, :chunk_lengths[r]]` to the cache of row slot `rows[r]` and draws that row's next token:
  one forward for all rows that resume after a tool call.

  Only the R resuming rows are computed: their caches are gathered into an R-row cache, extended, and
  scattered back (a copy of R rows of the cache, far cheaper than a forward over all B rows x T tokens). With
  R = B, entry i is row slot i (`rows` must be `arange(B)`; other rows take chunk length 0) and the cache is
  extended in place: no rows are gathered, which on a sharded cache would place the R rows' whole caches on
  every device (a TPU run of long contexts extends all rows this way: `RolloutConfig.extend_rows=0`).

  Args:
    rows: `[R]` row slots to extend; index B (out of range) marks a padding entry.
    chunk: `[R, T]` right-padded tokens (T bucketed); a resuming row's chunk starts with its pending token.
    chunk_lengths: `[R]` tokens to append per row (>= 1 for real entries).
    final: `[R]` bool, this chunk ends the row's pending input: draw its next token and resume it. A long
      input is appended in several fixed-size chunks (so extend compiles once per cache capacity); only the
      last one draws.
    budgets: `[R]` draws allowed to each extended row from now on.
    forced: `[R, F]` teacher-forced tokens of the rows' next turn, when enabled.

  Returns:
    `(state, Draw)` with one entry per element of `rows`.
  """
  TRACE_COUNTS["extend"] += 1
  with sharding_lib.rows_layout():  # rows whole on one device, as the cache holds them (sharding.rows_layout)
    return _extend(graphdef, sampling, params, state, rows, chunk, chunk_lengths, final, budgets, forced)


def _extend(graphdef, sampling, params, state, rows, chunk, chunk_lengths, final, budgets, forced):
  model = nnx.merge(graphdef, params)
  b = state.batch
  valid = rows < b
  lengths = jnp.where(valid, chunk_lengths, 0)
  if rows.shape[0] == b:  # every row slot, in place
    hidden, cache = model(chunk, cache=state.cache, chunk_lengths=lengths, return_hidden=True)
  else:
    sub = state.cache.select_rows(jnp.minimum(rows, b - 1))  # [R, S]
    hidden, sub = model(chunk, cache=sub, chunk_lengths=lengths, return_hidden=True)
    cache = state.cache.put_rows(rows, sub)
  logits = model.unembed(last_hidden(hidden, lengths))
  drawn = jnp.where(final, rows, b)  # rows that draw; the others only append to their cache
  return draw_and_record(state, cache, logits, drawn, budgets, forced, sampling)


# --------------------------------------------------------------------------- decode
def _restacked(params: nnx.State, layer_parts: list[nnx.State]) -> nnx.State:
  """`params` with its layer stack rebuilt from per-layer parts (`qwen.unstack_layers`). Inside the decode loop
  the model's own split of this stack cancels against it (XLA folds a slice of a concatenate into the operand),
  so each step reads the parts made once per call instead of slicing copies out of the stack."""
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *layer_parts)
  return nnx.State({**params, "layers": stacked})


def decode(
    graphdef: nnx.GraphDef,
    sampling: SamplingConfig,
    params: nnx.State,
    state: SamplingState,
    max_steps: Int[Array, ""],
    min_tool_stops: Int[Array, ""],
    layer_parts: list[nnx.State] | None = None,
) -> tuple[SamplingState, Segment]:
  """Decodes active rows one token per step in a `lax.while_loop`.

  Stops when no row is active, after `max_steps` (<= `sampling.segment_len`) steps, or as soon as
  `min_tool_stops` rows have paused at a tool call during this call (so the host can start their tools while
  the other rows keep decoding in the next call). Inactive rows ride along (static batch) without advancing.

  With the per-layer form (`carry_per_layer`), `layer_parts` are the layers' weights already split off the
  stack (`unstack_layers(params["layers"])`, made once per weight version by `Sampler.decode`); None: split in
  this call.

  Returns:
    `(state, Segment)`; the segment holds this call's tokens.
  """
  TRACE_COUNTS["decode"] += 1
  with sharding_lib.rows_layout():  # rows whole on one device, as the cache holds them (sharding.rows_layout)
    return _decode(graphdef, sampling, params, state, max_steps, min_tool_stops, layer_parts)


def _decode(graphdef, sampling, params, state, max_steps, min_tool_stops, layer_parts):
  per_layer = carry_per_layer(state.cache)
  model = nnx.merge(graphdef, params)
  b, seg = state.batch, sampling.segment_len
  max_steps = jnp.minimum(max_steps, seg)
  zeros_f = jnp.zeros((b, seg), jnp.float32)
  w_dv = unembed_dv(model)

  @flax.struct.dataclass
  class Carry:
    s: SamplingState
    out: Segment
    i: Int[Array, ""]
    tool_stops: Int[Array, ""]

  def cond(c: Carry):
    return (c.i < max_steps) & jnp.any(c.s.active) & (c.tool_stops < min_tool_stops)

  def body(c: Carry) -> Carry:
    s, out = c.s, c.out
    active = s.active
    step_model = model if layer_parts is None else nnx.merge(graphdef, _restacked(params, layer_parts))
    hidden, cache = step_model(s.last_token[:, None], cache=s.cache, chunk_lengths=active.astype(jnp.int32),
                               return_hidden=True)
    logits = jnp.einsum("BD,DV->BV", hidden[:, 0].astype(w_dv.dtype), w_dv, preferred_element_type=jnp.float32)
    key, draw_key = jax.random.split(s.key)
    forced_now = None if s.forced is None else forced_token(s.forced, s.forced_pos)
    token, logp_raw, logp_sample = logits_lib.sample(logits, draw_key, sampling, forced_now)
    reason = stop_after(token, s.budget, sampling)
    stopped = active & (reason != StopReason.RUNNING)
    col = jnp.where(active, out.num, seg)  # inactive rows write nowhere (dropped)
    put = lambda buf, val: buf.at[jnp.arange(b), col].set(val, mode="drop")
    out = out.replace(tokens=put(out.tokens, token), logp_raw=put(out.logp_raw, logp_raw),
                      logp_sample=put(out.logp_sample, logp_sample), num=out.num + active)
    s = s.replace(
        cache=cache,
        last_token=jnp.where(active, token, s.last_token),
        active=active & ~stopped,
        stop_reason=jnp.where(stopped, reason, s.stop_reason),
        budget=s.budget - active,
        key=key,
        steps=s.steps + 1,
    )
    if s.forced is not None:
      s = s.replace(forced_pos=s.forced_pos + active)
    tool_stops = c.tool_stops + jnp.sum(stopped & (reason == StopReason.TOOL))
    return Carry(s, out, c.i + 1, tool_stops)

  out0 = Segment(tokens=jnp.zeros((b, seg), jnp.int32), logp_raw=zeros_f, logp_sample=zeros_f,
                 num=jnp.zeros((b,), jnp.int32), stop_reason=state.stop_reason, active=state.active,
                 lengths=state.cache.lengths, steps=state.steps)
  restack = per_layer and not state.cache.is_per_layer  # a stacked cache in (`cache_per_layer` False) goes out so
  if per_layer:  # the loop reads each layer's cache and weights in place (`carry_per_layer`)
    state = state.replace(cache=state.cache.per_layer())
    if layer_parts is None:
      layer_parts = unstack_layers(params["layers"], model.cfg.num_layers)
  else:
    layer_parts = None
  final = jax.lax.while_loop(cond, body, Carry(state, out0, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)))
  s = final.s
  if restack:
    s = s.replace(cache=s.cache.stacked())
  out = final.out.replace(stop_reason=s.stop_reason, active=s.active, lengths=s.cache.lengths, steps=s.steps)
  return s, out


# --------------------------------------------------------------------------- compiled entry points
class _LayerParts:
  """The layers' weights split off the stack once per weight version, for the per-layer decode form
  (`carry_per_layer`): a split inside each decode call is a copy of every layer's weights per call (on XLA:CPU,
  slower per byte than the steps' own reads; 58M model at B=16: ~25 ms of a 64-step call). Kept for the params
  whose `layers` leaves were split last (compared by identity: a new weight version is new arrays), so decode
  calls between two weight updates share one split; the previous version's parts are dropped before the next
  split. Costs one extra copy of the layer weights while the sampler holds them."""

  def __init__(self, split: Callable[[nnx.State], list[nnx.State]]):
    self._split = split
    self._refs: list[weakref.ref] | None = None
    self._parts: list[nnx.State] | None = None
    self.splits = 0  # weight versions split so far (tests and benchmarks)

  def __call__(self, params: nnx.State) -> list[nnx.State]:
    leaves = jax.tree.leaves(params["layers"])
    refs = self._refs
    if refs is not None and len(refs) == len(leaves) and all(r() is x for r, x in zip(refs, leaves)):
      return self._parts
    self._refs = self._parts = None
    self._parts = self._split(params["layers"])
    self._refs = [weakref.ref(x) for x in leaves]
    self.splits += 1
    return self._parts


@dataclasses.dataclass(frozen=True)
class Sampler:
  """The jitted sampler functions for one model graph, sampling config, batch size and mesh.

  Build with `make_sampler`; call with the current params (an `nnx.State`) every time.
  """

  model_cfg: ModelConfig
  sampling: SamplingConfig
  batch: int
  n_forced: int
  mesh: jax.sharding.Mesh | None
  init: Callable[..., SamplingState]
  prefill_groups: Callable[..., tuple[SamplingState, Draw]]
  extend: Callable[..., tuple[SamplingState, Draw]]
  decode: Callable[..., tuple[SamplingState, Segment]]
  grow: Callable[..., SamplingState]
  reset_rows: Callable[..., SamplingState] | None = None
  param_shardings: Any = None
  layer_parts: Any = None
  """`_LayerParts`: the per-layer weights `decode` reads on XLA:CPU, split once per weight version."""
  jitted: dict[str, Any] = dataclasses.field(default_factory=dict)
  """The jitted functions behind the entry points (`prefill_groups` as `n -> jitted`), for ahead-of-time
  compilation (`agentrl_jax.aot`): `jitted["decode"].trace(*abstract args)` under `jax.set_mesh(mesh)`."""

  @property
  def fixed_capacity(self) -> bool:
    """True when attention reads each row's own length (`PagedKVCache` with the ragged paged kernel): a larger
    cache then costs memory, not attention time, so callers allocate the largest capacity they may need once
    instead of growing it in buckets, and a run compiles one decode and one extend program instead of one per
    capacity bucket (plus the grows). The memory plan (`models.memory_plan`) sizes the cache for the largest
    capacity either way."""
    return self.model_cfg.attention_impl == "ragged_paged"

  def place_params(self, params: nnx.State) -> nnx.State:
    """Reshards params onto the sampler's layout when it differs (a no-op when it matches)."""
    if self.param_shardings is None:
      return params
    return jax.device_put(params, self.param_shardings)


def _state_shardings(state: SamplingState, mesh):
  """Shardings of a SamplingState: cache by K_AXES / V_AXES, per-row arrays along "cache_batch" (as the cache's
  rows), the rest replicated."""

  cache_axes = {"k": K_AXES, "v": V_AXES, "kv": PAGED_AXES}  # KVCache and PagedKVCache arrays

  def one(path, x):
    names = [getattr(p, "name", getattr(p, "key", None)) for p in path]
    if names and names[0] == "cache" and names[1] in cache_axes:
      return sharding_lib.named_sharding(mesh, cache_axes[names[1]], x.shape)
    if x.ndim >= 1 and names[0] != "key":
      return sharding_lib.named_sharding(mesh, ("cache_batch",) + (None,) * (x.ndim - 1), x.shape)
    return jax.sharding.NamedSharding(mesh, jax.P())

  return jax.tree_util.tree_map_with_path(one, state)


def _rows_sharding(mesh, shape):
  return sharding_lib.named_sharding(mesh, ("cache_batch",) + (None,) * (len(shape) - 1), shape)


def make_sampler(graphdef: nnx.GraphDef, model_cfg: ModelConfig, sampling: SamplingConfig, *, batch: int,
                 mesh: jax.sharding.Mesh | None = None, params: nnx.State | None = None,
                 n_forced: int = 0) -> Sampler:
  """Jits the sampler functions.

  The state argument is donated: the KV cache is the largest buffer the sampler owns (B x S x layers), and
  without donation every call would allocate a second cache and copy the first into it; donated, XLA updates
  it in place. Callers must therefore never reuse a state after passing it in.

  Args:
    graphdef: the model's graph (`nnx.split(model)[0]`).
    model_cfg: the model's config (cache shapes).
    sampling: sampling settings.
    batch: B, the number of row slots.
    mesh: if given, every function is jitted with explicit in/out shardings on it (params by their logical
      axes; cache and rows along the batch axes) and runs under `jax.set_mesh(mesh)`.
    params: an example params state (abstract is fine) to derive param shardings; required with a mesh.
    n_forced: F > 0 enables teacher forcing with up to F forced tokens per turn.
  """
  if batch < 1:
    raise ValueError(f"make_sampler: batch must be >= 1, got {batch}")
  g = functools.partial
  split_layers = g(unstack_layers, num_layers=model_cfg.num_layers)
  fns = dict(
      prefill_groups=lambda n: g(prefill_groups, graphdef, sampling, n),
      extend=lambda: g(extend, graphdef, sampling),
      decode=lambda: g(decode, graphdef, sampling),
  )
  # Compiler options of the programs that step over the cache (decode, extend): on XLA:CPU with a small model,
  # YNNPACK for reductions only (see `attention_kernels.sampler_compiler_options`); elsewhere, and for prefill,
  # the defaults.
  cached_opts = attention_kernels.sampler_compiler_options(None if mesh is None else mesh.devices.flat[0].platform,
                                                           model_cfg)
  param_sh = None
  if mesh is None:
    jit_prefill = functools.cache(lambda n: jax.jit(fns["prefill_groups"](n), donate_argnums=(1,)))
    jit_extend = jax.jit(fns["extend"](), donate_argnums=(1,), compiler_options=cached_opts)
    jit_decode = jax.jit(fns["decode"](), donate_argnums=(1,), compiler_options=cached_opts)
    jit_decode_parts = jit_decode  # called with the split layer weights as a fifth argument
    jit_split = jax.jit(split_layers)
    jit_grow = jax.jit(grow, static_argnums=(1,))  # no donation: the padded cache cannot reuse the smaller buffer
    jit_reset = jax.jit(reset_rows, donate_argnums=(0,))
    jit_init = jax.jit(init_state, static_argnums=(0, 1, 2), static_argnames=("forced_len",))
    run = lambda f, *a, **k: f(*a, **k)
  else:
    if params is None:
      raise ValueError("make_sampler: params (or an abstract params state) are needed with a mesh")
    param_sh = sharding_lib.state_shardings(params, mesh)
    rep = jax.sharding.NamedSharding(mesh, jax.P())

    def state_sh(capacity):
      abstract = jax.eval_shape(lambda: init_state(model_cfg, batch, capacity, jax.random.key(0),
                                                   forced_len=n_forced))
      return _state_shardings(abstract, mesh)

    def seg_sh():
      s2, s1 = _rows_sharding(mesh, (batch, sampling.segment_len)), _rows_sharding(mesh, (batch,))
      return Segment(s2, s2, s2, s1, s1, s1, s1, rep)

    # The state's shardings do not depend on the capacity except through divisibility, which only involves B
    # and the kv heads; compute them once for a capacity every mesh divides.
    sst = state_sh(8)

    @functools.cache
    def jit_prefill(n):
      return jax.jit(fns["prefill_groups"](n), donate_argnums=(1,),
                     in_shardings=(param_sh, sst, rep, rep, rep, rep, None if not n_forced else rep),
                     out_shardings=(sst, None))

    jit_extend = jax.jit(fns["extend"](), donate_argnums=(1,),
                         in_shardings=(param_sh, sst, rep, rep, rep, rep, rep, None if not n_forced else rep),
                         out_shardings=(sst, None), compiler_options=cached_opts)
    jit_decode = jax.jit(fns["decode"](), donate_argnums=(1,), in_shardings=(param_sh, sst, rep, rep),
                         out_shardings=(sst, seg_sh()), compiler_options=cached_opts)
    # A layer's part of a stacked weight keeps the stacked weight's sharding of its other axes.
    part_sh = jax.tree.map(lambda sh: jax.sharding.NamedSharding(mesh, jax.P(*sh.spec[1:])), param_sh["layers"])
    parts_sh = [part_sh] * model_cfg.num_layers
    jit_decode_parts = jax.jit(fns["decode"](), donate_argnums=(1,), in_shardings=(param_sh, sst, rep, rep, parts_sh),
                               out_shardings=(sst, seg_sh()), compiler_options=cached_opts)
    jit_split = jax.jit(split_layers, in_shardings=(param_sh["layers"],), out_shardings=parts_sh)
    jit_grow = jax.jit(grow, static_argnums=(1,), in_shardings=(sst,), out_shardings=sst)
    jit_reset = jax.jit(reset_rows, donate_argnums=(0,), in_shardings=(sst, rep), out_shardings=sst)
    jit_init = jax.jit(init_state, static_argnums=(0, 1, 2), static_argnames=("forced_len",), out_shardings=sst)

    def run(f, *a, **k):
      with jax.set_mesh(mesh):
        return f(*a, **k)

  layer_parts = _LayerParts(lambda layers: run(jit_split, layers))

  def decode_call(params, state, max_steps, min_tool_stops):
    if carry_per_layer(state.cache):
      return run(jit_decode_parts, params, state, max_steps, min_tool_stops, layer_parts(params))
    return run(jit_decode, params, state, max_steps, min_tool_stops)

  return Sampler(
      model_cfg=model_cfg, sampling=sampling, batch=batch, n_forced=n_forced, mesh=mesh, param_shardings=param_sh,
      init=lambda capacity, key: run(jit_init, model_cfg, batch, capacity, key, forced_len=n_forced),
      prefill_groups=lambda n, *a: run(jit_prefill(n), *a),
      extend=lambda *a: run(jit_extend, *a),
      decode=decode_call, layer_parts=layer_parts,
      grow=lambda state, capacity: run(jit_grow, state, capacity),
      reset_rows=lambda state, rows: run(jit_reset, state, rows),
      jitted={"init": jit_init, "prefill_groups": jit_prefill, "extend": jit_extend, "decode": jit_decode,
              "grow": jit_grow, "reset_rows": jit_reset},
  )
