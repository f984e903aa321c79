"""Token log-probs and exact entropy from logits or from final hidden states (pure functions, float32).

Split from `losses.py`: these turn model outputs into the per-token arrays the losses consume. The update step
and SFT use `token_logprobs_and_entropy_from_hidden`, which fuses the LM head so [B, T, V] never exists.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

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


def _chunked_over_t(fn, t: int, chunk_size: int | None):
  """Runs fn(start, size) -> (a [B, C], b [B, C]) over T in chunks, rematerialising each chunk's backward."""
  if chunk_size is None or chunk_size >= t:
    return fn(0, t)
  if t % chunk_size:
    raise ValueError(f"chunk_size {chunk_size} must divide the sequence length {t}")
  body = jax.checkpoint(lambda i: fn(i * chunk_size, chunk_size))
  a, b = lax.map(body, jnp.arange(t // chunk_size))  # [N, B, C] each
  unchunk = lambda x: jnp.moveaxis(x, 0, 1).reshape(x.shape[1], t)  # noqa: E731
  return unchunk(a), unchunk(b)


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
) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """Like token_logprobs_and_entropy, but fused with the LM head so [B, T, V] is never materialised.

  Logits of each T-chunk are computed as `hidden @ unembed_dv` (float32 accumulation), reduced to log-prob
  and entropy, and recomputed in the backward pass: peak memory B*C*V*4 bytes instead of B*T*V.

  Args:
    hidden: [B, T, D] final hidden states (after the final norm), aligned with `tokens`.
    unembed_dv: [D, V] output projection (pass `embedding_vd.T` for tied embeddings).
    tokens: [B, T] token ids.
    temperature: sampling temperature.
    chunk_size: chunk length over T (must divide T); None computes everything at once.

  Returns:
    (logp [B, T], entropy [B, T]), float32.
  """

  def fn(start, size):
    h = lax.dynamic_slice_in_dim(hidden, start, size, axis=1)
    tk = lax.dynamic_slice_in_dim(tokens, start, size, axis=1)
    lg = jnp.einsum("BCD,DV->BCV", h, unembed_dv, preferred_element_type=jnp.float32)
    return _logp_entropy(lg, tk, temperature)

  return _chunked_over_t(fn, hidden.shape[1], chunk_size)
