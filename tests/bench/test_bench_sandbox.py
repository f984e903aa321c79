"""Smoke test of `python -m agentrl_jax.bench.sandbox` at a tiny size (the real run is 64-call batches)."""

import json

import pytest

from agentrl_jax.bench import sandbox as bench_sandbox
from agentrl_jax.tools import sandbox
from agentrl_jax.tools.base import ToolConfig
from tests.tools.sandbox_testing import missing, needs_bwrap


@needs_bwrap
def test_bench_sandbox_prints_one_json_line(capsys):
  with sandbox.LocalExecutor(ToolConfig(timeout_s=5.0, memory_mb=512, max_concurrency=1)) as probe:
    if probe.local_mode != "worker":  # the benchmark compares both modes and says why it cannot
      missing(f"worker mode is not available here: {probe.worker_unavailable}")
  bench_sandbox.main(["--calls", "4", "--serial", "2", "--rounds", "1", "--concurrency", "2", "--no-check"])
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 1
  out = json.loads(lines[0])
  assert out["bench"] == "sandbox" and out["calls"] == 4
  for mode in ("per_call", "worker"):
    assert 0 < out[mode]["serial_ms_min"] <= out[mode]["serial_ms_median"]
    assert out[mode]["batch_calls_s"] > 0
  assert out["serial_speedup"] > 0 and out["batch_speedup"] > 0 and out["worker_start_s"] > 0
