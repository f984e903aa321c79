"""Smoke test of `python -m agentrl_jax.bench.async_rl` (remote tools, async vs sync) at a tiny size."""

import json
import math

import pytest

from agentrl_jax.bench import async_rl


def test_remote_latency_is_lognormal_median_and_p99_and_fixed_per_call():
  lat = [async_rl.remote_latency(f"print({i})", 0.2) for i in range(4000)]
  lat.sort()
  assert 0.18 < lat[len(lat) // 2] < 0.22  # median 200 ms
  assert 1.6 < lat[int(0.99 * len(lat))] < 2.5  # p99 about 10x the median: 2 s
  assert async_rl.remote_latency("print(1)", 0.2) == async_rl.remote_latency("print(1)", 0.2)


@pytest.mark.slow
def test_bench_async_rl_prints_one_json_line(capsys):
  async_rl.main(["--size", "tiny_qwen3", "--steps", "1", "--warmup", "1", "--prompts", "2", "--n", "2",
                 "--tool-turns", "1", "--tool-median-s", "0.02"])
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 1
  out = json.loads(lines[0])
  assert out["bench"] == "async_rl" and out["trained_tokens_equal"]
  assert out["speedup"] == pytest.approx(out["async_tok_s"] / out["sync_tok_s"])
  for mode in ("sync", "async"):
    for sched in ("pause", "overlap"):
      wall, cpu = out[f"{mode}_{sched}_wall_s"], out[f"{mode}_{sched}_cpu_s"]
      assert wall > 0 and cpu > 0 and out[f"{mode}_{sched}_tok_s"] > 0
      traces = out[f"{mode}_{sched}_traces"]  # programs compiled in the timed steps (what the warm-up missed)
      assert isinstance(traces, int) and traces >= 0
    assert 0 < out[f"{mode}_cpu_busy_frac"] < 1.5
  assert math.isclose(out["speedup_at_full_cores"], 1 / out["sync_cpu_busy_frac"])
  assert out["async_staleness_max"] <= 1  # staleness 1
