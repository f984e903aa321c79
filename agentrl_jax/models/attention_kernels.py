"""Fused attention kernels that JAX ships, for causal self-attention without a cache (training, scoring).

`ModelConfig.attention_impl` chooses:

* `xla`: the model's own blocked attention (`qwen._causal_blocked_attention` over `dense_attention`); every
  backend.
* `splash`: the TPU splash attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`): scores never
  leave VMEM and blocks above the diagonal, or across packed segments, are skipped. One MQA kernel per kv head
  serves its group of query heads (GQA without repeating keys). Under a mesh it runs per shard (`shard_map`
  over the batch and kv-head axes, as the kernel is not partitionable by GSPMD). `attention_interpret=True`
  runs it in Pallas interpret mode, so the CPU tests check it against `xla`; they also export the model's
  gradient for a TPU through the real forward and backward kernels, on one chip and per shard.
* `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN's flash attention on NVIDIA GPUs.
* `ragged_paged`: splash as above without a cache, and every pass over the KV cache (decode, extend after a
  tool call, prefill) through the TPU ragged paged attention kernel
  (`jax.experimental.pallas.ops.tpu.ragged_paged_attention`) over a `PagedKVCache`: each row's queries read the
  pages its own length covers, so a short row does not pay for the batch's capacity, and rows of different
  chunk lengths share one call (queries packed back to back, `cu_q_lens`). JAX's Pallas TPU interpreter cannot
  run this kernel (it reshapes refs), so `attention_interpret=True` substitutes `paged_attention_reference`,
  the same contract in XLA, tested against JAX's own reference; the kernel itself has a TPU lowering test.

A kernel chosen on a backend that cannot run it fails at trace time with the reason, never silently falls
back. With the other choices, passes over the KV cache use the `xla` path; on XLA:CPU a decode step's attention
over the cache is our own kernel, which reads each row's own length (`cpu_kernels`, `length_aware_decode`).
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int
import numpy as np

from agentrl_jax import compile_stats
from agentrl_jax.models import cpu_kernels, kv_cache

log = logging.getLogger(__name__)

_BACKENDS = {"splash": ("tpu",), "cudnn": ("gpu",), "ragged_paged": ("tpu",)}
_INTERPRETABLE = ("splash", "ragged_paged")


def dense_attention(qg: Float[Array, "B T K G H"], k: Float[Array, "B S K H"], v: Float[Array, "B S K H"],
                    mask_bts: Array, scale: float) -> Float[Array, "B T K G H"]:
  """Softmax attention of T queries over S keys under a `[B, T, S]` mask; scores and softmax in float32 (the
  `xla` path's core, and of the XLA statement of the ragged paged kernel).

  The backward pass is written out (`_dense_attention_bwd`): autodiff's gradients (pinned by
  tests/models/test_qwen_grad.py), with every product arranged as `[M, K] x [K, N]` by transposing the small
  operands (q, k, v and dO: T or S x head_dim) instead of the `[T, S]` ones. Autodiff's products for dK and dV
  contract over the queries, and XLA:CPU met them by copying the `[S, T]`-sized probabilities and score
  gradients into transposed layouts: fwd+bwd of one bench_58m layer at 2 x 1024 tokens, 185-231 -> 139-143 ms.
  """
  return _dense_attention(qg, k, v, mask_bts, scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _dense_attention(qg, k, v, mask_bts, scale):
  return _dense_attention_fwd(qg, k, v, mask_bts, scale)[0]


def _dense_attention_fwd(qg, k, v, mask_bts, scale):
  scores = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(mask_bts[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("BKGTS,BSKH->BTKGH", probs.astype(qg.dtype), v)
  return out, (qg, k, v, mask_bts, probs, out)


# XLA:CPU compiler options of the sampler's programs that step over the KV cache, decode and extend
# (`sampling.sampler.make_sampler`), with `decode_by_reduction`, for models whose layer matrices are small. jaxlib
# hands a program's dots and reductions to YNNPACK by default; at decode shapes (a handful of rows against a small
# weight matrix) YNNPACK's dots were 3-20x slower than XLA's own (bench_5m, B=16, one step: LM head
# [16,256]x[256,4096] 556 -> 26 us, MLP [16,256]x[256,768] ~200 -> ~60 us), while its reductions are fast. Keeping
# YNNPACK for reductions only, and writing decode attention as reductions (its batched dots are then XLA's, 2x
# slower than YNNPACK's), a decode step took, alternating in one process (median of 8-14 calls of 64 steps):
# bench_5m B=16 3.70 -> 3.39 ms, bench_58m B=16 27.0 -> 23.5 ms, bench_5m B=64 at capacity 512 23.6 -> 20.7 ms
# and at 1024 38.6 -> 36.4 ms. Extend (a tool response appended to a few rows) gained too: its time in
# bench.rollout's round, 4.3-4.6 -> 3.8-4.0 s over 43 calls. Training and prefill keep the defaults (the update
# step, thousands of rows, measured 6.0-6.6 s either way and compiles 30% faster with YNNPACK's dots).
# Since the decode step's attention became our own kernel (`length_aware_decode`), the reductions left are the
# norms and the vocabulary softmax, and the choice turns on the weight matrices: see `YNN_DOTS_MIN_MATRIX`.
CPU_SAMPLER_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}

# A model whose largest layer matrix (hidden x intermediate, the MLP's) has at least this many elements keeps
# XLA:CPU's default options in decode and extend too (YNNPACK's dots as well as its reductions): for the larger
# models a step with YNNPACK's dots is faster than with XLA's own dot kernels. Measured with the attention kernel in
# place, decode steps of 128 tokens after a 64-token prompt, B=16 unless stated, reductions-only against the
# defaults alternating in one process (scratch script, median of 4 calls each):
#   bench_58m (512 x 1536 = 786K)        24.3-25.8 -> 21.7-23.5 ms (defaults 9-12% faster, three runs)
#   bench_58m at 512 x 1024 (524K)       18.3 -> 18.1 ms (1% faster)
#   bench_58m at 384 x 1152 (442K)       16.7 -> 15.8 ms (6% faster)
#   bench_5m (256 x 768 = 197K)          2.45 -> 2.55 ms (4% slower); at B=64 7.60 -> 7.27 ms (within the noise)
#   demo_1m, B=128 (128 x 384 = 49K)     2.74 -> 2.97 ms (8% slower)
# The threshold sits between 197K and 442K, at 1 MiB of float32.
YNN_DOTS_MIN_MATRIX = 256 * 1024


def sampler_compiler_options(platform: str | None = None, model_cfg=None) -> dict[str, str] | None:
  """Compiler options of the sampler's decode and extend programs for `platform` (default this process's
  backend) and the model `model_cfg` (a `ModelConfig`; None: a small model): `CPU_SAMPLER_COMPILER_OPTIONS` on
  XLA:CPU for a model whose layer matrices are under `YNN_DOTS_MIN_MATRIX` elements (see
  `decode_by_reduction`), else None (XLA's defaults)."""
  if (platform or jax.default_backend()) != "cpu":
    return None
  if model_cfg is not None and model_cfg.hidden_size * model_cfg.intermediate_size >= YNN_DOTS_MIN_MATRIX:
    return None
  return CPU_SAMPLER_COMPILER_OPTIONS


def decode_by_reduction() -> bool:
  """True where one-query attention over the cache is written as reductions (`single_query_attention`): on
  XLA:CPU, whose decode and extend programs are compiled with `CPU_SAMPLER_COMPILER_OPTIONS`. Accelerators keep
  the batched matmuls (their matrix units). Decided by the platform compiled for (`target_platform`), so a
  program lowered for a TPU from a CPU host takes the TPU's form."""
  return target_platform() == "cpu"


def length_aware_decode(dtype) -> bool:
  """True where a decode step's attention takes our XLA:CPU kernel (`cpu_kernels.single_query_attention`, each
  row's own length) instead of `single_query_attention` (the whole capacity under the mask): on XLA:CPU
  (`decode_by_reduction`), float32 activations, one device (the kernel is a custom call GSPMD cannot split; a
  multi-device mesh keeps the reductions), and the kernel built (`cpu_kernels.available`)."""
  mesh = jax.sharding.get_abstract_mesh()
  return (decode_by_reduction() and jnp.dtype(dtype) == jnp.float32 and (mesh.empty or mesh.size == 1)
          and cpu_kernels.available())


ROW_KERNEL_MIN_LEN = 256  # rows up to one default attention block keep the dense form (one small block of XLA's)


def row_attention_kernel(dtype, t: int) -> bool:
  """True where causal self-attention of packed rows without a cache (training, scoring; the model asks only when
  it has segment ids) takes our XLA:CPU kernel (`cpu_kernels.causal_attention`: each query against its own
  segment's earlier keys only, padding skipped) instead of `causal_blocked_attention` (every block up to the
  diagonal under the mask): on XLA:CPU, float32, one device (a custom call GSPMD cannot split), rows longer than
  `ROW_KERNEL_MIN_LEN`, and the kernel built.

  Measured (fwd+bwd of one layer, 2 kv heads x 2 queries, 2 rows): rows of 1,536 tokens holding one 900-token
  episode each (`bench.async_rl`'s packed update) 99 -> 19 ms with 16-dim heads and 130 -> 50 ms with 64; rows of
  one sequence filling them 7.7 -> 6.3 ms (512 tokens, 16 dims) but 58 -> 65 ms (1,024 tokens, 64 dims: XLA's
  matmuls do more per query-key pair than the kernel's tiles). So it serves packed rows, where it skips other
  episodes and padding; rows of one sequence (`segment_ids` None: the update bench's, unpacked updates, scoring)
  keep the dense form, and so do rows up to 256 tokens (the main job's)."""
  mesh = jax.sharding.get_abstract_mesh()
  return (target_platform() == "cpu" and jnp.dtype(dtype) == jnp.float32 and t > ROW_KERNEL_MIN_LEN
          and (mesh.empty or mesh.size == 1) and cpu_kernels.available())


def single_query_attention(q: Float[Array, "B K G H"], k_t: Float[Array, "B K H S"], v: Float[Array, "B K S H"],
                           mask_bs: Array, scale: float) -> Float[Array, "B K G H"]:
  """One query per row and head over the cache (a decode step), as multiply-and-reduce instead of batched
  matmuls: the same sums (scores and the softmax in float32, the value sum accumulated in float32), which
  XLA:CPU fuses into one pass over each half of the cache. See `CPU_SAMPLER_COMPILER_OPTIONS`."""
  f32 = jnp.float32
  scores = jnp.sum(q.astype(f32)[..., None] * k_t.astype(f32)[:, :, None], axis=3) * scale  # [B, K, G, S]
  scores = jnp.where(mask_bs[:, None, None, :], scores, jnp.finfo(f32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  out = jnp.sum(probs.astype(f32)[..., None] * v.astype(f32)[:, :, None], axis=3)  # [B, K, G, H]
  return out.astype(q.dtype)


def bmm(a: Array, b: Array, preferred_element_type=jnp.float32) -> Array:
  """`[B, K, M, C] x [B, K, C, N] -> [B, K, M, N]`, batched over the rows and kv heads, written with
  `lax.dot_general` and `a` first (`jnp.einsum` may swap the operands; see `qwen._cached_attention`)."""
  return jax.lax.dot_general(a, b, (((3,), (2,)), ((0, 1), (0, 1))), preferred_element_type=preferred_element_type)


def group_queries(x: Float[Array, "B T K G H"]) -> Float[Array, "B K GT H"]:
  """Queries (or anything shaped like them) as the rows of one matrix per (row, kv head): `[B, K, G*T, H]`."""
  b, t, nk, g, h = x.shape
  return jnp.transpose(x, (0, 2, 3, 1, 4)).reshape(b, nk, g * t, h)


def ungroup_queries(x: Float[Array, "B K GT H"], t: int) -> Float[Array, "B T K G H"]:
  """The inverse of `group_queries`."""
  b, nk, gt, h = x.shape
  return jnp.transpose(x.reshape(b, nk, gt // t, t, h), (0, 3, 1, 2, 4))


def group_mask(mask_bts: Array, groups: int) -> Array:
  """A `[B, T, S]` mask laid out as `group_queries` lays out the queries: `[B, 1, G*T, S]`."""
  b, t, s = mask_bts.shape
  return jnp.broadcast_to(mask_bts[:, None, None], (b, 1, groups, t, s)).reshape(b, 1, groups * t, s)


def _dense_attention_bwd(scale, res, d_out):
  qg, k, v, mask_bts, probs, out = res
  b, t, nk, g, h = qg.shape
  s, dt = k.shape[1], qg.dtype
  cols = lambda x: jnp.transpose(x, (0, 2, 4, 3, 1)).reshape(b, nk, h, g * t)  # noqa: E731  [B, K, H, G*T]
  p = probs.reshape(b, nk, g * t, s)
  d_o = group_queries(d_out)
  d_v_t = bmm(cols(d_out), p.astype(dt))  # [B, K, H, S]
  d_p = bmm(d_o, jnp.transpose(v, (0, 2, 3, 1)))  # [B, K, G*T, S]
  row = jnp.sum(d_o.astype(jnp.float32) * group_queries(out).astype(jnp.float32), axis=-1, keepdims=True)
  # softmax backward; masked scores get none
  d_s = jnp.where(group_mask(mask_bts, g), p * (d_p - row) * scale, 0.0).astype(dt)
  d_q = ungroup_queries(bmm(d_s, jnp.transpose(k, (0, 2, 1, 3))), t).astype(dt)
  d_k_t = bmm(cols(qg), d_s)  # [B, K, H, S]
  return (d_q, jnp.transpose(d_k_t, (0, 3, 1, 2)).astype(k.dtype), jnp.transpose(d_v_t, (0, 3, 1, 2)).astype(v.dtype),
          None)


_dense_attention.defvjp(_dense_attention_fwd, _dense_attention_bwd)


def target_platform() -> str:
  """The platform being compiled for: the abstract mesh's device when it names one (lowering for a TPU from
  another host: the lowering tests), else this process's backend."""
  device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
  return device.platform if device is not None else jax.default_backend()


def check_backend(impl: str, interpret: bool = False) -> None:
  """Raises ValueError when `impl` cannot run on the target platform (interpret mode runs anywhere)."""
  backend = target_platform()
  if impl in _BACKENDS and backend not in _BACKENDS[impl] and not (interpret and impl in _INTERPRETABLE):
    hint = " (or attention_interpret=True to run the Pallas kernel in interpret mode, for tests)" \
        if impl in _INTERPRETABLE else ""
    raise ValueError(f"ModelConfig.attention_impl={impl!r} runs on {'/'.join(_BACKENDS[impl])}, and this "
                     f"process's backend is {backend!r}: use attention_impl='xla'{hint}")


def splash_block_sizes(block: int):
  """The kernel's block sizes: one square block for the forward and both backward kernels."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

  return sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block, block_kv_dkv=block,
                       block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)


@functools.cache
def _splash_kernel(groups: int, t: int, block: int, interpret: bool):
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(groups)])
  # Concrete mask tables, built once per shape (made inside a trace they would be that trace's tracers).
  with jax.ensure_compile_time_eval():
    return sk.make_splash_mqa_single_device(mask, block_sizes=splash_block_sizes(block), interpret=interpret)


def splash_block(t: int) -> int:
  """The kernel's block: the largest of 512, 256 and 128 tokens that divides T."""
  for block in (512, 256, 128):
    if t % block == 0:
      return block
  raise ValueError(f"attention_impl='splash' needs a sequence length that is a multiple of 128, got {t}: pad "
                   "the batch to such a bucket")


def auto_impl(backend: str | None = None, *, device=None, head_dim: int | None = None) -> str:
  """`attention_impl="auto"`: on a TPU, the kernels that compile for its chip at this head dim, in order of
  preference: "ragged_paged" (splash for training and scoring, the ragged paged kernel over the cache), then
  "splash"; each refusal is logged with the compiler's reason. "xla" elsewhere (cuDNN is opt-in until measured
  on a GPU).

  Args:
    backend: the platform compiled for (default this process's).
    device: a device of the target chip (default this process's first device); a topology's device when
      compiling for a slice from another host (`agentrl_jax.aot`).
    head_dim: the model's head dim (the kernels' constraints depend on it); default 128.
  """
  backend = backend or jax.default_backend()
  if backend != "tpu":
    return "xla"
  device = device or jax.devices()[0]
  head_dim = head_dim or 128
  for impl in ("ragged_paged", "splash"):
    why = kernel_refusal(impl, device, head_dim)
    if why is None:
      return impl
    log.warning("attention_impl='auto': not %r on %s at head_dim %d: %s", impl, device.device_kind, head_dim, why)
  return "xla"


@functools.cache
def kernel_refusal(impl: str, device, head_dim: int) -> str | None:
  """None when `impl`'s TPU kernels compile for `device`'s chip at `head_dim` (bfloat16, a tiny causal problem:
  splash forward and backward, and for "ragged_paged" also one ragged paged decode step over a two-layer paged
  cache), else the reason. Compiled by the real TPU compiler (Mosaic), once per chip and head dim."""
  if impl == "ragged_paged" and head_dim % 128:
    return f"the ragged paged kernel needs a head_dim that is a multiple of 128, got {head_dim}"
  mesh = jax.sharding.Mesh(np.asarray([device]), ("data",))
  sh = jax.sharding.NamedSharding(mesh, jax.P())
  spec = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype, sharding=sh)  # noqa: E731
  t, page = 256, 64
  splash_grad = jax.jit(jax.grad(lambda q, k, v: splash_attention(q, k, v, None, 1.0).astype(jnp.float32).sum(),
                                 argnums=(0, 1, 2)))
  try:
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), compile_stats.persistent_cache_off():
      splash_grad.trace(spec((1, t, 1, 2, head_dim)), spec((1, t, 1, head_dim)),
                        spec((1, t, 1, head_dim))).lower().compile()
      if impl == "ragged_paged":
        step = jax.jit(lambda q, kv, lengths: ragged_paged_attention(q, kv, 1, lengths, jnp.ones_like(lengths), 1.0,
                                                                     page))
        step.trace(spec((2, 1, 1, 2, head_dim)), spec((2, 2, t, 2, head_dim)),
                   spec((2,), jnp.int32)).lower().compile()
  except Exception as e:  # pylint: disable=broad-except  # the compiler's refusal is the answer
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
  return None


def splash_call(kernel, qg: Float[Array, "B Tq K G H"], k: Float[Array, "B S K H"], v: Float[Array, "B S K H"],
                seg_q: Int[Array, "B Tq"] | None, seg_kv: Int[Array, "B S"] | None, scale: float
                ) -> Float[Array, "B Tq K G H"]:
  """One MQA splash `kernel` per (row, kv head), over its group of query heads; `seg_q`/`seg_kv` None: the
  kernel's mask alone, without loading or comparing ids."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

  q = jnp.transpose(qg * jnp.asarray(scale, qg.dtype), (0, 2, 3, 1, 4))  # [B, K, G, T, H]
  kt, vt = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))  # [B, K, S, H]
  if seg_q is None:
    return jnp.transpose(jax.vmap(jax.vmap(kernel))(q, kt, vt), (0, 3, 1, 2, 4)).astype(qg.dtype)
  one = lambda q, k, v, sq, skv: kernel(q, k, v, segment_ids=sk.SegmentIds(q=sq, kv=skv))  # noqa: E731  [G, T, H]
  per_head = jax.vmap(one, in_axes=(0, 0, 0, None, None))
  out = jax.vmap(per_head, in_axes=(0, 0, 0, 0, 0))(q, kt, vt, seg_q, seg_kv)  # [B, K, G, T, H]
  return jnp.transpose(out, (0, 3, 1, 2, 4)).astype(qg.dtype)


def splash_local(qg: Float[Array, "B T K G H"], k: Float[Array, "B T K H"], v: Float[Array, "B T K H"],
                 segment_ids: Int[Array, "B T"] | None, scale: float, *, interpret: bool = False
                 ) -> Float[Array, "B T K G H"]:
  """Causal splash attention of whole rows on one device (or inside a per-device computation)."""
  b, t, nk, g, h = qg.shape
  kernel = _splash_kernel(g, t, splash_block(t), interpret)
  return splash_call(kernel, qg, k, v, segment_ids, segment_ids, scale)


def splash_attention(qg: Float[Array, "B T K G H"], k: Float[Array, "B T K H"], v: Float[Array, "B T K H"],
                     segment_ids: Int[Array, "B T"] | None, scale: float, *, interpret: bool = False
                     ) -> Float[Array, "B T K G H"]:
  """Causal attention within packed segments through the splash kernel (see module docstring); with
  `segment_ids=None` (one sequence per row) the kernel's causal mask alone, without loading or comparing ids."""
  b, t, nk, g, h = qg.shape
  local = functools.partial(splash_local, scale=scale, interpret=interpret)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(qg, k, v, segment_ids)
  from agentrl_jax.models import sharding as sharding_lib

  batch = sharding_lib.logical_to_spec(("batch",), (b,), mesh)[0]
  heads = sharding_lib.logical_to_spec(("act_kv_heads",), (nk,), mesh)[0]
  spec = jax.P(batch, None, heads, None, None)
  seg_spec = None if segment_ids is None else jax.P(batch, None)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, jax.P(batch, None, heads, None),
                                                   jax.P(batch, None, heads, None), seg_spec),
                       out_specs=spec, check_vma=False)(qg, k, v, segment_ids)


def causal_blocked_attention(qg: Float[Array, "B T K G H"], k: Float[Array, "B T K H"], v: Float[Array, "B T K H"],
                             mask_bts: Array, scale: float, block: int) -> Float[Array, "B T K G H"]:
  """Causal self-attention by query blocks: block i attends to keys [0, end of block i) only.

  The keys above the diagonal block are masked anyway, so skipping them halves the attention FLOPs and the
  score memory at long T (the full [B, N, T, T] scores at T = 20480 would not fit). Exact: every query sees the
  same keys as in the dense form (the mask still applies inside the kept blocks: causal + packed segments).
  """
  t = qg.shape[1]
  if not block or t <= block:
    return dense_attention(qg, k, v, mask_bts, scale)
  outs = []
  for start in range(0, t, block):
    end = min(start + block, t)
    outs.append(dense_attention(qg[:, start:end], k[:, :end], v[:, :end], mask_bts[:, start:end, :end], scale))
  return jnp.concatenate(outs, axis=1)


def cudnn_attention(qg: Float[Array, "B T K G H"], k: Float[Array, "B T K H"], v: Float[Array, "B T K H"],
                    segment_ids: Int[Array, "B T"] | None, scale: float, *, implementation: str = "cudnn"
                    ) -> Float[Array, "B T K G H"]:
  """Causal attention through `jax.nn.dot_product_attention` on `[B, T, N, H]` queries and `[B, T, K, H]` keys
  (GQA natively); `implementation="xla"` runs the same call on any backend (the parity tests).

  The causal part is cuDNN's own mask type (`is_causal`), so the kernel skips the blocks above the diagonal and
  reads no mask. Packed rows (`segment_ids` given) add the segment mask, which cuDNN takes as a dense `[B, 1, T, T]`
  additive bias (read in the forward and backward passes, and a bias gradient computed and dropped); rows of one
  sequence each (the RL update and scoring, `segment_ids=None`) need none: the model's mask for them is causal
  alone on every path.
  """
  b, t, nk, g, h = qg.shape
  q = qg.reshape(b, t, nk * g, h)
  mask = None if segment_ids is None else (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
  out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=True, implementation=implementation)
  return out.reshape(b, t, nk, g, h)


# ------------------------------------------------------------------------------------------------ ragged paged
def _pack(x: Float[Array, "B T ..."], cu: Int[Array, "B+1"]) -> Float[Array, "BT ..."]:
  """Rows' first `cu[b+1] - cu[b]` entries of `x`, back to back (the kernel's ragged query layout); zeros after."""
  b, t = x.shape[:2]
  j = jnp.arange(b * t, dtype=jnp.int32)
  row = jnp.clip(jnp.searchsorted(cu, j, side="right") - 1, 0, b - 1)
  col = jnp.clip(j - cu[row], 0, t - 1)
  return jnp.where((j < cu[b]).reshape((-1,) + (1,) * (x.ndim - 2)), x[row, col], 0)


def _unpack(y: Float[Array, "BT ..."], cu: Int[Array, "B+1"], t: int) -> Float[Array, "B T ..."]:
  """Inverse of `_pack`: entry (b, i) from `y[cu[b] + i]` for i < its row's length, zeros after."""
  b = cu.shape[0] - 1
  i = jnp.arange(t, dtype=jnp.int32)
  src = jnp.clip(cu[:-1, None] + i[None, :], 0, y.shape[0] - 1)
  keep = (i[None, :] < (cu[1:] - cu[:-1])[:, None]).reshape((b, t) + (1,) * (y.ndim - 1))
  return jnp.where(keep, y[src], 0)


def paged_attention_reference(q: Float[Array, "Q N H"], kv_pages: Float[Array, "P S 2K H"],
                              kv_lens: Int[Array, "B"], page_indices: Int[Array, "B Pr"], cu_q_lens: Int[Array, "B+1"],
                              num_seqs: Int[Array, "1"], *, sm_scale: float, max_q_len: int | None = None
                              ) -> Float[Array, "Q N H"]:
  """The ragged paged attention kernel's contract in XLA (jittable): sequence s's queries
  `q[cu_q_lens[s]:cu_q_lens[s+1]]` are its last tokens and attend causally over the first `kv_lens[s]` slots of
  its pages `page_indices[s]`; keys at even, values at odd combined heads. Query rows past `cu_q_lens[num_seqs]`
  are zero. Dense over each row's pages (it is the CPU stand-in, not a fast path); `max_q_len` bounds a
  sequence's queries (default: all of them)."""
  nq, n, h = q.shape
  b, pages = page_indices.shape
  _, page, ck, _ = kv_pages.shape
  nk = ck // 2
  kv = kv_pages[page_indices].reshape(b, pages * page, ck, h).astype(q.dtype)  # [B, S, 2K, H]
  k, v = kv[:, :, 0::2], kv[:, :, 1::2]
  t = max_q_len or nq
  cu_q_lens = jnp.where(jnp.arange(b + 1) <= num_seqs[0], cu_q_lens, cu_q_lens[num_seqs[0]])  # later rows: none
  qb = _unpack(q, cu_q_lens, t)  # [B, T, N, H]
  q_len = cu_q_lens[1:] - cu_q_lens[:-1]
  pos = (kv_lens - q_len)[:, None] + jnp.arange(t)[None, :]  # [B, T]
  keep = jnp.arange(pages * page)[None, None, :] <= pos[:, :, None]
  keep &= (jnp.arange(pages * page)[None, None, :] < kv_lens[:, None, None])
  out = dense_attention(qb.reshape(b, t, nk, n // nk, h), k, v, keep, sm_scale)
  out = _pack(out.reshape(b, t, n, h).astype(q.dtype), cu_q_lens)
  out = out[:nq]  # packed queries fill at most the first nq rows
  return jnp.pad(out, ((0, nq - out.shape[0]), (0, 0), (0, 0)))


def _kernel_block_sizes(pages_per_seq: int, num_q_tokens: int) -> dict:
  """The kernel's block sizes: JAX's tuned table on a TPU; when lowering for a TPU elsewhere (tests), a fixed
  choice (the table needs the chip's version)."""
  if jax.default_backend() == "tpu":  # on the chip itself (not an abstract target)
    return {}
  return {"num_kv_pages_per_block": min(pages_per_seq, 8), "num_queries_per_block": min(32, num_q_tokens)}


def ragged_paged_attention(qg: Float[Array, "B T K G H"], kv: Float[Array, "B L S 2K H"], layer,
                           lengths: Int[Array, "B"], chunk_lengths: Int[Array, "B"], scale: float, page_size: int, *,
                           interpret: bool = False) -> Float[Array, "B T K G H"]:
  """Attention of each row's first `chunk_lengths[b]` queries (its newest tokens, already written at slots
  `lengths[b] + t` of layer `layer` of the stacked `kv`) over its `lengths[b] + chunk_lengths[b]` cached tokens,
  through the ragged paged attention kernel; query positions past a row's chunk come back as zeros.

  The kernel reads the whole stacked cache as its page pool (`[B * L * S / page_size, page_size, 2K, H]`, a
  reshape, no copy) through layer `layer`'s page table, so a scanned decoder passes it its carry as is."""
  b, t, nk, g, h = qg.shape
  layer = jnp.asarray(layer, jnp.int32)

  def local(qg, kv, layer, lengths, chunk_lengths):
    bl, nl, s = kv.shape[:3]
    nk_l = kv.shape[3] // 2
    if not interpret and h % 128:
      raise ValueError(f"attention_impl='ragged_paged': the kernel needs a head_dim that is a multiple of 128, "
                       f"got {h}")
    cu = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(chunk_lengths.astype(jnp.int32))])
    q = _pack(qg.reshape(bl, t, nk_l * g, h), cu)  # [B*T, N, H]
    pages_per_row = s // page_size
    pages = kv.reshape(bl * nl * pages_per_row, page_size, 2 * nk_l, h)
    page_indices = kv_cache.static_page_table(bl, pages_per_row, nl, layer)
    args = (q, pages, (lengths + chunk_lengths).astype(jnp.int32), page_indices, cu, jnp.array([bl], jnp.int32))
    if interpret:
      out = paged_attention_reference(*args, sm_scale=scale, max_q_len=t)
    else:
      from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

      # An 8-bit cache (`ModelConfig.kv_cache_dtype`) is read through the kernel's scales (1: stored as is), which
      # convert it to the queries' dtype.
      scales = dict(k_scale=1.0, v_scale=1.0) if jnp.dtype(kv.dtype).itemsize == 1 else {}
      out = rpa.ragged_paged_attention(*args, sm_scale=scale, **scales,
                                       **_kernel_block_sizes(pages_per_row, bl * t))
    return _unpack(out, cu, t).reshape(bl, t, nk_l, g, h).astype(qg.dtype)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(qg, kv, layer, lengths, chunk_lengths)
  from agentrl_jax.models import sharding as sharding_lib

  batch = sharding_lib.logical_to_spec(("batch",), (b,), mesh)[0]
  heads = sharding_lib.logical_to_spec(("act_kv_heads",), (nk,), mesh)[0]
  return jax.shard_map(local, mesh=mesh,
                       in_specs=(jax.P(batch, None, heads, None, None), jax.P(batch, None, None, heads, None), jax.P(),
                                 jax.P(batch), jax.P(batch)),
                       out_specs=jax.P(batch, None, heads, None, None), check_vma=False)(
                           qg, kv, layer, lengths, chunk_lengths)
