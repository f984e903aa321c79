"""The one compiled GRPO update step and the old/reference log-prob pass (the train state: `train_state`).

    graphdef, state = init_train_state(model, opt_cfg, mesh)
    shardings = train_state_shardings(state, mesh)
    update = make_update_fn(graphdef, shardings, loss_cfg, opt_cfg, mesh, micro_batch_size=4)
    logprobs = make_logprobs_fn(graphdef, shardings.params, mesh, micro_batch_size=8)
    batch["old_logp"] = logprobs(state.params, {"tokens": batch["tokens"]})
    state, metrics = update(state, batch, rng)        # `state` is donated: do not reuse the old one

Batch layout (every array is token-aligned, [B, T] unless noted; B is the mini-batch):
  tokens        int  [B, T]  prompt + response (model tokens and tool output), right padded.
  loss_mask     any  [B, T]  nonzero on model-generated tokens to train on; 0 on prompt, tool output, padding.
  advantages    f32  [B] or [B, T]  per sequence (broadcast over the mask) or per token.
  old_logp      f32  [B, T]  log p_old(tokens[b, t] | tokens[b, :t]), from `make_logprobs_fn`.
  sampler_logp  f32  [B, T]  the sampler's log-probs (behaviour policy); required iff LossConfig.needs_proximal_logp
                             (off-policy correction: old_logp must then be the trainer's recomputation, the
                             proximal policy). Without a correction it only feeds the off-policy metrics.
  ref_logp      f32  [B, T]  reference log-probs; required iff LossConfig.needs_reference (KL on).
  positions     int  [B, T]  optional RoPE positions (packed rows); default arange(T).
  segment_ids   int  [B, T]  optional packed-sequence ids (the first token of each segment must have mask 0:
                             it is scored from the previous segment's last position).
Log-prob alignment: the model's output at position t predicts token t + 1, so `logp[:, t]` scores `tokens[:, t]`
using the hidden state at t - 1; `logp[:, 0]` is 0 and position 0 is never trained (the mask there is ignored).
"""

from __future__ import annotations

from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array, Float
import optax

from agentrl_jax.models import context_parallel
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import logprobs, losses, offpolicy
# The train state the update step changes (re-exported: callers of make_update_fn build it with these).
from agentrl_jax.train_state import (OptimizerConfig, TrainState, abstract_train_state,  # noqa: F401
                                     init_train_state, join_trainable, split_trainable, train_state_shardings)

Batch = dict[str, Any]
REQUIRED_KEYS = ("tokens", "loss_mask", "advantages", "old_logp")
OPTIONAL_KEYS = ("sampler_logp", "ref_logp", "positions", "segment_ids")
LOGPROB_KEYS = ("tokens", "positions", "segment_ids")


# ------------------------------------------------------------------------------------------------------------
# Batch
# ------------------------------------------------------------------------------------------------------------


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of every batch array: the leading B axis over the data-parallel mesh axes, the rest replicated."""
  return NamedSharding(mesh, sharding_lib.logical_to_spec(("batch",), None, mesh))


# ------------------------------------------------------------------------------------------------------------
# Forward: token-aligned log-probs and entropy from hidden states
# ------------------------------------------------------------------------------------------------------------


def _chunk_len(t: int, chunk: int | None) -> int | None:
  """Largest divisor of T that is <= chunk (None: no chunking)."""
  if chunk is None or chunk >= t:
    return None
  return max(c for c in range(1, chunk + 1) if t % c == 0)


def token_logprobs(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batch: Batch,
    *,
    temperature: float = 1.0,
    logits_chunk_size: int | None = 512,
    dropout_key: jax.Array | None = None,
) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """Token-aligned (logp, entropy) [B, T] float32 of `batch["tokens"]` under the model; position 0 is 0.

  `logp[:, t]` is log p(tokens[:, t] | tokens[:, :t]) at `temperature` and `entropy[:, t]` the exact entropy
  of that distribution. Runs the decoder to hidden states and reduces the LM head chunk by chunk, so [B, T, V]
  logits never exist (see logprobs.token_logprobs_and_entropy_from_hidden). `dropout_key`: LoRA dropout.

  Under a mesh whose `context` axis splits the rows (`models/context_parallel.py`), the inputs enter the
  model in its load-balanced layout and the LM head works in that layout too, a device's tokens at a time; only
  the `[B, T]` results are put back in token order.
  """
  model = nnx.merge(graphdef, params)
  tokens = batch["tokens"]
  b, t = tokens.shape
  layout = context_parallel.layout_for(t, model.cfg)
  # hidden[:, t] predicts tokens[:, t + 1]: score the next tokens (the last target wraps and is dropped).
  next_tokens = jnp.roll(tokens, -1, axis=1)
  positions, segment_ids = batch.get("positions"), batch.get("segment_ids")
  if layout is not None:
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)) if positions is None else positions
    tokens, next_tokens, positions = (context_parallel.to_layout(x, layout) for x in (tokens, next_tokens, positions))
    segment_ids = None if segment_ids is None else context_parallel.to_layout(segment_ids, layout)
  hidden, _ = model(tokens, positions=positions, segment_ids=segment_ids, return_hidden=True,
                    dropout_key=dropout_key, in_context_layout=layout is not None)
  dt = model.cfg.jnp_dtype
  unembed_dv = (model.embed_vd[...].T if model.cfg.tie_embeddings else model.unembed_dv[...]).astype(dt)
  shards = 1 if layout is None else layout.shards
  logp, ent = logprobs.token_logprobs_and_entropy_from_hidden(
      hidden.astype(dt), unembed_dv, next_tokens, temperature=temperature,
      chunk_size=_chunk_len(t // shards, logits_chunk_size), shards=shards)
  if layout is not None:
    logp, ent = context_parallel.from_layout(logp, layout), context_parallel.from_layout(ent, layout)
  shift = lambda x: jnp.pad(x[:, :-1], ((0, 0), (1, 0)))  # noqa: E731  next-token -> token-aligned
  return shift(logp), shift(ent)


def _to_micro(x: jax.Array, n: int) -> jax.Array:
  """[B, ...] -> [n, B // n, ...]; micro-batch i holds rows i, i + n, ... so that every micro-batch stays
  spread over the data-parallel devices (B is block-sharded over them; a plain reshape would put whole
  micro-batches on single devices)."""
  x = jnp.swapaxes(x.reshape(x.shape[0] // n, n, *x.shape[1:]), 0, 1)
  return sharding_lib.shard(x, (None, "batch") + (None,) * (x.ndim - 2))


def _from_micro(x: jax.Array) -> jax.Array:
  """Inverse of _to_micro."""
  x = jnp.swapaxes(x, 0, 1)
  return sharding_lib.shard(x.reshape(-1, *x.shape[2:]), ("batch",) + (None,) * (x.ndim - 2))


def _check_batch(batch: Batch, allowed: tuple[str, ...], required: tuple[str, ...],
                 micro_batch_size: int) -> tuple[int, int]:
  unknown = sorted(set(batch) - set(allowed))
  if unknown:
    raise ValueError(f"batch: unknown keys {unknown}; allowed: {list(allowed)}")
  missing = [k for k in required if k not in batch]
  if missing:
    raise ValueError(f"batch: missing keys {missing}")
  b, t = batch["tokens"].shape
  for k, v in batch.items():
    ok = v.shape in ((b,), (b, t)) if k == "advantages" else v.shape == (b, t)
    if not ok:
      raise ValueError(f"batch[{k!r}] has shape {v.shape}; tokens are {(b, t)}")
  if micro_batch_size <= 0 or b % micro_batch_size:
    raise ValueError(f"batch size {b} is not a multiple of micro_batch_size {micro_batch_size}")
  return b, t


# ------------------------------------------------------------------------------------------------------------
# The update step
# ------------------------------------------------------------------------------------------------------------


def make_update_fn(
    graphdef: nnx.GraphDef,
    state_shardings: TrainState,
    loss_cfg: losses.LossConfig,
    opt_cfg: OptimizerConfig,
    mesh: Mesh,
    *,
    micro_batch_size: int,
    temperature: float = 1.0,
    logits_chunk_size: int | None = 512,
    accum_dtype: Any = jnp.float32,
) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, dict[str, jax.Array]]]:
  """Builds the jitted `update(state, batch, rng) -> (state, metrics)` (state donated, explicit shardings).

  One call is one optimizer step on one mini-batch (module docstring: batch layout): the batch is split
  into B / micro_batch_size micro-batches whose gradients are accumulated by `lax.scan` with the
  normalisers of the whole mini-batch (so token-mean is the exact mean over all of its tokens); then
  clip by global norm -> skip if the norm or the loss is not finite (state returned unchanged) -> AdamW.
  With LoRA adapters in the params only they are differentiated and updated (`train_state.split_trainable`);
  `rng` draws their dropout masks (one key per micro-batch), and is unused otherwise.

  Compiles once per (B, T) and set of batch keys: bucket shapes upstream. Every batch array is sharded along B
  over data x fsdp, so B must be a multiple of data * fsdp (JAX raises IndivisibleError otherwise), and
  micro_batch_size should be one too (else each micro-batch is replicated: correct, but not data-parallel).

  Args:
    graphdef: from init_train_state.
    state_shardings: train_state_shardings(state, mesh).
    loss_cfg: LossConfig; when loss_cfg.needs_reference the batch must carry "ref_logp".
    opt_cfg: the OptimizerConfig the state was initialised with.
    mesh: device mesh.
    micro_batch_size: rows per micro-batch (divides B).
    temperature: sampling temperature; logits are divided by it, as the sampler's were.
    logits_chunk_size: T-chunk of the fused LM head + log-softmax (memory mb * chunk * V * 4 bytes).
    accum_dtype: dtype of the gradient accumulator.

  Returns:
    update; metrics (float32 scalars): loss, pg_loss, clip_frac_high / _low / _dual, clip_frac, entropy,
    ppo_kl, approx_kl (KL of the old policy to the current one, before the step), [kl_ref],
    grad_norm (before clipping), skipped (1.0 if the step was skipped), tokens, sequences (trained, after any
    rejection), learning_rate; with "sampler_logp" in the batch the off-policy metrics of `offpolicy.correct`
    (is_weight_mean / _max, is_ess, behav_kl_k1 / _k3, behav_ppl_ratio, rejected_token_frac / _seq_frac, ...),
    computed on the whole mini-batch: combine several updates' metrics with `offpolicy.reduce_update_metrics`.
  """
  tx = opt_cfg.make()
  schedule = opt_cfg.make_schedule()
  replicated = NamedSharding(mesh, P())
  param_shardings = split_trainable(state_shardings.params)[0]  # of the gradients: the trainable params'

  def loss_fn(trainable, frozen, mb, norm, key):
    logp, entropy = token_logprobs(graphdef, join_trainable(trainable, frozen), mb, temperature=temperature,
                                   logits_chunk_size=logits_chunk_size, dropout_key=key)
    adv = mb["advantages"]
    if adv.ndim == 1:
      adv = jnp.broadcast_to(adv[:, None], mb["loss_mask"].shape)
    return losses.grpo_objective(
        loss_cfg, logp=logp, logp_old=mb["old_logp"], advantages=adv, mask=mb["loss_mask"], norm=norm,
        entropy=entropy, logp_ref=mb.get("ref_logp") if loss_cfg.needs_reference else None,
        is_weight=mb.get("is_weight"))

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def grads_and_metrics(trainable, frozen, batch, norm, n_micro, key):
    """Gradients of the trainable params and metrics over the mini-batch; `key`: dropout (None: none)."""
    constrain = lambda g: jax.lax.with_sharding_constraint(g, param_shardings)  # noqa: E731
    if n_micro == 1:
      (_, metrics), grads = grad_fn(trainable, frozen, batch, norm, key)
      return constrain(jax.tree.map(lambda g: g.astype(accum_dtype), grads)), metrics

    def accumulate(acc, mb_key):
      mb, k = mb_key
      (_, metrics), grads = grad_fn(trainable, frozen, mb, norm, k)
      acc = jax.tree.map(lambda a, g: a + g.astype(accum_dtype), acc, grads)
      return constrain(acc), metrics

    zeros = constrain(jax.tree.map(lambda p: jnp.zeros(p.shape, accum_dtype), trainable))
    micro = {k: _to_micro(v, n_micro) for k, v in batch.items()}
    keys = None if key is None else jax.random.split(key, n_micro)
    no_metrics = jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), jax.eval_shape(
        accumulate, zeros, jax.tree.map(lambda x: x[0], (micro, keys)))[1])

    def body(acc, mb_key):
      # A micro-batch with no trained token adds nothing: skip its forward and backward (packed batches have a
      # fixed row count, so their trailing micro-batches are often empty).
      return lax.cond(jnp.any(mb_key[0]["loss_mask"]), accumulate, lambda acc, _: (acc, no_metrics), acc, mb_key)

    grads, metrics = lax.scan(body, zeros, (micro, keys))
    # Every metric is normalised by the whole mini-batch, so micro-batch values add up.
    return grads, jax.tree.map(lambda m: jnp.sum(m, axis=0), metrics)

  def update(state: TrainState, batch: Batch, rng: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
    required = REQUIRED_KEYS + (("ref_logp",) if loss_cfg.needs_reference else ())
    required += ("sampler_logp",) if loss_cfg.needs_proximal_logp else ()
    b, _ = _check_batch(batch, REQUIRED_KEYS + OPTIONAL_KEYS, required, micro_batch_size)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      # Position 0 has no prediction (nothing precedes it), so it is never trained.
      batch = dict(batch, loss_mask=(batch["loss_mask"] != 0).at[:, 0].set(False))
      offpolicy_metrics, nan_free = {}, jnp.array(True)
      if "sampler_logp" in batch:
        # Behaviour weights and rejection depend on the batch only (old vs sampler log-probs), not on the params:
        # computed once on the whole mini-batch, so sequence-level rules see whole sequences, the normalisers
        # count only kept tokens, and max / ESS are exact (micro-batch sums could not give them).
        corr = offpolicy.correct(loss_cfg.correction, logp_prox=batch["old_logp"],
                                 logp_behav=batch.pop("sampler_logp"), mask=batch["loss_mask"],
                                 segment_ids=batch.get("segment_ids"))
        offpolicy_metrics = corr.metrics
        if loss_cfg.needs_proximal_logp:
          # A NaN behaviour log-prob skips the step even where the loss never reads it (rejection only).
          batch["loss_mask"], nan_free = corr.mask, corr.nan_free
        if corr.weight is not None:
          batch["is_weight"] = corr.weight
      norm = losses.agg_normaliser(batch["loss_mask"], loss_cfg.loss_scale_factor)
      trainable, frozen = split_trainable(state.params)
      key = rng if lora_lib.dropout_rate(graphdef, state.params) > 0 else None
      grads, metrics = grads_and_metrics(trainable, frozen, batch, norm, b // micro_batch_size, key)

      grad_norm = optax.global_norm(grads)
      ok = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"]) & nan_free
      scale = jnp.ones((), jnp.float32)
      if opt_cfg.grad_clip is not None:
        scale = jnp.where(grad_norm > opt_cfg.grad_clip, opt_cfg.grad_clip / grad_norm, 1.0)
      # Zero non-finite gradients so that the discarded AdamW branch stays finite too.
      grads = jax.tree.map(lambda g: jnp.where(ok, g * scale, 0.0), grads)
      updates, opt_state = tx.update(grads, state.opt_state, trainable)
      params = optax.apply_updates(trainable, updates)
      # Cast back: with bf16 params optax would return f32 moments (from f32 gradients), changing the
      # state's dtypes (a recompile each step, and no buffer donation).
      keep = lambda new, old: jax.tree.map(  # noqa: E731
          lambda n, o: jnp.where(ok, n, o).astype(o.dtype), new, old)
      new_state = TrainState(step=state.step + ok.astype(jnp.int32),
                             params=join_trainable(keep(params, trainable), frozen),
                             opt_state=keep(opt_state, state.opt_state))
      metrics = dict(metrics, **offpolicy_metrics, grad_norm=grad_norm, skipped=1.0 - ok.astype(jnp.float32),
                     tokens=norm.num_tokens, sequences=norm.num_seqs,
                     learning_rate=jnp.asarray(schedule(state.step), jnp.float32))
    return new_state, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

  # The old state's buffers are donated: params and both Adam moments are updated in place.
  return jax.jit(update, in_shardings=(state_shardings, batch_sharding(mesh), replicated),
                 out_shardings=(state_shardings, replicated), donate_argnums=(0,))


# ------------------------------------------------------------------------------------------------------------
# Old / reference log-probs
# ------------------------------------------------------------------------------------------------------------


def make_logprobs_fn(
    graphdef: nnx.GraphDef,
    param_shardings: nnx.State,
    mesh: Mesh,
    *,
    micro_batch_size: int,
    temperature: float = 1.0,
    logits_chunk_size: int | None = 512,
) -> Callable[[nnx.State, Batch], Float[Array, "B T"]]:
  """Builds the jitted `logprobs(params, batch) -> logp [B, T]` (float32, token-aligned, 0 at t = 0).

  Same forward path as the update (hidden states -> chunked LM head), micro-batched with `lax.map`, no
  gradients. Use it for the old log-probs with the policy's params, and (only when LossConfig.needs_reference)
  for the reference log-probs with the reference params (same graphdef and shardings). `batch` holds
  "tokens" and optionally "positions" and "segment_ids".
  """
  bs = batch_sharding(mesh)

  def logprobs(params: nnx.State, batch: Batch) -> jax.Array:
    b, _ = _check_batch(batch, LOGPROB_KEYS, ("tokens",), micro_batch_size)
    n = b // micro_batch_size
    fwd = lambda p, mb: token_logprobs(graphdef, p, mb, temperature=temperature,  # noqa: E731
                                       logits_chunk_size=logits_chunk_size)[0]
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      if n == 1:
        return fwd(params, batch)
      # Params ride in the carry rather than being closed over: nnx.remat inside the loop body must see
      # them as values of the body's own trace.
      micro = {k: _to_micro(v, n) for k, v in batch.items()}

      def body(p, mb):
        if "segment_ids" not in mb:
          return p, fwd(p, mb)
        # Packed rows: a micro-batch of empty rows (segment 0 only) is not computed.
        return p, lax.cond(jnp.any(mb["segment_ids"] > 0), fwd, lambda p, mb: jnp.zeros(mb["tokens"].shape,
                                                                                         jnp.float32), p, mb)

      return _from_micro(lax.scan(body, params, micro)[1])

  return jax.jit(logprobs, in_shardings=(param_shardings, bs), out_shardings=bs)
