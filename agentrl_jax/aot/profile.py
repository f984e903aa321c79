"""Where a TPU compile spends its time: the TPU compiler's own trace events (its HLO passes, fusion emission,
LLO scheduling, register allocation, Mosaic kernels), read from a `jax.profiler` trace taken around the compile.

    python -m agentrl_jax.aot --config=configs/demystify_qwen3_4b.py --topology=v5p:2x2x2 --only=rl/update --profile

Times are wall seconds of each phase summed over the compiler's threads (phases nest: a phase's time includes
the phases inside it), so they say which phase dominates, not a CPU-second budget.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile

import jax

# Trace events that are bookkeeping, not compiler work.
_SKIP = re.compile(r"^(\$|MutexLock|PjRtCApiClient::Serialize)")


def phase_seconds(trace_events: list[dict]) -> dict[str, float]:
  """Wall seconds per compiler phase (events of the same phase summed, its module's name stripped)."""
  out: dict[str, float] = collections.Counter()
  for e in trace_events:
    if e.get("ph") != "X" or _SKIP.match(e.get("name", "")):
      continue
    name = re.sub(r" \([^()]*\)$", "", e["name"])  # "simplification-1 (jit_update)" -> "simplification-1"
    out[name] += e.get("dur", 0) / 1e6
  return dict(out)


def profile_compile(lowered, top: int = 15) -> tuple[object, list[tuple[str, float]]]:
  """Compiles `lowered` under the profiler; returns the compiled program and its `top` phases by time."""
  with tempfile.TemporaryDirectory(prefix="aot_profile_") as d:
    jax.profiler.start_trace(d)
    try:
      compiled = lowered.compile()
    finally:
      jax.profiler.stop_trace()
    events = []
    for path in glob.glob(f"{d}/**/*.trace.json.gz", recursive=True):
      with gzip.open(path) as f:
        events += json.load(f).get("traceEvents", [])
  phases = sorted(phase_seconds(events).items(), key=lambda kv: -kv[1])
  return compiled, [(k, round(v, 2)) for k, v in phases[:top]]
