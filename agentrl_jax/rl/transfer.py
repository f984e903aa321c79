"""Weights from the trainer's devices to the sampler's, for the disaggregated placement of asynchronous RL.

    trainer_mesh, sampler_mesh = split_meshes(mesh_block, sampler_block, sampler_devices=4)
    transfer = WeightTransfer(trainer_param_shardings, sampler_param_shardings)
    sampler_params = transfer(state.params)           # one compiled program, asynchronous like any other

Why a program over the union of both meshes. Within one process `jax.device_put` moves arrays between any two
device sets, but between device sets that span several processes (hosts) it needs the runtime's cross-host
transfer support (TPU's TFRT runtime, or JAX's DCN transfer server when configured), and only for layouts whose
shards match; Tunix's users hit exactly that on multi-host v5p slices. A jitted program over the union of the
trainer's and the sampler's devices is ordinary multi-controller SPMD instead: every process calls it, XLA moves
the shards over the interconnect (ICI / DCN / gloo on CPU) as collectives, and the layouts may differ (FSDP on
the trainer, tensor parallel on the sampler). The union mesh stacks the two meshes along a leading `side` axis,
so the two grids must match: their axes of size > 1 must have the same sizes in the same order (fsdp=4 on the
trainer, tensor=4 on the sampler: the trainer's axis names are renamed to the sampler's), which also means both
sides get the same number of devices. Each array enters as `[2 * d0, ...]` (the trainer's shards on side 0 as they
are, zero placeholders of the same shard shape on side 1, made for the call and freed after it), the program
writes side 0's values to both halves in the sampler's layout, and the sampler's half is reassembled on its own
mesh without a copy. On one process, meshes of other shapes (an unequal split) are moved by `jax.device_put`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentrl_jax.models import sharding as sharding_lib

SIDE = "side"


def split_devices(sampler_devices: int, devices: list | None = None) -> tuple[list, list]:
  """(trainer devices, sampler devices): every process gives the last `sampler_devices / processes` of its local
  devices to the sampler (so a host's tools and its sampler rows stay together) and the rest to the trainer.

  Raises:
    ValueError: the sampler share is not positive, does not split evenly over the processes, or leaves the
      trainer nothing.
  """
  devices = list(devices if devices is not None else jax.devices())
  procs = sorted({d.process_index for d in devices})
  if isinstance(sampler_devices, bool) or not isinstance(sampler_devices, int) or sampler_devices < 1:
    raise ValueError(f"rl.async_sampler_devices={sampler_devices!r}: the disaggregated sampler needs >= 1 device")
  if sampler_devices % len(procs):
    raise ValueError(f"rl.async_sampler_devices={sampler_devices} must be a multiple of the {len(procs)} processes "
                     "(each host gives the sampler the same number of its devices)")
  per = sampler_devices // len(procs)
  trainer, sampler = [], []
  for p in procs:
    local = [d for d in devices if d.process_index == p]
    if per >= len(local):
      raise ValueError(f"rl.async_sampler_devices={sampler_devices} leaves the trainer no device on process {p} "
                       f"({len(local)} devices)")
    trainer += local[:len(local) - per]
    sampler += local[len(local) - per:]
  return trainer, sampler


def split_meshes(mesh_block, sampler_block, sampler_devices: int) -> tuple[Mesh, Mesh]:
  """The trainer's and the sampler's meshes over disjoint devices (`split_devices`): the config's `mesh` sizes
  laid over the trainer's devices, `sampler_mesh`'s (all zero: the same sizes) over the sampler's."""
  trainer, sampler = split_devices(sampler_devices)
  sizes = {k: v for k, v in dict(mesh_block).items() if k != "num_devices"}
  sampler_sizes = sharding_lib.sampler_sizes(sampler_block) or sizes
  return (sharding_lib.make_mesh(**sizes, devices=trainer), sharding_lib.make_mesh(**sampler_sizes, devices=sampler))


def _axis_renaming(mesh_a: Mesh, mesh_b: Mesh) -> dict[str, str] | None:
  """Names of the sampler mesh's axes for the trainer mesh's, when their axes of size > 1 have the same sizes in
  the same order (so one grid of device positions serves both); None otherwise."""
  big_a = [(n, s) for n, s in mesh_a.shape.items() if s > 1]
  big_b = [(n, s) for n, s in mesh_b.shape.items() if s > 1]
  if [s for _, s in big_a] != [s for _, s in big_b]:
    return None
  return {a: b for (a, _), (b, _) in zip(big_a, big_b)}


def _renamed(spec: P, rename: dict[str, str]) -> P:
  def one(e):
    if e is None:
      return None
    if isinstance(e, str):
      return rename.get(e) if e in rename else None
    kept = tuple(rename[x] for x in e if x in rename)
    return kept or None
  return P(*(one(e) for e in spec))


def _entries(spec: P, ndim: int) -> list:
  return list(spec) + [None] * (ndim - len(spec))


def _with_side(spec: P, ndim: int) -> P:
  """`spec` with the union mesh's `side` axis outermost on dimension 0."""
  entries = _entries(spec, ndim)
  first = entries[0]
  first = (SIDE,) if first is None else (SIDE, *((first,) if isinstance(first, str) else first))
  return P(first, *entries[1:])


class WeightTransfer:
  """One compiled program moving a params tree from the trainer's layout to the sampler's (module docstring)."""

  def __init__(self, src_shardings: Any, dst_shardings: Any):
    self.src, self.dst = src_shardings, dst_shardings
    leaves_src = jax.tree.leaves(src_shardings)
    leaves_dst = jax.tree.leaves(dst_shardings)
    mesh_a, mesh_b = leaves_src[0].mesh, leaves_dst[0].mesh
    self.mesh_a, self.mesh_b = mesh_a, mesh_b
    self.union = None
    if set(mesh_a.devices.flat) & set(mesh_b.devices.flat):
      raise ValueError("WeightTransfer: the trainer's and the sampler's devices must be disjoint")
    self.rename = _axis_renaming(mesh_a, mesh_b)
    if self.rename is not None:
      # The union over the sampler's axes: the trainer's devices take the sampler's grid positions in the same
      # order, and the trainer's specs name the sampler's axes of the same sizes.
      grid_a = mesh_a.devices.reshape(mesh_b.devices.shape)
      self.union = Mesh(np.stack([grid_a, mesh_b.devices]), (SIDE, *mesh_b.axis_names),
                        axis_types=(jax.sharding.AxisType.Auto,) * (1 + len(mesh_b.axis_names)))
    elif jax.process_count() > 1:
      raise ValueError(f"WeightTransfer: with several processes the sampler's mesh needs the trainer's non-trivial "
                       f"axis sizes in the same order ({dict(mesh_a.shape)} vs {dict(mesh_b.shape)}), e.g. fsdp=N "
                       "on the trainer and tensor=N on the sampler: the transfer is one program over both meshes")
    self._program = None

  def _build(self, abstract):
    self._in = jax.tree.map(lambda x, s: NamedSharding(self.union, _with_side(_renamed(s.spec, self.rename), x.ndim)),
                            abstract, self.src)
    self._out = jax.tree.map(lambda x, s: NamedSharding(self.union, _with_side(s.spec, x.ndim)), abstract, self.dst)
    # Side 0's rows to both halves: XLA sends them to side 1 in the sampler's layout.
    self._program = jax.jit(lambda tree: jax.tree.map(lambda x: jnp.concatenate([x[:x.shape[0] // 2]] * 2), tree),
                            in_shardings=(self._in,), out_shardings=self._out)

  def _union_array(self, x: jax.Array, s: NamedSharding, src: NamedSharding) -> jax.Array:
    # The trainer's shards are placed in the union by device: a leaf laid out otherwise than the shardings this
    # transfer was built for would arrive scrambled (or, from other devices, as zeros), so it is refused.
    if not x.sharding.is_equivalent_to(src, x.ndim):
      raise ValueError(f"WeightTransfer: a parameter of shape {x.shape} arrived laid out as {x.sharding}, not as "
                       f"the trainer's {src} this transfer was built for")
    shape = (2 * x.shape[0], *x.shape[1:])
    mine = {sh.device: sh.data for sh in x.addressable_shards}
    side_b = set(self.mesh_b.devices.flat)
    arrays = []
    for d in s.addressable_devices:
      if d in mine:
        arrays.append(mine[d])
      else:  # a sampler device: its input half is never read; zeros of the shard's shape, made on the device for
        #      this call (kept between calls they would hold a trainer shard's worth of the sampler's memory)
        assert d in side_b, (d, "is neither the trainer's nor the sampler's")
        arrays.append(jnp.zeros(s.shard_shape(shape), x.dtype, device=d))
    return jax.make_array_from_single_device_arrays(shape, s, arrays, dtype=x.dtype)

  def _sampler_half(self, y: jax.Array, dst: NamedSharding) -> jax.Array:
    side_b = set(self.mesh_b.devices.flat)
    shards = [sh.data for sh in y.addressable_shards if sh.device in side_b]
    return jax.make_array_from_single_device_arrays((y.shape[0] // 2, *y.shape[1:]), dst, shards, dtype=y.dtype)

  def __call__(self, params: Any) -> Any:
    """The sampler's copy of `params` (laid out by the trainer's shardings), in the sampler's shardings."""
    if self.union is None:  # one process, meshes of different shapes: the runtime moves the shards itself
      return jax.device_put(params, self.dst)
    if any(x.ndim == 0 for x in jax.tree.leaves(params)):
      raise ValueError("WeightTransfer: scalar parameters are not supported")
    if self._program is None:
      self._build(params)
    union = jax.tree.map(self._union_array, params, self._in, self.src)
    return jax.tree.map(self._sampler_half, self._program(union), self.dst)
