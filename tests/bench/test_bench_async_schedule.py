"""The model of the asynchronous schedule (bench/async_schedule.py): at staleness 0 it is the synchronous loop
exactly; at staleness K at most K + 1 batches overlap, so no schedule beats K + 1 times the synchronous loop."""

import json

import numpy as np

from agentrl_jax.bench import async_schedule


def test_staleness_zero_is_the_synchronous_loop_and_staleness_bounds_the_overlap():
  times = async_schedule.group_times(np.random.default_rng(0), 200, 8, 4, 3, 0.2, 0.15)
  sync = async_schedule.synchronous(times, 0.35)
  assert np.array_equal(async_schedule.batch_order(times, 0.35, 0), sync)
  assert np.allclose(async_schedule.completion_order(times, 0.35, 0, slots=8), sync)
  speedups = []
  for k in (1, 2):
    batch = async_schedule.batch_order(times, 0.35, k)
    done = async_schedule.completion_order(times, 0.35, k, slots=(k + 1) * 8)
    assert np.all(np.diff(batch) >= 0.35 - 1e-9) and np.all(np.diff(done) >= 0.35 - 1e-9)  # one update a step
    # Batch j cannot end before the update of step j - k - 1 plus its own slowest group and update.
    assert np.all(batch[k + 1:] >= batch[:-k - 1] + times.max(1)[k + 1:] + 0.35 - 1e-9)
    speedups.append(sync[-1] / batch[-1])
    assert 1.0 < speedups[-1] <= k + 1
  assert speedups[0] < speedups[1]


def test_the_model_prints_one_json_line(capsys):
  async_schedule.main(["--steps", "64", "--window", "8", "--prompts", "4", "--n", "2"])
  (line,) = capsys.readouterr().out.strip().splitlines()
  out = json.loads(line)
  assert out["bench"] == "async_schedule" and out["steps"] == 64
  assert out["sync_step_s"] > out["batch_order_step_s"] > 0
  assert 1.0 < out["speedup_batch_order"] <= 2.0 and 1.0 < out["speedup_batch_order_window"] <= 2.0
