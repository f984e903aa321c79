"""Smoke test of `python -m agentrl_jax.bench.async_rl` (remote tools, async vs sync) at a tiny size."""

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from agentrl_jax.bench import async_rl, common
from agentrl_jax.models import tokenizer as tokenizer_lib


def test_remote_latency_is_lognormal_median_and_p99_and_fixed_per_call():
  lat = [async_rl.remote_latency(f"print({i})", 0.2) for i in range(4000)]
  lat.sort()
  assert 0.18 < lat[len(lat) // 2] < 0.22  # median 200 ms
  assert 1.6 < lat[int(0.99 * len(lat))] < 2.5  # p99 about 10x the median: 2 s
  assert async_rl.remote_latency("print(1)", 0.2) == async_rl.remote_latency("print(1)", 0.2)


def test_remote_tools_take_wall_time_and_no_cpu():
  lat: list[float] = []
  ex = async_rl.remote_executor(0.2, lat)
  try:
    cpu0, t0 = time.process_time(), time.perf_counter()
    codes = [f"print({i})" for i in range(8)]
    for c in codes:  # one after another: the wall time is the sum of the latencies
      ex.submit(c).result()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
  finally:
    ex.close()
  assert lat == [async_rl.remote_latency(c, 0.2) for c in codes]
  assert wall >= 0.95 * sum(lat) and cpu < 0.1 * wall


def test_tool_latencies_are_each_episodes_calls_in_order():
  tok = tokenizer_lib.tiny_tokenizer()

  def turn(code):
    return tok.encode(f'let me check\n<tool_call>\n{{"name": "code_interpreter", "arguments": {{"code": "{code}"}}}}'
                      "\n</tool_call>", add_special_tokens=False)

  answer = tok.encode("The answer is \\boxed{2}.<|im_end|>", add_special_tokens=False)
  scripts = [[turn("print(1)"), turn("print(2)"), answer], [turn("print(3)"), answer], [answer]]
  lat = {c: async_rl.remote_latency(c, 0.2) for c in ("print(1)", "print(2)", "print(3)")}
  assert async_rl.tool_latencies(tok, scripts, 0.2) == [[lat["print(1)"], lat["print(2)"]], [lat["print(3)"]], []]


def test_schedule_model_replays_the_staleness_1_schedule_on_the_measured_draws():
  # Four steps, each slowest chain 1 s (one episode, one call), the synchronous run's decode 0.1 s a step (4.4 s of
  # rollout) and update 0.5 s (6.4 s of wall). Synchronous: 4 x 1.6 = 6.4 s. The stream (batch j starts once
  # update j - 2 ended): T0 = 1.1 + .5 = 1.6, T1 = max(1.6, 1.1) + .5 = 2.1, T2 = max(2.1, 1.6 + 1.1) + .5 = 3.2,
  # T3 = max(3.2, 2.1 + 1.1) + .5 = 3.7.
  # On one device (one call an episode: two decode turns of 0.05 s), the batches beside an update wait for it:
  # step 0 decodes to 0.05, calls to 1.05, decodes to 1.1, update [1.1, 1.6); step 1 the same, update [1.6, 2.1);
  # step 2 from 1.6 waits to 2.1, ends at 3.2, update [3.2, 3.7); step 3 from 2.1 ends at 3.2, update [3.7, 4.2).
  free, one = async_rl.schedule_model([[[1.0]]] * 4, 4.4, 6.4)
  assert (free, one) == pytest.approx((6.4 / 3.7, 6.4 / 4.2), rel=1e-12)
  # Without tools the stream has no waits to fill, only decode beside the update: 4 x 0.6 against 0.6 + 3 x 0.5;
  # on one device: decode to 0.1, updates [0.1, 0.6), [0.6, 1.1), step 2 from 0.6 waits to 1.1, update [1.2, 1.7),
  # step 3 from 1.1 decodes to 1.2, update [1.7, 2.2).
  free, one = async_rl.schedule_model(np.zeros((4, 1, 0)), 0.4, 2.4)
  assert (free, one) == pytest.approx((2.4 / 2.1, 2.4 / 2.2), rel=1e-12)


@pytest.mark.slow
def test_bench_async_rl_prints_one_json_line(capsys):
  async_rl.main(["--size", "tiny_qwen3", "--steps", "1", "--warmup", "4", "--prompts", "2", "--n", "2",
                 "--tool-turns", "1", "--tool-median-s", "0.02", "--rounds", "2", "--rows", "8", "--no-check"])
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 1
  out = json.loads(lines[0])
  assert out["bench"] == "async_rl" and out["trained_tokens_equal"]
  assert out["rows"] == 8 and out["sync_rows"] == 4  # the synchronous loop decodes no idle rows
  # Two rounds: speedup is the median of the rounds' ratios (with two, their mean), each a ratio of that round.
  assert len(out["speedup_rounds"]) == 2 and out["speedup"] == pytest.approx(sum(out["speedup_rounds"]) / 2)
  assert min(out["speedup_rounds"]) <= out["async_tok_s"] / out["sync_tok_s"] * 1.0001
  for mode in ("sync", "async"):
    for sched in ("pause", "overlap"):
      wall, cpu = out[f"{mode}_{sched}_wall_s"], out[f"{mode}_{sched}_cpu_s"]
      assert wall > 0 and cpu > 0 and out[f"{mode}_{sched}_tok_s"] > 0
    assert 0 < out[f"{mode}_cpu_busy_frac"] <= 1.05  # CPU seconds over the cores' wall time
  # The warm-up compiled every program the faster schedules' timed steps ran.
  assert out[f"sync_{out['sync_schedule']}_traces"] == 0 and out[f"async_{out['async_schedule']}_traces"] == 0
  assert math.isclose(out["speedup_at_full_cores"], 1 / out["sync_cpu_busy_frac"])
  assert out["async_staleness_max"] <= 1  # staleness 1
  # The one timed step's batch cannot be ready: the last warm-up step is drained, so it started on the clock.
  assert out["async_batches_ready"] == 0
  # One timed step of 2 x 2 episodes, each with one call: the slowest call of the four bounds the sync loop.
  assert 0 < out["tool_chain_s"] <= out["sync_pause_rollout_s"]
  assert out["sync_tool_chain_frac"] == pytest.approx(out["tool_chain_s"] / out[f"sync_{out['sync_schedule']}_wall_s"])
  assert out["schedule_model_speedup"] >= 1 and out["async_over_model"] == pytest.approx(
      out["speedup"] / out["schedule_model_speedup"])
  assert 1 <= out["schedule_one_device_speedup"] <= out["schedule_model_speedup"] + 1e-12
  assert out["async_over_one_device"] == pytest.approx(out["speedup"] / out["schedule_one_device_speedup"])


def test_host_devices_adds_the_count_to_xla_flags_once(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
  common.host_devices(2)
  assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=2"
  common.host_devices(4)  # a count already set (by the user, or a test harness) is left as it is
  assert os.environ["XLA_FLAGS"].count("device_count") == 1 and os.environ["XLA_FLAGS"].endswith("=2")


@pytest.mark.slow
def test_bench_async_rl_runs_the_sampler_on_a_second_device_with_weights_on_arrival():
  # A fresh process: the benchmark gives the CPU backend its second device before the backend starts.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  out = subprocess.run(
      [sys.executable, "-m", "agentrl_jax.bench.async_rl", "--size", "tiny_qwen3", "--steps", "1", "--warmup", "4",
       "--prompts", "2", "--n", "2", "--tool-turns", "1", "--tool-median-s", "0.02", "--rows", "8", "--no-check",
       "--placement", "disaggregated", "--weight-sync", "arrival"],
      env=env, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  line = json.loads(out.stdout.strip().splitlines()[-1])
  assert (line["placement"], line["weight_sync"]) == ("disaggregated", "arrival") and line["trained_tokens_equal"]
  assert line["async_staleness_max"] <= 1 and line["async_tok_s"] > 0
