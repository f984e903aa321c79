"""Token log-probs and exact entropy from logits or from final hidden states (pure functions, float32).

Split from `losses.py`: these turn model outputs into the per-token arrays the losses consume. The update step
and SFT use `token_logprobs_and_entropy_from_hidden`, which fuses the LM head so [B, T, V] never exists.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from agentrl_jax.models import sharding

# ------------------------------------------------------------------------------------------------------------
# Token log-probs and entropy
# ------------------------------------------------------------------------------------------------------------
# Cost: logits are [B, T, V]; at B=16, T=20480, V=151936 that is 50e9 values (100 GB bf16), so full-size
# training must never hold them at once: use the chunked forms (B*C*V live, recomputed in the backward
# pass) or, best, `token_logprobs_and_entropy_from_hidden`, which never builds [B, T, V] at all.


def _logp_entropy(logits: Float[Array, "*N V"], tokens: Int[Array, "*N"], temperature: float):
  z = logits.astype(jnp.float32) / temperature
  # Shift by the max so lse and E_p[z] are O(1): lse - E_p[z] on raw logits of ~100 cancels catastrophically.
  z_max = lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
  z = z - jnp.where(jnp.isfinite(z_max), z_max, 0.0)
  lse = jax.nn.logsumexp(z, axis=-1)
  z_tok = jnp.take_along_axis(z, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
  p = jnp.exp(z - lse[..., None])
  # -inf logits have p = 0; zero them before the product so neither 0 * inf nor its gradient is NaN.
  z_safe = jnp.where(jnp.isneginf(z), 0.0, z)
  entropy = lse - jnp.sum(p * z_safe, axis=-1)
  return z_tok - lse, entropy


def _chunk_len(t: int, chunk_size: int | None) -> int:
  """The chunk length over T: all of T when `chunk_size` is None or covers it, else `chunk_size`, which must
  divide T."""
  if chunk_size is None or chunk_size >= t:
    return t
  if t % chunk_size:
    raise ValueError(f"chunk_size {chunk_size} must divide the sequence length {t}")
  return chunk_size


def _chunks(x: jax.Array, chunk: int, shards: int = 1) -> jax.Array:
  """[B, T, ...] -> [T / (S C), B, S C, ...]: chunk i holds tokens [i C, (i + 1) C) of each of the S equal
  parts of T, so when T is split over S devices (context parallelism) every chunk is too, C tokens a device."""
  b, t = x.shape[:2]
  x = x.reshape(b, shards, t // (shards * chunk), chunk, *x.shape[2:])
  x = jnp.moveaxis(x, 2, 0)
  x = x.reshape(x.shape[0], b, shards * chunk, *x.shape[4:])
  return _per_device(x, (None, "batch", "seq"), shards)


def _per_device(x: jax.Array, axes: tuple, shards: int) -> jax.Array:
  """With T split over `shards` > 1 devices, pins `x`'s token axis to the context axis (axes: its leading
  dims' logical names), so each chunk's logits are computed a device's share at a time; else `x` as is."""
  if shards == 1:
    return x
  return sharding.shard(x, axes + (None,) * (x.ndim - len(axes)))


def _unchunks(x: jax.Array, shards: int = 1) -> jax.Array:
  """[T / (S C), B, S C, ...] -> [B, T, ...]: the inverse of `_chunks`."""
  m, b, sc = x.shape[:3]
  x = x.reshape(m, b, shards, sc // shards, *x.shape[3:])
  x = jnp.moveaxis(x, 0, 2)
  return x.reshape(b, m * sc, *x.shape[4:])


def _chunked_over_t(fn, t: int, chunk_size: int | None):
  """Runs fn(start, size) -> (a [B, C], b [B, C]) over T in chunks, rematerialising each chunk's backward."""
  chunk = _chunk_len(t, chunk_size)
  if chunk == t:
    return fn(0, t)
  body = jax.checkpoint(lambda i: fn(i * chunk, chunk))
  a, b = lax.map(body, jnp.arange(t // chunk))  # [N, B, C] each
  return _unchunks(a), _unchunks(b)


def token_logprobs_and_entropy(
    logits: Float[Array, "B T V"],
    tokens: Int[Array, "B T"],
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """Log-probability of `tokens` and exact entropy, from logits aligned with them (float32, stable).

  `logits[b, t]` is the distribution that `tokens[b, t]` was drawn from (shift by one outside). Logits are
  divided by the sampling temperature first. Uses logsumexp, never softmax-then-log.

  Memory: the float32 working set is B*T*V*4 bytes (plus the same again for the gradient); with
  `chunk_size=C` (must divide T) it is B*C*V*4, each chunk recomputed in the backward pass.

  Args:
    logits: [B, T, V] any float dtype.
    tokens: [B, T] token ids.
    temperature: sampling temperature.
    chunk_size: optional chunk length over T.

  Returns:
    (logp [B, T], entropy [B, T]), float32.
  """

  def fn(start, size):
    lg = lax.dynamic_slice_in_dim(logits, start, size, axis=1)
    tk = lax.dynamic_slice_in_dim(tokens, start, size, axis=1)
    return _logp_entropy(lg, tk, temperature)

  return _chunked_over_t(fn, logits.shape[1], chunk_size)


def token_logprobs(
    logits: Float[Array, "B T V"], tokens: Int[Array, "B T"], *, temperature: float = 1.0
) -> Float[Array, "B T"]:
  """Log-probability (float32) of `tokens` under `logits` aligned with them; see token_logprobs_and_entropy."""
  return _logp_entropy(logits, tokens, temperature)[0]  # XLA drops the unused entropy


def entropy_from_logits(logits: Float[Array, "*N V"], *, temperature: float = 1.0) -> Float[Array, "*N"]:
  """Exact entropy (nats, float32) of softmax(logits / temperature) over the last axis.

  Uniform logits give log V; a one-hot distribution (one finite logit, the rest -inf or far below) gives 0.
  Works in log space (logsumexp), safe with -inf logits. Cost: B*T*V float32 temporaries; see
  token_logprobs_and_entropy for a chunked form.
  """
  zeros = jnp.zeros(logits.shape[:-1], jnp.int32)
  return _logp_entropy(logits, zeros, temperature)[1]


def token_logprobs_and_entropy_from_hidden(
    hidden: Float[Array, "B T D"],
    unembed_dv: Float[Array, "D V"],
    tokens: Int[Array, "B T"],
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    shards: int = 1,
) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """Like token_logprobs_and_entropy, but fused with the LM head so [B, T, V] is never materialised.

  Logits of each T-chunk are computed as `hidden @ unembed_dv` (float32 accumulation) and reduced to log-prob
  and entropy; the backward pass recomputes each chunk's logits once and forms their gradient in one
  elementwise pass (a hand-written VJP, `_fused_lm_head`): peak memory B*C*V*4 bytes instead of B*T*V.

  Args:
    hidden: [B, T, D] final hidden states (after the final norm), aligned with `tokens`.
    unembed_dv: [D, V] output projection (pass `embedding_vd.T` for tied embeddings).
    tokens: [B, T] token ids.
    temperature: sampling temperature.
    chunk_size: chunk length over T (must divide T / shards); None computes everything at once.
    shards: T's split over the devices of the context axis (context parallelism): each chunk takes
      `chunk_size` tokens of each device's part (`_chunks`), not `chunk_size` tokens of one device's.

  Returns:
    (logp [B, T], entropy [B, T]), float32.
  """
  chunk = _chunk_len(hidden.shape[1] // shards, chunk_size)
  return _fused_lm_head(hidden, unembed_dv, tokens.astype(jnp.int32), float(temperature), chunk, shards)


def _chunk_logits(h, w, temperature):
  z = jnp.einsum("BCD,DV->BCV", h, w, preferred_element_type=jnp.float32)
  return z / temperature if temperature != 1.0 else z


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _fused_lm_head(hidden, unembed_dv, tokens, temperature: float, chunk: int, shards: int):
  """(logp, entropy) per token. The forward pass also keeps each token's max logit, log-sum-exp and mean logit
  after the shift, which the backward pass reuses. Logits are finite here (a matrix product), so no -inf
  handling is needed."""
  return _fused_lm_head_fwd(hidden, unembed_dv, tokens, temperature, chunk, shards)[0]


def _fused_lm_head_fwd(hidden, unembed_dv, tokens, temperature, chunk, shards):
  def one(args):
    h, tk = args
    z = _per_device(_chunk_logits(h, unembed_dv, temperature), ("batch", "seq", "act_vocab"), shards)
    z_max = jnp.max(z, axis=-1, keepdims=True)
    zs = z - z_max  # O(1) lse and E_p[z]: see _logp_entropy
    e = jnp.exp(zs)
    total = jnp.sum(e, axis=-1)
    lse = jnp.log(total)
    mean_z = jnp.sum(e * zs, axis=-1) / total
    z_tok = jnp.take_along_axis(zs, tk[..., None], axis=-1)[..., 0]
    return z_tok - lse, lse - mean_z, (z_max[..., 0], lse, mean_z)

  logp, entropy, stats = lax.map(one, (_chunks(hidden, chunk, shards), _chunks(tokens, chunk, shards)))
  unchunks = functools.partial(_unchunks, shards=shards)
  return (unchunks(logp), unchunks(entropy)), (hidden, unembed_dv, tokens, jax.tree.map(unchunks, stats))


def _fused_lm_head_bwd(temperature, chunk, shards, res, cotangents):
  """d logp / dz = onehot(token) - p and d entropy / dz = -p (z - E_p[z]), so the logits' gradient is
  `g_lp onehot - p (g_lp + g_ent (z - E_p[z]))`, one pass over the recomputed chunk; then the two products."""
  hidden, w, tokens, (z_max, lse, mean_z) = res
  g_lp, g_ent = (g.astype(jnp.float32) for g in cotangents)
  v = w.shape[-1]

  def one(dw, args):
    h, tk, m, l, mz, glp, gent = args
    zs = _per_device(_chunk_logits(h, w, temperature), ("batch", "seq", "act_vocab"), shards) - m[..., None]
    p = jnp.exp(zs - l[..., None])
    onehot = jnp.arange(v, dtype=jnp.int32) == tk[..., None]
    dz = jnp.where(onehot, glp[..., None], 0.0) - p * (glp[..., None] + gent[..., None] * (zs - mz[..., None]))
    if temperature != 1.0:
      dz = dz / temperature
    dz = dz.astype(w.dtype)
    dh = jnp.einsum("BCV,DV->BCD", dz, w, preferred_element_type=jnp.float32).astype(hidden.dtype)
    dw = dw + jnp.einsum("BCD,BCV->DV", h, dz, preferred_element_type=jnp.float32)
    return dw, dh

  xs = tuple(_chunks(x, chunk, shards) for x in (hidden, tokens, z_max, lse, mean_z, g_lp, g_ent))
  dw, dh = lax.scan(one, jnp.zeros(w.shape, jnp.float32), xs)
  return _unchunks(dh, shards), dw.astype(w.dtype), None


_fused_lm_head.defvjp(_fused_lm_head_fwd, _fused_lm_head_bwd)
