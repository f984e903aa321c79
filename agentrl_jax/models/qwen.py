"""Qwen2/2.5 and Qwen3 decoders in Flax NNX.

Parameter names spell their dimensions (`q_dnh` is `[D, N, H]`) and carry `logical_axes` metadata that
`sharding.LOGICAL_RULES` maps onto the mesh. Dimensions: B batch, T query tokens, S key/cache slots,
D hidden, N query heads, K kv heads, G = N // K, H head dim, F MLP width, V vocabulary.

One `__call__` serves three uses:
* training / scoring: `model(tokens)` (optionally `positions`, `segment_ids` for packed rows);
* prefill, decode and extend: `model(tokens, cache=cache, chunk_lengths=...)` appends the chunk to the cache.

The decoder layers' parameters are stacked along a leading layer axis (`model.layers.attn.q_dnh` is
`[L, D, N, H]`), and the KV cache holds every layer's keys and values row by row (`[B, L, ...]`). With `ModelConfig.scan_layers` (the default) the stack
runs as one `lax.scan` over that axis, so a program holds one layer's code whatever the depth and compiles in
time independent of it (MaxText's `scan_layers`); with remat, the scanned body is rematerialised. Unrolled
(`scan_layers=False`), the same parameters are split into L layers and run one after the other: the same sums,
L copies of the layer's code.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from agentrl_jax.models import attention_kernels, context_parallel, cpu_kernels
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import KVCache, PagedKVCache, write_chunk, write_chunk_paged
from agentrl_jax.models.sharding import shard

_INIT_STD = 0.02  # HF's initializer_range for Qwen


def _param(rngs: nnx.Rngs | None, shape, axes, dtype, init: str = "normal") -> nnx.Param:
  if init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    value = (_INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, logical_axes=tuple(axes))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """RMSNorm computed in float32, as HF Qwen does, then cast back to the input dtype."""
  xf = x.astype(jnp.float32)
  xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return weight.astype(x.dtype) * xf.astype(x.dtype)


def rope_angles(positions: Int[Array, "B T"], head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """cos and sin `[B, T, 1, H]` (float32) of the rotary angles; computed once per forward, shared by the layers."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
  return jnp.cos(emb), jnp.sin(emb)


def rope(x: Float[Array, "B T N H"], cos_sin: tuple[jax.Array, jax.Array]) -> Float[Array, "B T N H"]:
  """Rotary embedding, non-interleaved halves (HF `rotate_half` convention)."""
  cos, sin = (a.astype(x.dtype) for a in cos_sin)
  x1, x2 = jnp.split(x, 2, axis=-1)
  return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def _cached_attention(qg: Float[Array, "B T K G H"], k_t: Float[Array, "B K H S"], v: Float[Array, "B K S H"],
                      mask_bts: Array, scale: float, valid: Int[Array, "B"]) -> Float[Array, "B T K G H"]:
  """Attention of T queries per row over the cache (keys transposed `[B, K, H, S]`, values `[B, K, S, H]`).

  Both products are batched matmuls over (B, K) whose operands lie in memory as the kernel reads them (see
  `kv_cache`), so a decode step streams each half of the cache once. They are written with `lax.dot_general`
  and the query first: `jnp.einsum` may swap the operands, and XLA:CPU then reads the cache through a
  transposed-operand kernel (2-3x slower). Scores and softmax in float32, as in `attention_kernels.dense_attention`.
  A decode step on XLA:CPU (one query per row) reads only each row's `valid[b]` slots (the mask's prefix) with
  our kernel (`cpu_kernels.single_query_attention`) where `attention_kernels.length_aware_decode` allows it, and
  nothing of a row with `valid[b] == 0` (a row outside the step, whose output is dropped: in a rollout's pause
  most rows have stopped while the longest turns finish); else it takes the multiply-and-reduce form
  (`attention_kernels.single_query_attention`) over every slot of every row.
  """
  if qg.shape[1] == 1 and attention_kernels.decode_by_reduction():
    if attention_kernels.length_aware_decode(qg.dtype):
      return cpu_kernels.single_query_attention(qg[:, 0], k_t, v, valid, scale).astype(qg.dtype)[:, None]
    return attention_kernels.single_query_attention(qg[:, 0], k_t, v, mask_bts[:, 0], scale)[:, None]
  scores = attention_kernels.bmm(attention_kernels.group_queries(qg), k_t) * scale  # [B, K, G*T, S]
  keep = attention_kernels.group_mask(mask_bts, qg.shape[3])
  probs = jax.nn.softmax(jnp.where(keep, scores, jnp.finfo(jnp.float32).min), axis=-1).astype(qg.dtype)
  out = attention_kernels.bmm(probs, v, preferred_element_type=None)  # [B, K, G*T, H]
  return attention_kernels.ungroup_queries(out, qg.shape[1])


class Attention(nnx.Module):
  """GQA self-attention with optional qkv bias (Qwen2) and per-head q/k RMSNorm (Qwen3)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, n, k, h, pd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.jnp_param_dtype
    self.q_dnh = _param(rngs, (d, n, h), ("embed", "heads", "head_dim"), pd)
    self.k_dkh = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pd)
    self.v_dkh = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pd)
    self.o_nhd = _param(rngs, (n, h, d), ("heads", "head_dim", "embed"), pd)
    if cfg.qkv_bias:
      self.q_bias_nh = _param(rngs, (n, h), ("heads", "head_dim"), pd, "zeros")
      self.k_bias_kh = _param(rngs, (k, h), ("kv_heads", "head_dim"), pd, "zeros")
      self.v_bias_kh = _param(rngs, (k, h), ("kv_heads", "head_dim"), pd, "zeros")
    if cfg.qk_norm:
      self.q_norm_h = _param(rngs, (h,), ("norm",), pd, "ones")
      self.k_norm_h = _param(rngs, (h,), ("norm",), pd, "ones")

  def __call__(self, x_btd, rope_cs, mask_bts, cache_kv=None, layer=None, cache_lengths=None, segment_ids=None,
               chunk_lengths=None, dropout_key=None, context=None):
    """Returns `(out [B, T, D], the updated cache arrays or None)`; `rope_cs` is `rope_angles` of the positions.
    `segment_ids` `[B, T]` (no cache; None: one sequence per row) feed the fused kernels, which build the causal +
    segment mask themselves. `context` (no cache): the rows' `context_parallel.Layout` when their tokens are
    split over the context axis (then `mask_bts` is None and attention masks by true token indices).

    Without a cache, keys are this chunk's own (S = T). With one (the stacked arrays of every layer, `(k, v)` of
    a `KVCache` or `(kv,)` of a `PagedKVCache`, and this layer's index `layer`, an int or a traced scalar), the
    chunk's keys/values are first written at slots `cache_lengths[b] + t` of layer `layer`, then the queries
    attend over that layer's cache: all S slots under the mask, or (paged) the row's own
    `cache_lengths[b] + chunk_lengths[b]` tokens. The arrays are updated in place (a scan carry or a donated
    buffer), never sliced out and written back whole.
    """
    cfg, dt = self.cfg, self.cfg.jnp_dtype
    q = jnp.einsum("BTD,DNH->BTNH", x_btd, self.q_dnh[...].astype(dt))
    k = jnp.einsum("BTD,DKH->BTKH", x_btd, self.k_dkh[...].astype(dt))
    v = jnp.einsum("BTD,DKH->BTKH", x_btd, self.v_dkh[...].astype(dt))
    q, k, v = (lora_lib.add(self, name, y, x_btd, dropout_key) for name, y in (("q", q), ("k", k), ("v", v)))
    if cfg.qkv_bias:
      q = q + self.q_bias_nh[...].astype(dt)
      k = k + self.k_bias_kh[...].astype(dt)
      v = v + self.v_bias_kh[...].astype(dt)
    if cfg.qk_norm:
      q = rms_norm(q, self.q_norm_h[...], cfg.rms_norm_eps)
      k = rms_norm(k, self.k_norm_h[...], cfg.rms_norm_eps)
    q = shard(rope(q, rope_cs), ("batch", "seq", "act_heads", None))
    k = shard(rope(k, rope_cs), ("batch", "seq", "act_kv_heads", None))
    v = shard(v, ("batch", "seq", "act_kv_heads", None))

    b, t = q.shape[:2]
    qg = q.reshape(b, t, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim)
    scale = cfg.head_dim ** -0.5
    new_cache = None
    if cache_kv is not None and cfg.attention_impl == "ragged_paged":
      new_cache = (write_chunk_paged(cache_kv[0], k, v, cache_lengths, layer),)
      out = attention_kernels.ragged_paged_attention(qg, new_cache[0], layer, cache_lengths, chunk_lengths,
                                                     scale, cfg.kv_page_size, interpret=cfg.attention_interpret)
    elif cache_kv is not None:
      new_cache = write_chunk(*cache_kv, k, v, cache_lengths, layer)
      k_t, v_l = (jax.lax.dynamic_index_in_dim(a, layer, 1, keepdims=False).astype(dt) for a in new_cache)
      # The mask's prefix per row; 0 for a row with nothing in this chunk, whose output is dropped (a decode
      # step's stopped or waiting rows). In cache mode `Qwen.__call__` always passes `chunk_lengths`.
      valid = jnp.where(chunk_lengths > 0, cache_lengths + t, 0)
      out = _cached_attention(qg, k_t, v_l, mask_bts, scale, valid)
    elif context is not None:
      if cfg.attention_impl == "cudnn":
        raise ValueError("attention_impl='cudnn' has no context-parallel form: use 'xla' or a mesh with context=1")
      impl = "xla" if cfg.attention_impl == "xla" else "splash"
      out = context_parallel.attention(qg, k, v, segment_ids, scale, context, impl=impl,
                                       interpret=cfg.attention_interpret)
    elif cfg.attention_impl in ("splash", "ragged_paged"):
      out = attention_kernels.splash_attention(qg, k, v, segment_ids, scale, interpret=cfg.attention_interpret)
    elif cfg.attention_impl == "cudnn":
      out = attention_kernels.cudnn_attention(qg, k, v, segment_ids, scale)
    elif segment_ids is not None and attention_kernels.row_attention_kernel(qg.dtype, t):
      out = cpu_kernels.causal_attention(qg, k, v, segment_ids, scale).astype(qg.dtype)
    else:
      out = attention_kernels.causal_blocked_attention(qg, k, v, mask_bts, scale, cfg.attention_block)
    out = out.reshape(b, t, cfg.num_heads, cfg.head_dim)
    out = lora_lib.add(self, "o", _output_projection(out, self.o_nhd[...].astype(dt)), out, dropout_key)
    return shard(out, ("batch", "seq", "act_embed")), new_cache


def _output_projection(out_btnh: Float[Array, "B T N H"], o_nhd: Array) -> Float[Array, "B T D"]:
  """The attention output projection. On XLA:CPU one contraction over the flattened heads: contracting (N, H) as
  two dimensions, XLA:CPU orders them (H, N) inside the decode loop and copies the whole weight into that order on
  every step (58M benchmark model: 8 copies of 1 MiB a step). Other platforms keep the two-dimension form, whose
  TPU programs the pre-flight measured (the flattened form grew the recipe's extend program's code and compile
  time there); chosen by the platform compiled for, as the attention reductions are."""
  if attention_kernels.target_platform() != "cpu":
    return jnp.einsum("BTNH,NHD->BTD", out_btnh, o_nhd)
  b, t, n, h = out_btnh.shape
  return jnp.einsum("BTF,FD->BTD", out_btnh.reshape(b, t, n * h), o_nhd.reshape(n * h, o_nhd.shape[-1]))


@jax.custom_vjp
def swiglu(x_btd: Float[Array, "B T D"], gate_df: Array, up_df: Array, down_fd: Array) -> Float[Array, "B T D"]:
  """`down(silu(x @ gate) * (x @ up))` with a hand-written backward pass.

  The derivative is the one autodiff builds (same residuals: x, x @ gate, x @ up), written as one elementwise
  expression per gradient and plain einsums. Autodiff of `silu(g) * u` on XLA:CPU materialised the silu
  backward as transposing copies of the `[B*T, F]` gradients (one per gate and up per layer) for the weight
  products: fwd+bwd of the bench_58m MLP at 2 x 1024 tokens went from ~300 ms to ~210 ms
  (`tests/models/test_qwen_grad.py` pins the gradients to autodiff's).
  """
  return _swiglu_fwd(x_btd, gate_df, up_df, down_fd)[0]


def _swiglu_fwd(x_btd, gate_df, up_df, down_fd):
  gate = jnp.einsum("BTD,DF->BTF", x_btd, gate_df)
  up = jnp.einsum("BTD,DF->BTF", x_btd, up_df)
  act_btf = shard(jax.nn.silu(gate) * up, ("batch", "seq", "act_mlp"))
  out = shard(jnp.einsum("BTF,FD->BTD", act_btf, down_fd), ("batch", "seq", "act_embed"))
  return out, (x_btd, gate, up, gate_df, up_df, down_fd)


def _swiglu_bwd(res, d_out):
  x, gate, up, gate_df, up_df, down_fd = res
  sig = jax.nn.sigmoid(gate)
  silu = gate * sig
  d_act = shard(jnp.einsum("BTD,FD->BTF", d_out, down_fd), ("batch", "seq", "act_mlp"))
  d_down = jnp.einsum("BTF,BTD->FD", silu * up, d_out)
  d_up = d_act * silu
  d_gate = d_act * up * (sig * (1 + gate * (1 - sig)))  # silu'(g) = s + g s (1 - s)
  d_x = jnp.einsum("BTF,DF->BTD", d_gate, gate_df) + jnp.einsum("BTF,DF->BTD", d_up, up_df)
  return (shard(d_x.astype(x.dtype), ("batch", "seq", "act_embed")),
          jnp.einsum("BTD,BTF->DF", x, d_gate).astype(gate_df.dtype),
          jnp.einsum("BTD,BTF->DF", x, d_up).astype(up_df.dtype), d_down.astype(down_fd.dtype))


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


def swiglu_autodiff(x_btd: Float[Array, "B T D"], gate_df: Array, up_df: Array, down_fd: Array
                    ) -> Float[Array, "B T D"]:
  """`swiglu` with autodiff's backward pass: the form accelerators compile. On a TPU the hand-written backward
  costs compile time and work: the recipe's update step (Qwen3-4B, v5p, one scanned layer, 16 x 8192 tokens)
  compiled in 116 CPU s with it against 83 without, and XLA's cost analysis counted 8.0e12 against 6.6e12 FLOPs
  (`python -m agentrl_jax.aot` measures both)."""
  return _swiglu_fwd(x_btd, gate_df, up_df, down_fd)[0]


def mlp_for_platform(platform: str):
  """The SwiGLU a platform compiles best: the hand-written backward on XLA:CPU (where it was tuned), autodiff's
  elsewhere."""
  return swiglu if platform == "cpu" else swiglu_autodiff


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)) (`swiglu`)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.jnp_param_dtype
    self.gate_df = _param(rngs, (d, f), ("embed", "mlp"), pd)
    self.up_df = _param(rngs, (d, f), ("embed", "mlp"), pd)
    self.down_fd = _param(rngs, (f, d), ("mlp", "embed"), pd)

  def __call__(self, x_btd, dropout_key=None):
    dt = self.cfg.jnp_dtype
    gate_df, up_df, down_fd = (w[...].astype(dt) for w in (self.gate_df, self.up_df, self.down_fd))
    if lora_lib.has_adapters(self, ("gate", "up", "down")):  # adapters beside the frozen products (autodiff)
      gate = lora_lib.add(self, "gate", jnp.einsum("BTD,DF->BTF", x_btd, gate_df), x_btd, dropout_key)
      up = lora_lib.add(self, "up", jnp.einsum("BTD,DF->BTF", x_btd, up_df), x_btd, dropout_key)
      act_btf = shard(jax.nn.silu(gate) * up, ("batch", "seq", "act_mlp"))
      out = lora_lib.add(self, "down", jnp.einsum("BTF,FD->BTD", act_btf, down_fd), act_btf, dropout_key)
      return shard(out, ("batch", "seq", "act_embed"))
    return mlp_for_platform(attention_kernels.target_platform())(x_btd, gate_df, up_df, down_fd)


class DecoderLayer(nnx.Module):
  """Pre-norm residual block: x + attn(norm(x)); x + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.attn_norm_d = _param(rngs, (cfg.hidden_size,), ("norm",), cfg.jnp_param_dtype, "ones")
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm_d = _param(rngs, (cfg.hidden_size,), ("norm",), cfg.jnp_param_dtype, "ones")
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_btd, rope_cs, mask_bts, cache_kv=None, layer=None, cache_lengths=None, segment_ids=None,
               chunk_lengths=None, dropout_key=None, context=None):
    eps = self.cfg.rms_norm_eps
    keys = (None, None) if dropout_key is None else tuple(jax.random.split(dropout_key))
    h, new_cache = self.attn(rms_norm(x_btd, self.attn_norm_d[...], eps), rope_cs, mask_bts, cache_kv, layer,
                             cache_lengths, segment_ids, chunk_lengths, keys[0], context)
    x_btd = x_btd + h
    x_btd = x_btd + self.mlp(rms_norm(x_btd, self.mlp_norm_d[...], eps), keys[1])
    return x_btd, new_cache


def _stack_layers(layers: list[DecoderLayer]) -> DecoderLayer:
  """One `DecoderLayer` whose every parameter stacks the layers' along a new leading axis (logical name
  "layers", never sharded). The layers are built one by one first, so a random init draws the same numbers as
  a model of separate layers would."""
  graphdef, _ = nnx.split(layers[0])
  states = [nnx.split(layer)[1] for layer in layers]

  def stack(*vs):
    axes = ("layers",) + tuple(vs[0].get_metadata().get("logical_axes") or ())
    return vs[0].replace(jnp.stack([v.get_value() for v in vs]), logical_axes=axes)

  return nnx.merge(graphdef, jax.tree.map(stack, *states, is_leaf=lambda x: isinstance(x, nnx.Variable)))


def unstack_layers(stacked: nnx.State, num_layers: int) -> list[nnx.State]:
  """The stacked layer state as `num_layers` per-layer states (`lax.split`: its gradient is one concatenate)."""
  leaves, treedef = jax.tree.flatten(stacked)
  parts = [[p[0] for p in jnp.split(a, num_layers)] for a in leaves]
  return [jax.tree.unflatten(treedef, [leaf_parts[i] for leaf_parts in parts]) for i in range(num_layers)]


class Qwen(nnx.Module):
  """A Qwen2/2.5 or Qwen3 causal language model (the family is chosen by `cfg`)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.jnp_param_dtype
    self.embed_vd = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
    self.layers = _stack_layers([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm_d = _param(rngs, (cfg.hidden_size,), ("norm",), pd, "ones")
    if not cfg.tie_embeddings:
      self.unembed_dv = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)

  def __call__(
      self,
      tokens: Int[Array, "B T"],
      *,
      positions: Int[Array, "B T"] | None = None,
      segment_ids: Int[Array, "B T"] | None = None,
      cache: KVCache | PagedKVCache | None = None,
      chunk_lengths: Int[Array, "B"] | None = None,
      return_hidden: bool = False,
      dropout_key: jax.Array | None = None,
      in_context_layout: bool = False,
  ) -> tuple[Float[Array, "B T V"] | Float[Array, "B T D"], KVCache | PagedKVCache | None]:
    """Runs the decoder.

    Args:
      tokens: `[B, T]` token ids; rows are right-padded.
      positions: `[B, T]` RoPE positions (no-cache mode only); default `arange(T)`.
      segment_ids: `[B, T]` ids of packed sequences (no-cache mode only): tokens attend within their segment.
      cache: if given, the chunk is appended to it (prefill / decode / extend) and attends to all its context.
      chunk_lengths: `[B]` valid tokens of each row's chunk (cache mode); default T for every row.
      return_hidden: return the final normalised hidden states `[B, T, D]` instead of logits (for chunked
        log-prob computation; see `unembed`).
      dropout_key: LoRA dropout on the adapters' inputs (training updates; no-cache mode); None: none.
      in_context_layout: no-cache mode under a mesh whose `context` axis splits the rows' tokens
        (`context_parallel.layout_for`): `tokens`, `positions` (then required) and `segment_ids` are already in
        the load-balanced layout, and so is the output. By default the model puts them in it and the output
        back in token order.

    Returns:
      `(logits [B, T, V] float32 or hidden [B, T, D], new cache or None)`.
    """
    cfg = self.cfg
    b, t = tokens.shape
    segs = None
    q_idx = jnp.arange(t, dtype=jnp.int32)
    layout = context_parallel.layout_for(t, cfg) if cache is None else None
    if layout is not None:
      # Tokens split over the context axis, in the load-balanced layout: attention masks by true indices.
      if in_context_layout and positions is None:
        raise ValueError("in_context_layout=True needs the positions of the laid-out tokens")
      if not in_context_layout:
        positions = jnp.broadcast_to(q_idx, (b, t)) if positions is None else positions
        tokens, positions = context_parallel.to_layout(tokens, layout), context_parallel.to_layout(positions, layout)
        if segment_ids is not None:
          segment_ids = context_parallel.to_layout(segment_ids, layout)
      if cfg.attention_impl != "xla":
        attention_kernels.check_backend(cfg.attention_impl, cfg.attention_interpret)
      segs, mask = None if segment_ids is None else segment_ids.astype(jnp.int32), None
    x = jnp.take(self.embed_vd[...], tokens, axis=0).astype(cfg.jnp_dtype)
    x = shard(x, ("batch", "seq", "act_embed"))
    if cache is None and layout is None:
      if positions is None:
        positions = jnp.broadcast_to(q_idx, (b, t))
      mask = q_idx[None, :, None] >= q_idx[None, None, :]  # causal over this chunk
      if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
      mask = jnp.broadcast_to(mask, (b, t, t))
      segs = None if segment_ids is None else segment_ids.astype(jnp.int32)
      if cfg.attention_impl != "xla":
        attention_kernels.check_backend(cfg.attention_impl, cfg.attention_interpret)
    elif cache is not None:
      if positions is not None or segment_ids is not None:
        raise ValueError("positions/segment_ids are implied by the cache; do not pass them in cache mode")
      if chunk_lengths is None:
        chunk_lengths = jnp.full((b,), t, jnp.int32)
      positions = cache.lengths[:, None] + q_idx[None, :]
      if isinstance(cache, PagedKVCache):
        if cfg.attention_impl != "ragged_paged":
          raise ValueError("a PagedKVCache is read by attention_impl='ragged_paged' only, got "
                           f"{cfg.attention_impl!r}")
        attention_kernels.check_backend(cfg.attention_impl, cfg.attention_interpret)
        mask = None  # the kernel masks by each row's length
      else:
        slots = jnp.arange(cache.max_len, dtype=jnp.int32)
        mask = slots[None, None, :] <= positions[:, :, None]

    rope_cs = rope_angles(positions, cfg.head_dim, cfg.rope_theta)
    arrays = None if cache is None else cache.arrays()
    x, arrays = self._run_layers(x, rope_cs, mask, arrays, None if cache is None else cache.lengths, segs,
                                 chunk_lengths, None if cache is not None else dropout_key, layout)
    x = rms_norm(x, self.final_norm_d[...], cfg.rms_norm_eps)
    if layout is not None and not in_context_layout:
      x = shard(context_parallel.from_layout(x, layout), ("batch", "seq", "act_embed"))
    new_cache = None
    if cache is not None:
      new_cache = cache.with_arrays(arrays, cache.lengths + chunk_lengths.astype(jnp.int32))
    if return_hidden:
      return x, new_cache
    return self.unembed(x), new_cache

  def _run_layers(self, x, rope_cs, mask, arrays, lengths, segs, chunk_lengths, dropout_key=None, layout=None):
    """The decoder stack over the stacked layer params: one scanned body or L unrolled calls (module
    docstring). `arrays` are the stacked cache arrays (cache mode), carried through the layers and updated in
    place; returns `(x, arrays)`. `dropout_key` (no-cache mode): split into one key per layer."""
    cfg = self.cfg
    layer_def, stacked = nnx.split(self.layers)
    keys = None if dropout_key is None else jax.random.split(dropout_key, cfg.num_layers)

    def one(state, x, arrays, i, key=None):
      return nnx.merge(layer_def, state)(x, rope_cs, mask, arrays, i, lengths, segs, chunk_lengths, key,
                                         layout)

    if arrays is not None and isinstance(arrays[0], tuple):  # a cache of one array per layer (`per_layer`)
      out = []
      for i, state in enumerate(unstack_layers(stacked, cfg.num_layers)):
        x, layer_arrays = one(state, x, tuple(a[i] for a in arrays), 0)
        out.append(layer_arrays)
      return x, tuple(zip(*out))
    if cfg.scan_layers:
      if arrays is None:
        def body(x, xs):
          return one(xs[0], x, None, None, xs[1])[0], None

        if cfg.remat:
          body = jax.checkpoint(body, prevent_cse=False)  # inside a scan, CSE cannot merge the recomputation
        x, _ = jax.lax.scan(body, x, (stacked, keys))
        return x, None

      def cached_body(carry, xs):
        return one(xs[0], *carry, xs[1]), None

      (x, arrays), _ = jax.lax.scan(cached_body, (x, arrays), (stacked, jnp.arange(cfg.num_layers)))
      return x, arrays
    step = jax.checkpoint(one, static_argnums=(3,)) if cfg.remat and arrays is None else one
    for i, state in enumerate(unstack_layers(stacked, cfg.num_layers)):
      x, arrays = step(state, x, arrays, i, None if keys is None else keys[i])
    return x, arrays

  def unembed(self, hidden: Float[Array, "... D"]) -> Float[Array, "... V"]:
    """Hidden states -> float32 logits (the unembedding matmul accumulates in float32)."""
    dt = self.cfg.jnp_dtype
    if self.cfg.tie_embeddings:
      logits = jnp.einsum("...D,VD->...V", hidden.astype(dt), self.embed_vd[...].astype(dt),
                          preferred_element_type=jnp.float32)
    else:
      logits = jnp.einsum("...D,DV->...V", hidden.astype(dt), self.unembed_dv[...].astype(dt),
                          preferred_element_type=jnp.float32)
    return logits
