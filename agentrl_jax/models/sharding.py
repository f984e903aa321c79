"""Device mesh and the ONE logical-axis rules table.

Every parameter carries `logical_axes` metadata naming its dimensions (e.g. `("embed", "heads", "head_dim")`)
and activations are constrained with `shard(x, ("batch", "seq", "act_embed"))`. This module maps those names
onto the mesh axes `data`, `fsdp`, `context` and `tensor`:

* `data`: pure data parallelism (params replicated across it).
* `fsdp`: data parallelism for activations, parameters sharded along their embed dimension (ZeRO-3 style).
* `context`: context parallelism (MaxText's `ici_context_parallelism`): the tokens of a row (`seq`) are split
  over it in training, scoring and prefill, attention gathers the keys and values (`models/context_parallel.py`),
  and parameters are sharded over it as over `fsdp` (the devices of one row's shards hold different tokens of
  the same rows, so they share the weights' storage as data-parallel devices do). The passes over the rollout's
  KV cache (decode, extend) put rows over it instead (`rows_layout`): a cache row lives on one device.
* `tensor`: Megatron-style tensor parallelism over heads, kv heads, MLP width and vocabulary.

A dimension that a mesh axis does not divide is replicated instead of failing, so tiny test models run on any
mesh (checked by `logical_to_spec` against the concrete shape).
"""

from __future__ import annotations

from collections.abc import Sequence
import contextlib
import math

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

# Order = device order: the innermost axes get the nearest chips (jax.make_mesh), so tensor and context, whose
# collectives run in every layer, sit inside fsdp and data.
MESH_AXES = ("data", "fsdp", "context", "tensor")

# The one rules table: logical dimension name -> mesh axis (or axes, or None = replicated).
LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    # activations
    "batch": ("data", "fsdp"),
    "seq": "context",
    "act_embed": None,
    "act_heads": "tensor",
    "act_kv_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
    # parameters
    "layers": None,  # the stacked decoder layers' leading axis (scanned over, so never sharded)
    "vocab": "tensor",
    "embed": ("fsdp", "context"),
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    # KV cache
    "cache_layers": None,
    "cache_batch": ("data", "fsdp", "context"),  # the rollout's row slots: one row's cache on one device
    "cache_seq": None,
    "cache_kv_heads": "tensor",
    "cache_head_dim": None,
}


# Rules that replace LOGICAL_RULES' entries while a pass over the rollout's cache is traced (`rows_layout`).
_ROWS_LAYOUT = {"batch": ("data", "fsdp", "context"), "seq": None}
_overrides: list[dict] = []


@contextlib.contextmanager
def rows_layout():
  """While tracing inside it, activations put rows over every batch-like axis, `context` included, and never
  split a row's tokens: the layout of the KV cache's row slots (`cache_batch`). The sampler's decode and extend
  trace under it, so their activations, the cache and the attention kernels' per-shard calls agree (a row's
  cache whole on one device, as the ragged paged kernel reads it) however the training layout splits tokens."""
  _overrides.append(_ROWS_LAYOUT)
  try:
    yield
  finally:
    _overrides.pop()


def _rule(name: str):
  for table in reversed(_overrides):
    if name in table:
      return table[name]
  return LOGICAL_RULES[name]


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None, *,
              context: int = 1) -> Mesh:
  """Builds a (data, fsdp, context, tensor) mesh; one axis may be -1 to take the remaining devices.

  Raises:
    ValueError: the axis sizes do not multiply to the device count.
  """
  devices = list(devices if devices is not None else jax.devices())
  sizes = {"data": data, "fsdp": fsdp, "context": context, "tensor": tensor}
  free = [k for k, v in sizes.items() if v == -1]
  if len(free) > 1:
    raise ValueError(f"make_mesh: at most one axis may be -1, got {sizes}")
  known = math.prod(v for v in sizes.values() if v != -1)
  if free:
    if len(devices) % known:
      raise ValueError(f"make_mesh: {len(devices)} devices are not divisible by {known} ({sizes})")
    sizes[free[0]] = len(devices) // known
  if math.prod(sizes.values()) != len(devices):
    raise ValueError(f"make_mesh: axis sizes {sizes} do not multiply to {len(devices)} devices")
  shape = tuple(sizes[a] for a in MESH_AXES)
  # Auto axes: the compiler propagates shardings from params/inputs and our logical constraints (GSPMD),
  # rather than JAX's explicit-sharding type system.
  axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  try:
    return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=axis_types)
  except (ValueError, AssertionError, NotImplementedError):
    pass
  # An axis that is no product of whole physical axes (context 2 x fsdp 8 on a 4x4 slice): split physical axes,
  # keeping neighbours together. A device subset JAX cannot lay out physically (the disaggregated trainer's or
  # sampler's share of several hosts, no cuboid; jax asserts on those): the devices in the order given.
  try:
    from jax.experimental import mesh_utils

    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, AssertionError, NotImplementedError):
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, MESH_AXES, axis_types=axis_types)


def mesh_from_config(block) -> Mesh:
  """The mesh of a config's `mesh` block: data / fsdp / context / tensor sizes and `num_devices` (0 = all
  devices)."""
  sizes = dict(block)
  num_devices = sizes.pop("num_devices", 0)
  return make_mesh(**sizes, devices=jax.devices()[:num_devices or None])


def sampler_mesh_from_config(block, train_mesh: Mesh) -> Mesh:
  """The sampler's mesh: `train_mesh` when `block` is absent or all zero, else `block`'s data / fsdp / tensor
  sizes (one may be -1) laid over the trainer's devices.

  Decode is memory-bound and its batch is small next to a training batch, so a layout that splits heads and MLP
  width (tensor parallel) serves it better than the trainer's FSDP, which gathers every weight at every step.
  The sampler reads the trainer's params through `Sampler.place_params` (a device-to-device `jax.device_put`)
  and holds that copy for the rollout, next to the trainer's.
  """
  sizes = sampler_sizes(block)
  if sizes is None:
    return train_mesh
  return make_mesh(**sizes, devices=train_mesh.devices.flatten().tolist())


def sampler_sizes(block) -> dict[str, int] | None:
  """A `sampler_mesh` block's axis sizes for `make_mesh` (an axis left 0 has size 1), or None when every size is
  0 (the sampler uses the trainer's layout)."""
  sizes = {k: v for k, v in dict(block or {}).items() if k != "num_devices"}
  if not any(sizes.values()):
    return None
  return {k: sizes.get(k) or 1 for k in MESH_AXES}


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh: Mesh | jax.sharding.AbstractMesh | None = None) -> P:
  """Maps logical dimension names to a PartitionSpec through `LOGICAL_RULES`.

  When `shape` and `mesh` are given, a dimension the mesh axes do not divide is replicated, and a mesh axis
  is used at most once per spec (first come, first served).
  """
  used: set[str] = set()
  out = []
  for i, name in enumerate(axes):
    if name is None:
      out.append(None)
      continue
    if name not in LOGICAL_RULES:
      raise ValueError(f"logical axis {name!r} is not in LOGICAL_RULES")
    rule = _rule(name)
    mesh_axes = () if rule is None else ((rule,) if isinstance(rule, str) else tuple(rule))
    mesh_axes = tuple(a for a in mesh_axes if a not in used)
    if mesh is not None:
      mesh_axes = tuple(a for a in mesh_axes if a in mesh.shape and mesh.shape[a] > 1)
      if shape is not None:
        size = math.prod(mesh.shape[a] for a in mesh_axes)
        if shape[i] % size:
          mesh_axes = tuple(a for a in mesh_axes if shape[i] % mesh.shape[a] == 0)[:1]
    used.update(mesh_axes)
    out.append(None if not mesh_axes else (mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes))
  return P(*out)


def named_sharding(mesh: Mesh, axes: Sequence[str | None], shape: Sequence[int] | None = None) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(axes, shape, mesh))


def _current_mesh():
  mesh = jax.sharding.get_abstract_mesh()
  return None if mesh is None or mesh.empty else mesh


def shard(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """Constrains an activation's sharding by logical names when a mesh is set (`jax.set_mesh`); else no-op."""
  mesh = _current_mesh()
  if mesh is None:
    return x
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh)))


def state_shardings(state, mesh: Mesh):
  """A pytree of NamedShardings for an nnx State whose Variables carry `logical_axes` metadata."""
  from flax import nnx  # local import keeps this module importable without flax for pure helpers

  def one(v):
    if not isinstance(v, nnx.Variable):
      return NamedSharding(mesh, P())
    axes = v.get_metadata().get("logical_axes")
    spec = P() if axes is None else logical_to_spec(axes, v.get_value().shape, mesh)
    return v.replace(NamedSharding(mesh, spec))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
