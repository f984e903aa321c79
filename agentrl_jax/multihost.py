"""What the jobs do differently when a run spans several JAX processes (one per host, `jax.distributed`).

The house rule: every process reads the same global batch from the deterministic grain pipeline (host data is
small next to the device work), so host-side decisions that must agree (packing, skipped rows, which groups are
kept) are computed identically everywhere; each process then builds only the shards of its own devices
(`to_global`). What one process alone computes (its share of the rollouts) is gathered before it is used
(`allgather_objects`). Writing files that are not Orbax checkpoints is process 0's job (`is_primary`,
`open_primary`); what it writes for the others to read is followed by a barrier (`once`, `primary_first`).
With one process every function is the plain single-host operation.
"""

from __future__ import annotations

from collections.abc import Callable
import os
import pickle
from typing import Any, TypeVar

import jax
from jax.experimental import multihost_utils
import numpy as np

T = TypeVar("T")


def is_primary() -> bool:
  """True on process 0: the one that writes metrics, samples, summaries and exports."""
  return jax.process_index() == 0


def to_global(tree: Any, sharding: Any) -> Any:
  """Host arrays that every process holds in full -> global `jax.Array`s laid out by `sharding` (one sharding,
  or a tree of them matching `tree`). Each process builds only the shards of its own devices
  (`jax.make_array_from_callback`), so nothing crosses hosts; with one process this is `jax.device_put`."""
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)
  if isinstance(sharding, jax.sharding.Sharding):
    sharding = jax.tree.map(lambda _: sharding, tree)

  def one(x, s):
    if isinstance(x, jax.Array):  # a process-local array (a PRNG key): `device_put` refuses, a jitted copy works
      return jax.jit(lambda a: a, out_shardings=s)(x)
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, s, lambda index: x[index], dtype=x.dtype)

  return jax.tree.map(one, tree, sharding)


def to_host(tree: Any) -> Any:
  """Global arrays -> numpy on every process (a collective when the arrays span hosts: call it everywhere)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True))
                      if isinstance(x, jax.Array) and not x.is_fully_addressable else np.asarray(x), tree)


def allgather_objects(obj: T) -> list[T]:
  """Every process's `obj` (any picklable value), in process order, on every process.

  The objects travel as padded byte arrays through JAX's own collectives (`process_allgather`): the
  episodes of one rollout, eval rows. With one process: `[obj]`.
  """
  if jax.process_count() == 1:
    return [obj]
  payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.asarray([payload.size], np.int64))).reshape(-1)
  padded = np.zeros((int(sizes.max()),), np.uint8)
  padded[:payload.size] = payload
  gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
  return [pickle.loads(gathered[i, :sizes[i]].tobytes()) for i in range(len(sizes))]


def open_primary(path: str, mode: str = "w"):
  """`open(path, mode)` on process 0; elsewhere the same calls write to os.devnull (one writer per file)."""
  return open(path if is_primary() else os.devnull, mode)


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (no-op with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def once(name: str, fn: Callable[[], T]) -> T | None:
  """Runs `fn` on process 0 (e.g. writing a file the others read), then waits for every process. Returns
  `fn`'s result on process 0, None elsewhere."""
  out = fn() if is_primary() else None
  barrier(name)
  return out


def primary_first(name: str, fn: Callable[[], T]) -> T:
  """Runs `fn` on process 0, then (after a barrier) on the others: for idempotent steps that build a shared
  artefact on first use (a TFDS dataset in the workdir) and open it on every process."""
  out = once(name, fn)
  return out if is_primary() else fn()


def write_pickle(path: str, obj: Any) -> None:
  """Process 0 pickles `obj` to `path` atomically (a temporary file renamed into place), then every process
  waits for it: a process killed mid-write leaves the previous file, never a torn one."""
  def write():
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
      pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)

  once(f"write_pickle:{os.path.basename(path)}", write)


def prune_files(directory: str, keep: set[str]) -> None:
  """Process 0 deletes the files of `directory` not named in `keep` (state kept beside pruned checkpoints)."""
  if is_primary() and os.path.isdir(directory):
    for name in os.listdir(directory):
      if name not in keep:
        os.remove(os.path.join(directory, name))
