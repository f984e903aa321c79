"""What a pipeline run shows its user, and what it keeps in its log file; compile-time accounting.

The console gets progress bars, one line per stage (what it did, its wall and compile seconds) and the final
report. Everything logged (the project's INFO lines and every third-party log: Orbax, absl, TFDS, backend
probing, Python warnings) goes to `<workdir>/pipeline.log`; the project's own warnings also reach the console.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time

_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"


class _ProjectRecords(logging.Filter):
  def __init__(self, level: int):
    super().__init__()
    self.level = level

  def filter(self, record: logging.LogRecord) -> bool:
    return record.name.startswith("agentrl_jax") and record.levelno >= self.level


def setup_logging(log_path: str, console_level: int = logging.WARNING) -> logging.Handler:
  """Routes all logging to `log_path` and the project's records from `console_level` up to stderr (warnings for
  the pipeline, whose stages print their own lines; INFO for the standalone jobs of `main.py`); third-party
  records (Orbax, absl, TFDS, backend probing) go to the file only. Returns the file handler."""
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  try:  # absl (imported by JAX, Orbax, TFDS) installs its own stderr handler on the root logger
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.INFO)
    absl_logging.set_stderrthreshold(absl_logging.FATAL)
  except ImportError:
    pass
  root = logging.getLogger()
  for h in list(root.handlers):
    root.removeHandler(h)
  file_handler = logging.FileHandler(log_path)
  file_handler.setFormatter(logging.Formatter(_FORMAT))
  console = logging.StreamHandler(sys.stderr)
  console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
  console.addFilter(_ProjectRecords(console_level))
  root.addHandler(file_handler)
  root.addHandler(console)
  root.setLevel(logging.INFO)
  logging.captureWarnings(True)
  return file_handler


def say(message: str) -> None:
  """One line for the user (stdout), also kept in the log."""
  print(message, flush=True)
  logging.getLogger("agentrl_jax.pipeline").info(message)


# ------------------------------------------------------------------------------------------------ compile time
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
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def process_elapsed_s() -> float:
  """Seconds since this process started (interpreter start-up and imports included)."""
  try:
    with open("/proc/self/stat") as f:
      start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return time.perf_counter()
