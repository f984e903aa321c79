"""Smoke test of `python -m agentrl_jax.bench.async_rl` (remote tools, async vs sync) at a tiny size."""

import json
import math

import pytest

from agentrl_jax.bench import async_rl
from agentrl_jax.models import tokenizer as tokenizer_lib


def test_remote_latency_is_lognormal_median_and_p99_and_fixed_per_call():
  lat = [async_rl.remote_latency(f"print({i})", 0.2) for i in range(4000)]
  lat.sort()
  assert 0.18 < lat[len(lat) // 2] < 0.22  # median 200 ms
  assert 1.6 < lat[int(0.99 * len(lat))] < 2.5  # p99 about 10x the median: 2 s
  assert async_rl.remote_latency("print(1)", 0.2) == async_rl.remote_latency("print(1)", 0.2)


def test_slowest_tool_chain_sums_an_episodes_calls_and_takes_the_slowest_episode():
  tok = tokenizer_lib.tiny_tokenizer()

  def turn(code):
    return tok.encode(f'let me check\n<tool_call>\n{{"name": "code_interpreter", "arguments": {{"code": "{code}"}}}}'
                      "\n</tool_call>", add_special_tokens=False)

  answer = tok.encode("The answer is \\boxed{2}.<|im_end|>", add_special_tokens=False)
  scripts = [[turn("print(1)"), turn("print(2)"), answer], [turn("print(3)"), answer], [answer]]
  lat = {c: async_rl.remote_latency(c, 0.2) for c in ("print(1)", "print(2)", "print(3)")}
  want = max(lat["print(1)"] + lat["print(2)"], lat["print(3)"])
  assert async_rl.slowest_tool_chain(tok, scripts, 0.2) == pytest.approx(want, rel=1e-12)
  assert async_rl.slowest_tool_chain(tok, [[answer]], 0.2) == 0.0


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
  assert out["async_batches_ready"] in (0, 1)  # of the one timed step
  # One timed step of 2 x 2 episodes, each with one call: the slowest call of the four bounds the sync loop.
  assert 0 < out["tool_chain_s"] <= out["sync_pause_rollout_s"]
  assert out["sync_tool_chain_frac"] == pytest.approx(out["tool_chain_s"] / out[f"sync_{out['sync_schedule']}_wall_s"])
