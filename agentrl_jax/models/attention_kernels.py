"""Fused attention kernels that JAX ships, for causal self-attention without a cache (training, scoring).

`ModelConfig.attention_impl` chooses:

* `xla`: the model's own blocked attention (`qwen._causal_blocked_attention`); every backend.
* `splash`: the TPU splash attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`): scores never
  leave VMEM and blocks above the diagonal, or across packed segments, are skipped. One MQA kernel per kv head
  serves its group of query heads (GQA without repeating keys). Under a mesh it runs per shard (`shard_map`
  over the batch and kv-head axes, as the kernel is not partitionable by GSPMD). `attention_interpret=True`
  runs it in Pallas interpret mode, so the CPU tests check it against `xla`.
* `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN's flash attention on NVIDIA GPUs.

A kernel chosen on a backend that cannot run it fails at trace time with the reason, never silently falls
back. Decode over the KV cache keeps the `xla` path on every backend (its queries are one token per row).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

_BACKENDS = {"splash": ("tpu",), "cudnn": ("gpu",)}


def check_backend(impl: str, interpret: bool = False) -> None:
  """Raises ValueError when `impl` cannot run on this process's backend (interpret mode runs anywhere)."""
  backend = jax.default_backend()
  if impl in _BACKENDS and backend not in _BACKENDS[impl] and not (interpret and impl == "splash"):
    hint = " (or attention_interpret=True to run the Pallas kernel in interpret mode, for tests)" \
        if impl == "splash" else ""
    raise ValueError(f"ModelConfig.attention_impl={impl!r} runs on {'/'.join(_BACKENDS[impl])}, and this "
                     f"process's backend is {backend!r}: use attention_impl='xla'{hint}")


@functools.cache
def _splash_kernel(groups: int, t: int, block: int, interpret: bool):
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(groups)])
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  # Concrete mask tables, built once per shape (made inside a trace they would be that trace's tracers).
  with jax.ensure_compile_time_eval():
    kernel = sk.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)
  return kernel, sk.SegmentIds


def splash_block(t: int) -> int:
  """The kernel's block: the largest of 512, 256 and 128 tokens that divides T."""
  for block in (512, 256, 128):
    if t % block == 0:
      return block
  raise ValueError(f"attention_impl='splash' needs a sequence length that is a multiple of 128, got {t}: pad "
                   "the batch to such a bucket")


def auto_impl() -> str:
  """`attention_impl="auto"`: splash on TPU, the XLA path elsewhere (cuDNN is opt-in until measured on a GPU)."""
  return "splash" if jax.default_backend() == "tpu" else "xla"


def splash_attention(qg: Float[Array, "B T K G H"], k: Float[Array, "B T K H"], v: Float[Array, "B T K H"],
                     segment_ids: Int[Array, "B T"], scale: float, *, interpret: bool = False
                     ) -> Float[Array, "B T K G H"]:
  """Causal attention within packed segments through the splash kernel (see module docstring)."""
  b, t, nk, g, h = qg.shape
  kernel, segment_cls = _splash_kernel(g, t, splash_block(t), interpret)

  def local(qg, k, v, seg):
    q = jnp.transpose(qg * jnp.asarray(scale, qg.dtype), (0, 2, 3, 1, 4))  # [B, K, G, T, H]
    kt, vt = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))  # [B, K, T, H]
    one = lambda q, k, v, s: kernel(q, k, v, segment_ids=segment_cls(q=s, kv=s))  # noqa: E731  [G, T, H]
    per_head = jax.vmap(one, in_axes=(0, 0, 0, None))
    out = jax.vmap(per_head, in_axes=(0, 0, 0, 0))(q, kt, vt, seg)  # [B, K, G, T, H]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).astype(qg.dtype)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(qg, k, v, segment_ids)
  from agentrl_jax.models import sharding as sharding_lib

  batch = sharding_lib.logical_to_spec(("batch",), (b,), mesh)[0]
  heads = sharding_lib.logical_to_spec(("act_kv_heads",), (nk,), mesh)[0]
  spec = jax.P(batch, None, heads, None, None)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, jax.P(batch, None, heads, None),
                                                   jax.P(batch, None, heads, None), jax.P(batch, None)),
                       out_specs=spec, check_vma=False)(qg, k, v, segment_ids)


def cudnn_attention(qg: Float[Array, "B T K G H"], k: Float[Array, "B T K H"], v: Float[Array, "B T K H"],
                    mask_bts: Array, scale: float, *, implementation: str = "cudnn") -> Float[Array, "B T K G H"]:
  """`jax.nn.dot_product_attention` on `[B, T, N, H]` queries and `[B, T, K, H]` keys (GQA natively), with the
  causal + segment mask; `implementation="xla"` runs the same call on any backend (the parity tests)."""
  b, t, nk, g, h = qg.shape
  q = qg.reshape(b, t, nk * g, h)
  out = jax.nn.dot_product_attention(q, k, v, mask=mask_bts[:, None], scale=scale, implementation=implementation)
  return out.reshape(b, t, nk, g, h)
