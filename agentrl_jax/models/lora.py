"""LoRA adapters on the decoder's projections: `W x + alpha / r * B A dropout(x)` for the targeted weights.

    cfg = LoraConfig(rank=16, alpha=32.0, targets="q|k|v|o|gate|up|down")
    apply(model, cfg, key)                  # adds the adapters to `model` (B = 0: the same function as before)
    adapters, base = split(nnx.state(model))     # what trains / what stays frozen
    plain = merged(model)                   # a model without adapters, weights W + alpha / r * A B

Each targeted weight of the stacked decoder layers (`layers.attn.q_dnh` `[L, D, N, H]`, ...) gets an `A` over
its input dimensions and a rank dimension `R`, and a `B` over `R` and its output dimensions, both stacked along
the layer axis like the weight (`q_lora_a_dr` `[L, D, R]`, `q_lora_b_rnh` `[L, R, N, H]`), as `nnx.LoRAParam`
variables (a subclass of `nnx.Param`; filter with `nnx.LoRAParam` for the adapters, as Tunix does). Their
`logical_axes` are the weight's, so they shard like it. A is drawn as PEFT draws it (uniform, bound
1/sqrt(fan-in)), B is zero.

The forward adds the adapter beside the frozen product (the weight is never rebuilt in training: the backward
then needs no `[D, N, H]` gradient of the base weight, only the small ones of A and B). The sampler may run the
same unmerged model or `merged` weights (`merge_params`).

Why not qwix (Tunix's LoRA): it finds the module by walking Python frames for `self` and matches the weight of
each intercepted einsum by identity; our layers run as one `lax.scan` over stacked params (the layer modules are
rebuilt inside the scanned body) and the MLP's weights enter a `custom_vjp`, so it cannot attach adapters to this
model (qwix 0.1.8's `apply_lora_to_model` on a 2-layer Qwen3 fails in the stacked-layer split, scanned or not).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Target:
  """One adaptable weight: where it lives and how its adapter applies (dimension letters as in `qwen.py`)."""

  module: str  # "attn" or "mlp" of the (stacked) decoder layer
  weight: str  # the weight's attribute, e.g. "q_dnh"
  a: str  # the A adapter's attribute, e.g. "q_lora_a_dr"
  b: str  # the B adapter's attribute, e.g. "q_lora_b_rnh"
  down_eq: str  # input -> rank, e.g. "BTD,DR->BTR"
  up_eq: str  # rank -> output, e.g. "BTR,RNH->BTNH"
  n_in: int  # how many leading dimensions of the weight (after the layer axis) the input contracts


TARGETS: dict[str, Target] = {
    "q": Target("attn", "q_dnh", "q_lora_a_dr", "q_lora_b_rnh", "BTD,DR->BTR", "BTR,RNH->BTNH", 1),
    "k": Target("attn", "k_dkh", "k_lora_a_dr", "k_lora_b_rkh", "BTD,DR->BTR", "BTR,RKH->BTKH", 1),
    "v": Target("attn", "v_dkh", "v_lora_a_dr", "v_lora_b_rkh", "BTD,DR->BTR", "BTR,RKH->BTKH", 1),
    "o": Target("attn", "o_nhd", "o_lora_a_nhr", "o_lora_b_rd", "BTNH,NHR->BTR", "BTR,RD->BTD", 2),
    "gate": Target("mlp", "gate_df", "gate_lora_a_dr", "gate_lora_b_rf", "BTD,DR->BTR", "BTR,RF->BTF", 1),
    "up": Target("mlp", "up_df", "up_lora_a_dr", "up_lora_b_rf", "BTD,DR->BTR", "BTR,RF->BTF", 1),
    "down": Target("mlp", "down_fd", "down_lora_a_fr", "down_lora_b_rd", "BTF,FR->BTR", "BTR,RD->BTD", 1),
}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """LoRA settings; `rank=0` is full fine-tuning (no adapters).

  Attributes:
    rank: R, the adapters' rank; 0 disables LoRA.
    alpha: the adapter's output is scaled by alpha / rank (PEFT's and qwix's convention).
    dropout: dropout rate on the adapter's input during training updates (sampling and scoring never drop).
    targets: regular expression matched in full against the target names q, k, v, o (attention), gate, up,
      down (MLP), e.g. "q|k|v|o" or ".*" (all seven).
  """

  rank: int = 0
  alpha: float = 16.0
  dropout: float = 0.0
  targets: str = "q|k|v|o|gate|up|down"

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
      raise ValueError(f"LoraConfig.rank must be an int >= 0, got {self.rank!r}")
    if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
      raise ValueError(f"LoraConfig.alpha must be a number > 0, got {self.alpha!r}")
    if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
      raise ValueError(f"LoraConfig.dropout must be in [0, 1), got {self.dropout!r}")
    try:
      pattern = re.compile(self.targets)
    except (re.error, TypeError) as e:
      raise ValueError(f"LoraConfig.targets is not a regular expression: {self.targets!r} ({e})") from None
    if self.rank and not any(pattern.fullmatch(name) for name in TARGETS):
      raise ValueError(f"LoraConfig.targets={self.targets!r} matches none of {list(TARGETS)}")

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  @property
  def modules(self) -> tuple[str, ...]:
    """The target names the pattern selects, in `TARGETS` order."""
    return tuple(name for name in TARGETS if re.fullmatch(self.targets, name))

  @classmethod
  def from_block(cls, block) -> "LoraConfig":
    """From a config's `lora` block (a ConfigDict or dict; None or absent: LoRA off)."""
    return cls(**dict(block)) if block else cls()


def config_block(**overrides) -> Any:
  """A config's `lora` block with every field present (rank 0: off); `--config.lora.rank=16` turns LoRA on."""
  import ml_collections

  fields = dataclasses.asdict(LoraConfig())
  unknown = set(overrides) - set(fields)
  if unknown:
    raise ValueError(f"lora block: unknown fields {sorted(unknown)}")
  return ml_collections.ConfigDict({**fields, **overrides})


# ------------------------------------------------------------------------------------------------------------
# Forward
# ------------------------------------------------------------------------------------------------------------


def add(module: nnx.Module, name: str, y: jax.Array, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
  """`y` (the frozen product `x W` of `module`'s weight `name`) plus the weight's adapter applied to `x`, or `y`
  alone when it has none. `key`: dropout on the adapter's input (training updates only; None: no dropout)."""
  cfg: LoraConfig | None = getattr(module, "lora", None)
  t = TARGETS[name]
  if cfg is None or not hasattr(module, t.a):
    return y
  if key is not None and cfg.dropout > 0:
    keep = jax.random.bernoulli(jax.random.fold_in(key, list(TARGETS).index(name)), 1.0 - cfg.dropout, x.shape)
    x = jnp.where(keep, x / (1.0 - cfg.dropout), 0).astype(x.dtype)
  dt = y.dtype
  h = jnp.einsum(t.down_eq, x, getattr(module, t.a)[...].astype(dt)) * jnp.asarray(cfg.scale, dt)
  return y + jnp.einsum(t.up_eq, h, getattr(module, t.b)[...].astype(dt))


def dropout_rate(graphdef: nnx.GraphDef, params: nnx.State) -> float:
  """The LoRA dropout of the model `graphdef` + `params` describe (0.0 without adapters); no computation."""
  cfg = config_of(nnx.merge(graphdef, params))
  return cfg.dropout if cfg is not None else 0.0


def has_adapters(module: nnx.Module, names: tuple[str, ...]) -> bool:
  """Whether `module` carries an adapter of any of the targets `names`."""
  return getattr(module, "lora", None) is not None and any(hasattr(module, TARGETS[n].a) for n in names)


# ------------------------------------------------------------------------------------------------------------
# Adding, splitting and merging adapters
# ------------------------------------------------------------------------------------------------------------


def _layer_modules(model: nnx.Module) -> dict[str, nnx.Module]:
  return {"attn": model.layers.attn, "mlp": model.layers.mlp}


def apply(model: nnx.Module, cfg: LoraConfig, key: jax.Array) -> nnx.Module:
  """Adds `cfg`'s adapters to `model` in place (and returns it): A drawn from `key` (uniform, bound
  1/sqrt(fan-in), per layer and target), B zero, both in the weight's dtype. A model of `ShapeDtypeStruct`s
  (`hf_io.abstract_model`) gets abstract adapters. No-op when `cfg.rank` is 0.

  Raises:
    ValueError: the model already has adapters.
  """
  if not cfg.enabled:
    return model
  if nnx.state(model, nnx.LoRAParam):
    raise ValueError("lora.apply: the model already has LoRA adapters")
  mods = _layer_modules(model)
  for i, name in enumerate(cfg.modules):
    t = TARGETS[name]
    mod = mods[t.module]
    w = getattr(mod, t.weight)
    value = w.get_value()
    axes = tuple(w.get_metadata().get("logical_axes") or (None,) * value.ndim)
    layers, in_dims, out_dims = value.shape[0], value.shape[1:1 + t.n_in], value.shape[1 + t.n_in:]
    a_shape, b_shape = (layers, *in_dims, cfg.rank), (layers, cfg.rank, *out_dims)
    a_axes, b_axes = (axes[0], *axes[1:1 + t.n_in], None), (axes[0], None, *axes[1 + t.n_in:])
    if isinstance(value, jax.ShapeDtypeStruct):
      a = jax.ShapeDtypeStruct(a_shape, value.dtype)
      b = jax.ShapeDtypeStruct(b_shape, value.dtype)
    else:
      fan_in = 1
      for d in in_dims:
        fan_in *= d
      bound = fan_in ** -0.5
      a = jax.random.uniform(jax.random.fold_in(key, i), a_shape, jnp.float32, -bound, bound).astype(value.dtype)
      b = jnp.zeros(b_shape, value.dtype)
    setattr(mod, t.a, nnx.LoRAParam(a, logical_axes=a_axes))
    setattr(mod, t.b, nnx.LoRAParam(b, logical_axes=b_axes))
  for mod in mods.values():
    if any(hasattr(mod, TARGETS[n].a) for n in cfg.modules):
      mod.lora = cfg
  return model


def config_of(model: nnx.Module) -> LoraConfig | None:
  """The LoraConfig of a model with adapters, else None."""
  for mod in _layer_modules(model).values():
    cfg = getattr(mod, "lora", None)
    if cfg is not None:
      return cfg
  return None


def split(params: nnx.State) -> tuple[nnx.State, nnx.State]:
  """(adapters, base) of a model's params; adapters is empty when the model has none."""
  return nnx.split_state(params, nnx.LoRAParam, ...)


def without_adapters(params: nnx.State) -> nnx.State:
  """The same params with every B adapter zeroed: the model then computes exactly the base function (`x A 0`
  adds zeros), reading the base weights it shares with `params` (no second copy); same tree, same programs."""

  def zeros(x):
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
      return jnp.zeros(x.shape, x.dtype, device=x.sharding)  # placed as the adapter it replaces
    return jnp.zeros_like(x)

  def one(path, v):
    if isinstance(v, nnx.LoRAParam) and "_lora_b_" in str(path[-1]):
      return v.replace(zeros(v.get_value()))
    return v

  return jax.tree_util.tree_map_with_path(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def merge_params(graphdef: nnx.GraphDef, params: nnx.State) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params) of the plain model whose weights are `W + alpha / r * A B` (the adapters folded in):
  the same logits as the adapted model up to float rounding. Jittable (one merge per weight update); params
  without adapters are returned as they are."""
  model = merged(nnx.merge(graphdef, params))
  return nnx.split(model)


def merged(model: nnx.Module) -> nnx.Module:
  """A copy of `model` without adapters, each targeted weight replaced by `W + alpha / r * A B` (computed in
  float32, stored in the weight's dtype); `model` itself is unchanged. Models without adapters come back as
  they are."""
  cfg = config_of(model)
  if cfg is None:
    return model
  out = nnx.clone(model)  # new Variables over the same arrays: replaced below, never written in place
  for mod in _layer_modules(out).values():
    if getattr(mod, "lora", None) is None:
      continue
    for t in TARGETS.values():
      if not hasattr(mod, t.a):
        continue
      w = getattr(mod, t.weight)
      value = w.get_value()
      a, b = getattr(mod, t.a).get_value(), getattr(mod, t.b).get_value()
      a = a.reshape(a.shape[0], -1, a.shape[-1]).astype(jnp.float32)  # [L, in, R]
      b = b.reshape(b.shape[0], b.shape[1], -1).astype(jnp.float32)  # [L, R, out]
      delta = jnp.einsum("LIR,LRO->LIO", a, b, precision=jax.lax.Precision.HIGHEST) * cfg.scale
      w.set_value((value.astype(jnp.float32) + delta.reshape(value.shape)).astype(value.dtype))
      delattr(mod, t.a)
      delattr(mod, t.b)
    del mod.lora
  return out
