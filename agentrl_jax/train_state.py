"""The train state SFT and RL share: the optimizer, the `TrainState` pytree, its shardings, init and restore.

    opt_cfg = OptimizerConfig(learning_rate=1e-6)
    graphdef, state = init_train_state(model, opt_cfg, mesh)        # params and AdamW moments in their shardings
    shardings = train_state_shardings(state, mesh)                  # explicit shardings for the jitted steps
    graphdef, abstract = abstract_train_state(model_cfg, opt_cfg, mesh)   # AOT lowering / restore target

The jitted steps that change a `TrainState` live with their jobs (`rl.update.make_update_fn`,
`sft.step.make_train_step`); the trainers start from `init_or_restore_train_state` and save `checkpointed(state)`.

LoRA (`models.lora`; a config's `lora` block, rank > 0): the model carries adapters (`nnx.LoRAParam`) beside its
frozen weights. `state.params` is still the whole model (so the sampler, the scoring pass and evaluation read it
as they read a fully trained one), but only the adapters train: the jitted steps differentiate them alone
(`split_trainable`), the AdamW moments cover them alone, and a checkpoint holds them alone (`checkpointed`),
restored onto the base weights that the run's `model` block names (`init_or_restore_train_state`). The KL term's
reference is then the base itself, adapters zeroed (`reference_policy`).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import math

import flax
from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
import optax

from agentrl_jax import checkpoint as ckpt_lib
from agentrl_jax import multihost
from agentrl_jax.models import hf_io
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig

SCHEDULES = ("constant", "cosine")


# ------------------------------------------------------------------------------------------------------------
# Optimizer
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW with global-norm clipping and a constant or cosine schedule with linear warmup.

  Defaults are the recipe's (lr 1e-6 constant, betas (0.9, 0.999), weight decay 0.01, clip 1.0). Weight decay
  applies to every parameter, as torch's AdamW in verl does.

  Attributes:
    learning_rate: peak learning rate.
    b1, b2, eps: Adam moments and epsilon.
    weight_decay: decoupled weight decay (AdamW).
    grad_clip: clip gradients to this global norm; None disables clipping (non-finite norms still skip).
    schedule: "constant" or "cosine" (decays to min_lr_ratio * learning_rate at total_steps).
    warmup_steps: linear warmup from 0 over this many applied updates.
    total_steps: length of the cosine schedule, warmup included (required for cosine).
    min_lr_ratio: final learning rate of the cosine schedule, as a fraction of learning_rate.
  """

  learning_rate: float = 1e-6
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.01
  grad_clip: float | None = 1.0
  schedule: str = "constant"
  warmup_steps: int = 0
  total_steps: int | None = None
  min_lr_ratio: float = 0.0

  def __post_init__(self):
    def bad(field: str, why: str):
      raise ValueError(f"OptimizerConfig.{field} {why}, got {getattr(self, field)!r}")

    def is_num(v):
      return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)

    for f in ("learning_rate", "b1", "b2", "eps", "weight_decay", "min_lr_ratio"):
      if not is_num(getattr(self, f)):
        bad(f, "must be a finite number")
    if self.learning_rate < 0:
      bad("learning_rate", "must be >= 0")
    for f in ("b1", "b2"):
      if not 0.0 <= getattr(self, f) < 1.0:
        bad(f, "must be in [0, 1)")
    if self.eps <= 0:
      bad("eps", "must be > 0")
    if self.weight_decay < 0:
      bad("weight_decay", "must be >= 0")
    if self.grad_clip is not None and (not is_num(self.grad_clip) or self.grad_clip <= 0):
      bad("grad_clip", "must be None or a number > 0")
    if self.schedule not in SCHEDULES:
      bad("schedule", f"must be one of {SCHEDULES}")
    if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
      bad("warmup_steps", "must be an int >= 0")
    if self.total_steps is not None and (
        isinstance(self.total_steps, bool) or not isinstance(self.total_steps, int) or self.total_steps <= 0
    ):
      bad("total_steps", "must be None or an int > 0")
    if self.schedule == "cosine" and (self.total_steps is None or self.total_steps <= self.warmup_steps):
      bad("total_steps", "must be an int > warmup_steps for the cosine schedule")
    if not 0.0 <= self.min_lr_ratio <= 1.0:
      bad("min_lr_ratio", "must be in [0, 1]")

  def make_schedule(self) -> optax.Schedule:
    """Learning rate as a function of the number of applied updates."""
    lr, w = self.learning_rate, self.warmup_steps
    if self.schedule == "cosine":
      return optax.warmup_cosine_decay_schedule(
          0.0, lr, max(w, 0), self.total_steps, end_value=lr * self.min_lr_ratio
      )
    if w == 0:
      return optax.constant_schedule(lr)
    return optax.join_schedules([optax.linear_schedule(0.0, lr, w), optax.constant_schedule(lr)], [w])

  def make(self) -> optax.GradientTransformation:
    """AdamW only: clipping happens in the update step, which needs the norm for the skip decision."""
    return optax.adamw(self.make_schedule(), b1=self.b1, b2=self.b2, eps=self.eps,
                       weight_decay=self.weight_decay)


# ------------------------------------------------------------------------------------------------------------
# Train state
# ------------------------------------------------------------------------------------------------------------


@flax.struct.dataclass
class TrainState:
  """Everything the update step changes; a pytree (checkpoint `checkpointed(state)`).

  Attributes:
    step: int32 scalar, number of applied optimizer updates (skipped steps do not count; drives the schedule).
    params: nnx.State of the model's Params (merge with the graphdef to get the model back); with LoRA the base
      weights and the adapters.
    opt_state: optax AdamW state; its moments mirror the trainable params (`split_trainable`: every param, or
      the adapters alone), same tree, same shardings.
  """

  step: jax.Array
  params: nnx.State
  opt_state: optax.OptState


def train_state_shardings(state: TrainState, mesh: Mesh) -> TrainState:
  """NamedShardings of a (concrete or abstract) TrainState: params and moments by their logical axes."""
  return sharding_lib.state_shardings(state, mesh)


def split_trainable(params: nnx.State) -> tuple[nnx.State, nnx.State | None]:
  """(trainable, frozen): the LoRA adapters and the rest when the model has adapters, else (params, None)."""
  adapters, base = lora_lib.split(params)
  if not jax.tree.leaves(adapters):
    return params, None
  return adapters, base


def join_trainable(trainable: nnx.State, frozen: nnx.State | None) -> nnx.State:
  """Inverse of `split_trainable`."""
  return trainable if frozen is None else nnx.merge_state(trainable, frozen)


def checkpointed(state: TrainState) -> TrainState:
  """What a checkpoint holds of `state`: all of it, or with LoRA the adapters (and their moments) alone; the
  restore puts them back onto the base (`init_or_restore_train_state`)."""
  return state.replace(params=split_trainable(state.params)[0])


def _split_params(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State]:
  graphdef, state = nnx.split(model)
  others = [v for v in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
            if not isinstance(v, nnx.Param)]
  if others:
    raise ValueError(f"TrainState holds nnx.Param state only; model also has {sorted({type(v).__name__ for v in others})}")
  return graphdef, state


def init_train_state(model: nnx.Module, opt_cfg: OptimizerConfig, mesh: Mesh) -> tuple[nnx.GraphDef, TrainState]:
  """Splits `model` and places params and a fresh AdamW state (of the trainable params) in their shardings.

  Returns:
    (graphdef, state): pass graphdef to make_update_fn / make_logprobs_fn; `nnx.merge(graphdef, state.params)`
    rebuilds the model.
  """
  graphdef, params = _split_params(model)
  tx = opt_cfg.make()
  abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                        opt_state=jax.eval_shape(tx.init, split_trainable(params)[0]))
  shardings = train_state_shardings(abstract, mesh)
  params = jax.device_put(params, shardings.params)
  opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(split_trainable(params)[0])
  step = multihost.to_global(np.zeros((), np.int32), shardings.step)
  return graphdef, TrainState(step=step, params=params, opt_state=opt_state)


def abstract_train_state(model_cfg: ModelConfig, opt_cfg: OptimizerConfig, mesh: Mesh,
                         lora: lora_lib.LoraConfig | None = None) -> tuple[nnx.GraphDef, TrainState]:
  """(graphdef, TrainState of ShapeDtypeStructs carrying shardings): AOT lowering and restore targets, no memory.
  `lora`: the model with these adapters (only they train)."""
  model = hf_io.abstract_model(model_cfg)
  if lora is not None:
    lora_lib.apply(model, lora, jax.random.key(0))
  graphdef, params = _split_params(model)
  abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                        opt_state=jax.eval_shape(opt_cfg.make().init, split_trainable(params)[0]))
  shardings = train_state_shardings(abstract, mesh)
  return graphdef, jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


# ------------------------------------------------------------------------------------------------------------
# The trainers' start
# ------------------------------------------------------------------------------------------------------------


def lora_key(init_key: jax.Array) -> jax.Array:
  """The adapters' init key, named from the run's init key."""
  return jax.random.fold_in(init_key, 0x10A)


def load_model(model_block, mesh: Mesh, init_key: jax.Array, lora: lora_lib.LoraConfig | None = None) -> nnx.Module:
  """The policy of `model_block` (`checkpoint.load_policy`) with `lora`'s adapters added (B = 0)."""
  _, model = ckpt_lib.load_policy(model_block, mesh, init_key)
  if lora is not None and lora.enabled:
    lora_lib.apply(model, lora, lora_key(init_key))
  return model


def init_or_restore_train_state(ckpt, model_block, model_cfg: ModelConfig, opt_cfg: OptimizerConfig, mesh: Mesh, *,
                                root_key: jax.Array, init_key: jax.Array, data_iterator=None,
                                lora: lora_lib.LoraConfig | None = None):
  """The trainers' start: a fresh TrainState from the configured policy, or the latest checkpoint.

  Fresh: the policy of `model_block` (HF dir, our checkpoint or random init with `init_key`; see
  `checkpoint.load_policy`), with `lora`'s adapters when its rank is > 0, a new AdamW state, `root_key` as the run's
  PRNG key, step 0. Resumed: train state, PRNG key, step and metadata of the latest checkpoint of `ckpt` (an
  `agentrl_jax.checkpoint.Checkpointer` holding `{"train": checkpointed(TrainState), "rng": key}`), restored
  into their shardings (with LoRA: the adapters onto the base weights `model_block` loads again);
  `data_iterator` is repositioned.

  Returns:
    (graphdef, state, rng, step, metadata); metadata is {} for a fresh start.
  """
  replicated = NamedSharding(mesh, P())
  lora = lora if lora is not None and lora.enabled else None
  if ckpt.latest_step() is None or lora is not None:
    graphdef, state = init_train_state(load_model(model_block, mesh, init_key, lora), opt_cfg, mesh)
    if ckpt.latest_step() is None:
      return graphdef, state, multihost.to_global(root_key, replicated), 0, {}
    base = split_trainable(state.params)[1]
    shardings = train_state_shardings(state, mesh)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings)
    del state  # only the base weights are kept; adapters, moments and step come from the checkpoint
  else:
    graphdef, abstract = abstract_train_state(model_cfg, opt_cfg, mesh)
    base = None
  target = {"train": checkpointed(abstract),
            "rng": jax.ShapeDtypeStruct(root_key.shape, root_key.dtype, sharding=replicated)}
  restored, meta = ckpt.restore(target, data_iterator=data_iterator)
  state = restored["train"]
  state = state.replace(params=join_trainable(state.params, base))
  return graphdef, state, restored["rng"], meta["step"], meta


def checkpoint_metadata(model_block, init_key: jax.Array, lora: lora_lib.LoraConfig | None) -> dict:
  """What a trainer's checkpoint metadata must add so that the checkpoint loads on its own (`checkpoint.load_model`,
  the HF export): with LoRA, the adapters' config and the base they apply to (the `model` block and init key);
  nothing without."""
  if lora is None or not lora.enabled:
    return {}
  block = model_block.to_dict() if hasattr(model_block, "to_dict") else dict(model_block)
  return {"lora": {"config": dataclasses.asdict(lora), "base_model": block,
                   "init_key": np.asarray(jax.random.key_data(init_key)).tolist()}}


def sampler_policy(graphdef: nnx.GraphDef, params: nnx.State, mesh: Mesh
                   ) -> tuple[nnx.GraphDef, Callable[[nnx.State], nnx.State]]:
  """(graphdef, to_sampler) of the policy the sampler runs, from the train state's graph and (abstract or
  concrete) params: the same model, read in place (`to_sampler` is the identity), or with LoRA the plain model
  with the adapters folded into its weights (W + alpha / r A B), merged by one jitted call per weight update and
  stored in the compute dtype its matmuls read (a bfloat16 copy beside float32 master weights on TPU; the model
  casts every weight to that dtype anyway, so the sampler computes what the adapted model computes, up to the
  merge's rounding).

  Why merged (README, LoRA): a decode step with the adapters beside each projection was 1.3-1.4x slower on the
  CPU (`bench/lora.py`) and compiles to a larger program on TPU (`python -m agentrl_jax.aot`), while one merge
  costs less than a decode step.
  """
  if split_trainable(params)[1] is None:
    return graphdef, lambda p: p
  dtype = nnx.merge(graphdef, params).cfg.jnp_dtype

  def to_sampler(p):
    merged = lora_lib.merge_params(graphdef, p)[1]
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, merged)

  plain_def, abstract = nnx.split(nnx.eval_shape(lambda p: lora_lib.merged(nnx.merge(graphdef, p)), params))
  out_shardings = sharding_lib.state_shardings(jax.eval_shape(to_sampler, params), mesh)
  del abstract
  return plain_def, jax.jit(to_sampler, out_shardings=out_shardings)


def reference_policy(model_block, mesh: Mesh, init_key: jax.Array, lora: lora_lib.LoraConfig | None
                     ) -> Callable[[nnx.State], nnx.State]:
  """The KL term's frozen reference as a function of the current policy params (call it when scoring: the update
  donates the params it reads). With LoRA: the base weights the policy holds, its adapters zeroed (no second copy
  of the model, and the policy's scoring program); else the initial policy of `model_block`, loaded once."""
  if lora is not None and lora.enabled:
    return lora_lib.without_adapters
  _, ref_model = ckpt_lib.load_policy(model_block, mesh, init_key)
  ref_params = nnx.state(ref_model)
  return lambda params: ref_params
