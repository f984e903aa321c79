"""The SFT step: host-side encode + pack of a batch of conversations, and the one jitted train step.

    tx_cfg = train_state.OptimizerConfig(learning_rate=1e-5, b2=0.95, schedule="cosine", ...)
    graphdef, state = train_state.init_train_state(model, tx_cfg, mesh)
    step = make_train_step(graphdef, train_state.train_state_shardings(state, mesh), tx_cfg, mesh, micro_rows=8)
    data = encode_batch(tokenizer, conversations, sft_cfg)      # skips (and reports) malformed conversations
    state, metrics = step(state, batch_arrays(data.packed, mesh), jax.random.fold_in(rng, step_number))

The loss is the token mean of the cross-entropy over every assistant target token of the step: per
micro-batch the *sum* of token losses is differentiated, the sums are accumulated by `lax.scan`, and the total
is divided once by the step's token count. So splitting a step into micro-batches (or packing conversations
differently) changes nothing but float rounding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import optax

from agentrl_jax import multihost
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.rl import logprobs
from agentrl_jax.train_state import OptimizerConfig, TrainState, join_trainable, split_trainable
from agentrl_jax.sft import masking, packing

TRUNCATIONS = masking.TRUNCATIONS + ("skip",)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Shapes and schedule of an SFT run (the optimizer itself is `train_state.OptimizerConfig`).

  Attributes:
    batch_size: conversations per optimizer step (the recipe: 32).
    num_epochs: passes over the data (the recipe: 5).
    max_seq_len: T, slots of a packed row (the recipe: 32768).
    truncation: a longer conversation keeps its first T tokens ('right', the recipe's `data.truncation=right`) or
      its last ('left'), or is skipped and counted ('skip'). One left with no trained token is skipped.
    micro_batch_rows: packed rows per micro-batch (a multiple of the data-parallel devices is best).
    warmup_ratio: linear warmup as a fraction of all steps (the recipe: 0.1), then cosine decay.
    logits_chunk_size: T-chunk of the fused LM head + log-softmax; None computes [R, T, V] at once.
    fixed_rows: every step holds the rows of its largest possible packing (batch_size rows, rounded up to
      micro-batches), its empty micro-batches skipped: the step compiles once; else rows are bucketed to powers
      of two (a program per bucket).
  """

  batch_size: int = 32
  num_epochs: int = 5
  max_seq_len: int = 32768
  truncation: str = "right"
  micro_batch_rows: int = 1
  warmup_ratio: float = 0.1
  logits_chunk_size: int | None = 1024
  fixed_rows: bool = True

  def __post_init__(self):
    for name in ("batch_size", "num_epochs", "max_seq_len", "micro_batch_rows"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"SFTConfig.{name} must be an int >= 1, got {value!r}")
    if self.truncation not in TRUNCATIONS:
      raise ValueError(f"SFTConfig.truncation must be one of {TRUNCATIONS}, got {self.truncation!r}")
    if not 0.0 <= self.warmup_ratio < 1.0:
      raise ValueError(f"SFTConfig.warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
    if self.logits_chunk_size is not None and (self.logits_chunk_size < 1
                                               or self.max_seq_len % min(self.logits_chunk_size, self.max_seq_len)):
      raise ValueError(f"SFTConfig.logits_chunk_size must be None or divide max_seq_len={self.max_seq_len}, "
                       f"got {self.logits_chunk_size!r}")

  def warmup_steps(self, total_steps: int) -> int:
    return int(round(self.warmup_ratio * total_steps))


# ------------------------------------------------------------------------------------------------------------
# Host side: conversations -> packed arrays
# ------------------------------------------------------------------------------------------------------------


class StepData(NamedTuple):
  """One step's input. `packed` is None when every conversation of the batch was skipped.

  Attributes:
    packed: the packed batch.
    encoded: the conversations that made it in (truncated ones cut to `max_seq_len`).
    skipped: `(row_index, reason)` of the conversations that did not.
    truncated: row indices of the conversations that were cut to `max_seq_len`.
  """

  packed: packing.PackedBatch | None
  encoded: list[masking.EncodedConversation]
  skipped: list[tuple[int, str]]
  truncated: tuple[int, ...] = ()


def encode_batch(tokenizer, conversations: Sequence[Any], cfg: SFTConfig) -> StepData:
  """Renders, masks, truncates (`cfg.truncation`) and packs one batch of `data.Conversation`s; malformed ones are
  skipped, not raised."""
  encoded, skipped, truncated = [], [], []
  limit = cfg.max_seq_len if cfg.truncation == "skip" else None
  for conv in conversations:
    try:
      enc = masking.encode_conversation(tokenizer, conv.messages, conv.tools, max_tokens=limit, index=conv.index)
    except masking.MalformedConversation as e:
      skipped.append((conv.index, str(e)))
      continue
    if len(enc) > cfg.max_seq_len:
      enc = masking.truncate(enc, cfg.max_seq_len, cfg.truncation)
      if not enc.num_trained:
        skipped.append((conv.index, f"no assistant token in the {cfg.max_seq_len} tokens kept by "
                                    f"truncation={cfg.truncation!r}"))
        continue
      truncated.append(conv.index)
    encoded.append(enc)
  packed = None
  if encoded:
    packed = packing.pack(encoded, seq_len=cfg.max_seq_len, micro_rows=cfg.micro_batch_rows,
                          max_rows=cfg.batch_size, fixed_rows=cfg.fixed_rows)
  return StepData(packed, encoded, skipped, tuple(truncated))


def batch_sharding(mesh: Mesh, micro_rows: int, seq_len: int) -> NamedSharding:
  """`[M, R, T]` arrays: rows of each micro-batch over the data-parallel axes (replicated if R does not split)."""
  return NamedSharding(mesh, sharding_lib.logical_to_spec((None, "batch", "seq"), (1, micro_rows, seq_len), mesh))


def batch_arrays(packed: packing.PackedBatch, mesh: Mesh) -> dict[str, jax.Array]:
  """The packed arrays placed on the mesh (each process builds its own devices' rows of the global batch)."""
  _, r, t = packed.inputs.shape
  return multihost.to_global(packed.arrays(), batch_sharding(mesh, r, t))


# ------------------------------------------------------------------------------------------------------------
# Device side: the train step
# ------------------------------------------------------------------------------------------------------------


def make_train_step(graphdef: nnx.GraphDef, state_shardings: TrainState, opt_cfg: OptimizerConfig, mesh: Mesh,
                    *, micro_rows: int, seq_len: int, logits_chunk_size: int | None = None,
                    accum_dtype: Any = jnp.float32
                    ) -> Callable[[TrainState, dict, jax.Array], tuple[TrainState, dict]]:
  """Builds the jitted `step(state, batch, rng) -> (state, metrics)`; `state` is donated.

  `batch` holds the `packing.FIELDS` arrays `[M, micro_rows, seq_len]` (compiled once per M; micro-batches
  without a trained token are skipped). The update:
  token-mean CE gradient over all M micro-batches -> skip if the norm or loss is not finite (state returned
  unchanged, `skipped` = 1) -> clip to `opt_cfg.grad_clip` -> AdamW (`opt_cfg.make()`). With LoRA adapters in the
  params only they are differentiated and updated (`train_state.split_trainable`), and `rng` draws their dropout
  masks (one key per micro-batch); otherwise it is unused.

  Returns:
    step; metrics (float32 scalars): loss (token-mean CE), entropy (mean over trained tokens), grad_norm
    (before clipping), learning_rate, tokens (trained target tokens), fill (fraction of slots holding
    conversation tokens), skipped.
  """
  tx = opt_cfg.make()
  schedule = opt_cfg.make_schedule()
  chunk = None if logits_chunk_size is None or logits_chunk_size >= seq_len else logits_chunk_size

  def sums(trainable, frozen, mb, key):
    """(sum of token NLL, sum of token entropy) over the trained tokens of one micro-batch."""
    model = nnx.merge(graphdef, join_trainable(trainable, frozen))
    hidden, _ = model(mb["inputs"], positions=mb["positions"], segment_ids=mb["segment_ids"], return_hidden=True,
                      dropout_key=key)
    dt = model.cfg.jnp_dtype
    unembed_dv = (model.embed_vd[...].T if model.cfg.tie_embeddings else model.unembed_dv[...]).astype(dt)
    logp, entropy = logprobs.token_logprobs_and_entropy_from_hidden(hidden.astype(dt), unembed_dv, mb["targets"],
                                                                  chunk_size=chunk)
    w = mb["weights"]
    return -jnp.sum(logp * w), jnp.sum(lax.stop_gradient(entropy) * w)

  grad_fn = jax.value_and_grad(sums, has_aux=True)

  def step(state: TrainState, batch: dict[str, jax.Array],
           rng: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      trainable, frozen = split_trainable(state.params)
      constrain = lambda g: lax.with_sharding_constraint(  # noqa: E731
          g, split_trainable(state_shardings.params)[0])
      dropout = lora_lib.dropout_rate(graphdef, state.params) > 0
      keys = jax.random.split(rng, batch["weights"].shape[0]) if dropout else None

      def accumulate(carry, mb_key):
        acc, nll, ent = carry
        (mb_nll, mb_ent), grads = grad_fn(trainable, frozen, *mb_key)
        acc = constrain(jax.tree.map(lambda a, g: a + g.astype(accum_dtype), acc, grads))
        return acc, nll + mb_nll, ent + mb_ent

      def body(carry, mb_key):
        # A micro-batch of padding rows trains nothing: its forward and backward are skipped.
        return lax.cond(jnp.any(mb_key[0]["weights"] != 0), accumulate, lambda carry, _: carry, carry,
                        mb_key), None

      zeros = constrain(jax.tree.map(lambda p: jnp.zeros(p.shape, accum_dtype), trainable))
      init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
      (grads, nll, ent), _ = lax.scan(body, init, (batch, keys))
      tokens = jnp.sum(batch["weights"])
      denom = jnp.maximum(tokens, 1.0)
      grads = jax.tree.map(lambda g: g / denom, grads)
      loss = nll / denom

      grad_norm = optax.global_norm(grads)
      ok = jnp.isfinite(grad_norm) & jnp.isfinite(loss)
      scale = jnp.ones((), jnp.float32)
      if opt_cfg.grad_clip is not None:
        scale = jnp.where(grad_norm > opt_cfg.grad_clip, opt_cfg.grad_clip / grad_norm, 1.0)
      # Zero non-finite gradients so that the discarded AdamW branch stays finite too.
      grads = jax.tree.map(lambda g: jnp.where(ok, g * scale, 0.0).astype(g.dtype), grads)
      updates, opt_state = tx.update(grads, state.opt_state, trainable)
      params = optax.apply_updates(trainable, updates)
      keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)  # noqa: E731
      new_state = TrainState(step=state.step + ok.astype(jnp.int32),
                             params=join_trainable(keep(params, trainable), frozen),
                             opt_state=keep(opt_state, state.opt_state))
      metrics = dict(loss=loss, entropy=ent / denom, grad_norm=grad_norm, tokens=tokens,
                     learning_rate=schedule(state.step), skipped=1.0 - ok.astype(jnp.float32),
                     fill=jnp.mean((batch["segment_ids"] > 0).astype(jnp.float32)))
    return new_state, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

  replicated = NamedSharding(mesh, P())
  # The old state's buffers are donated: params and both Adam moments are updated in place.
  return jax.jit(step, in_shardings=(state_shardings, batch_sharding(mesh, micro_rows, seq_len), replicated),
                 out_shardings=(state_shardings, replicated), donate_argnums=(0,))
