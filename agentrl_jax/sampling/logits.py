"""Drawing tokens from logits: temperature, top-k, top-p, greedy; log-probs under both distributions.

Two log-probs come back for every token:
  logp_raw     log softmax(logits)[token]: the policy at temperature 1, what the trainer's importance ratio
               compares against;
  logp_sample  log of the probability the token was actually drawn with (tempered and filtered), for
               truncated importance sampling; 0 under greedy decoding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from agentrl_jax.sampling.config import SamplingConfig

_NEG_INF = -jnp.inf


def sampling_logits(logits: Float[Array, "R V"], cfg: SamplingConfig) -> Float[Array, "R V"]:
  """Logits of the sampling distribution: tempered, then top-k / top-p filtered (removed tokens at -inf).

  top-p follows `transformers`: keep the smallest set of most likely tokens whose mass reaches `top_p` (the
  token that crosses the threshold is kept; at least one token always is).
  """
  x = logits.astype(jnp.float32)
  if cfg.temperature != 1.0:
    x = x / cfg.temperature
  v = x.shape[-1]
  if cfg.top_k and cfg.top_k < v:
    kth = jax.lax.top_k(x, cfg.top_k)[0][:, -1:]
    x = jnp.where(x < kth, _NEG_INF, x)
  if cfg.top_p < 1:
    # Sort once (descending); the threshold is the logit of the last kept token.
    k = cfg.top_k if cfg.top_k and cfg.top_k < v else v
    top = jax.lax.top_k(x, k)[0]
    probs = jax.nn.softmax(top, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the strictly more likely tokens
    n_keep = jnp.maximum(jnp.sum(before < cfg.top_p, axis=-1, keepdims=True), 1)
    threshold = jnp.take_along_axis(top, n_keep - 1, axis=-1)
    x = jnp.where(x < threshold, _NEG_INF, x)
  return x


def sample(logits: Float[Array, "R V"], key: jax.Array, cfg: SamplingConfig,
           forced: Int[Array, "R"] | None = None) -> tuple[Int[Array, "R"], Float[Array, "R"], Float[Array, "R"]]:
  """Draws one token per row.

  Args:
    logits: `[R, V]` float32 next-token logits of the policy.
    key: PRNG key for this draw (all rows).
    cfg: sampling settings (static).
    forced: optional `[R]` tokens to emit instead of sampling where >= 0 (teacher forcing; their log-probs are
      still computed, and a forced token outside the filtered set has `logp_sample = -inf`).

  Returns:
    `(tokens [R] int32, logp_raw [R], logp_sample [R])`.
  """
  logits = logits.astype(jnp.float32)
  lse_raw = jax.nn.logsumexp(logits, axis=-1)
  if cfg.greedy:
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  else:
    x = sampling_logits(logits, cfg)
    token = jax.random.categorical(key, x, axis=-1).astype(jnp.int32)
  if forced is not None:
    token = jnp.where(forced >= 0, forced, token).astype(jnp.int32)
  picked = jnp.take_along_axis(logits, token[:, None], axis=-1)[:, 0]
  logp_raw = picked - lse_raw
  if cfg.greedy:
    logp_sample = jnp.where(token == jnp.argmax(logits, axis=-1), 0.0, _NEG_INF)
  elif not cfg.filters and cfg.temperature == 1.0:
    logp_sample = logp_raw
  else:
    x_picked = jnp.take_along_axis(x, token[:, None], axis=-1)[:, 0]
    logp_sample = x_picked - jax.nn.logsumexp(x, axis=-1)
  return token, logp_raw, logp_sample
