"""Compile-time accounting from JAX's monitoring events, and the persistent compilation cache.

Every job and benchmark reports what it spent compiling: `with measured() as m:` around a block gives its wall
seconds and a `CompileStats` (seconds tracing, lowering and compiling, the programs built, and how many of those
came from the persistent cache). The counts come from JAX itself (one backend-compile event per executable), so
they include programs built outside the project's jitted functions (eager ops, `device_put` reshards).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time

_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_BACKEND = _COMPILE_EVENTS[2]
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass
class CompileStats:
  """Compile work seen by JAX's monitoring events.

  Attributes:
    compile_s: seconds spent tracing, lowering and compiling (or loading from the persistent cache).
    programs: executables built or loaded (backend compile events).
    cache_hits: of those, loaded from the persistent compilation cache.
  """

  compile_s: float = 0.0
  programs: int = 0
  cache_hits: int = 0

  def minus(self, other: CompileStats) -> CompileStats:
    return CompileStats(self.compile_s - other.compile_s, self.programs - other.programs,
                        self.cache_hits - other.cache_hits)


_totals = CompileStats()
_lock = threading.Lock()
_registered = False


def _on_duration(event: str, duration: float, **_) -> None:
  if event in _COMPILE_EVENTS:
    with _lock:
      _totals.compile_s += duration
      _totals.programs += event == _BACKEND


def _on_event(event: str, **_) -> None:
  if event == _CACHE_HIT:
    with _lock:
      _totals.cache_hits += 1


def compile_totals() -> CompileStats:
  """The process's compile totals so far (listeners are registered on first call)."""
  global _registered
  if not _registered:
    import jax

    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)
    _registered = True
  with _lock:
    return dataclasses.replace(_totals)


def metrics_since(since: CompileStats) -> dict[str, float]:
  """A job's compile work since `since`, as metrics: `compile/programs` (flat once every shape bucket has been
  met) and `compile/seconds`."""
  c = compile_totals().minus(since)
  return {"compile/programs": float(c.programs), "compile/seconds": c.compile_s}


@contextlib.contextmanager
def measured():
  """`with measured() as m:` ... then `m["wall_s"]`, `m["compile"]` (a `CompileStats`) of the block."""
  out: dict = {}
  before, t0 = compile_totals(), time.perf_counter()
  try:
    yield out
  finally:
    out["wall_s"] = time.perf_counter() - t0
    out["compile"] = compile_totals().minus(before)


def enable_compilation_cache(cache_dir: str) -> None:
  """JAX's persistent compilation cache in `cache_dir`, for every program (CPU programs compile in well under
  JAX's default 1 s threshold, and there are dozens of them)."""
  import jax

  os.makedirs(cache_dir, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", cache_dir)
  # JAX by default also turns on XLA's GPU per-fusion autotune cache under <cache_dir>, and that directory's path
  # then enters every program's cache key (as a compile option), on every backend: a copied or moved workdir, or
  # another job pointed at the same programs, never hit each other's entries (the RL stage of a copied workdir
  # recompiled all of its 74 programs). The key is made of the program alone; CPU and TPU never use that cache.
  jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@contextlib.contextmanager
def persistent_cache_off():
  """Compiles for another machine (a TPU topology from this host) bypass the persistent cache: its entries
  cannot be loaded without that machine's client, and reading one only warns."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache

  # JAX decides once per process whether the cache is used; resetting it makes the flag count again (on the
  # way in, and on the way out for the process's own programs).
  was = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", was)
    compilation_cache.reset_cache()
