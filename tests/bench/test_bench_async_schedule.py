"""The model of the asynchronous schedule (bench/async_schedule.py): at staleness 0 it is the synchronous loop
exactly; at staleness K at most K + 1 batches overlap, so no schedule beats K + 1 times the synchronous loop."""

import json

import numpy as np
import pytest

from agentrl_jax.bench import async_schedule


def test_staleness_zero_is_the_synchronous_loop_and_staleness_bounds_the_overlap():
  times = async_schedule.slowest_groups(async_schedule.episode_calls(np.random.default_rng(0), 200, 8, 4, 3, 0.2), 0.15)
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
  assert 1.0 < out["speedup_one_device"] < out["speedup_batch_order"]


def test_a_decode_turn_stops_while_an_update_runs():
  # An update [0.1, 0.6): a turn started before it does 0.1 s, waits, and does the rest after it; one started
  # during it waits for its end; one started at its end runs through; a turn that meets two updates waits for both.
  assert async_schedule._decode_on(0.0, 0.3, [0.1], [0.6]) == pytest.approx(0.8)
  assert async_schedule._decode_on(0.2, 0.3, [0.1], [0.6]) == pytest.approx(0.9)
  assert async_schedule._decode_on(0.6, 0.3, [0.1], [0.6]) == pytest.approx(0.9)
  assert async_schedule._decode_on(0.0, 0.5, [0.1, 0.7], [0.6, 1.0]) == pytest.approx(1.3)
  assert async_schedule._decode_on(0.0, 0.1, [0.1], [0.6]) == pytest.approx(0.1)  # ends as the update starts


def test_one_device_waits_behind_the_updates_a_batch_meets():
  # One episode a step, one call, a decode turn of 0.1 s before and after it, updates of 0.5 s, staleness 1.
  # Step 0 from 0: decode to 0.1, call 1.0, decode to 1.2; update [1.2, 1.7). Step 1 from 0 (two batches at
  # once): decode to 0.1, call 1.15 to 1.25, inside update 0: waits to 1.7, decodes to 1.8; update [1.8, 2.3).
  # Step 2 from 1.7 (update 0's end): decode to 1.8 (as update 1 starts), call 0.05 to 1.85, waits to 2.3,
  # decodes to 2.4; update [2.4, 2.9). Without the device's order (batch_order): 1.7, 2.2 (1.35 + .5 < 1.7 + .5),
  # then max(2.2, 1.7 + 0.25) + .5 = 2.7.
  calls = np.asarray([1.0, 1.15, 0.05]).reshape(3, 1, 1, 1)  # [steps, prompts, n, calls]
  assert np.allclose(async_schedule.one_device(calls, 0.1, 0.5, 1), [1.7, 2.3, 2.9])
  assert np.allclose(async_schedule.batch_order(async_schedule.slowest_groups(calls, 0.1), 0.5, 1), [1.7, 2.2, 2.7])


def test_one_device_lies_between_the_synchronous_loop_and_batch_order():
  calls = async_schedule.episode_calls(np.random.default_rng(0), 200, 8, 4, 3, 0.2)
  times = async_schedule.slowest_groups(calls, 0.15)
  sync = async_schedule.synchronous(times, 0.35)
  assert np.allclose(async_schedule.one_device(calls, 0.15, 0.35, 0), sync)  # no batch beside an update
  assert np.allclose(async_schedule.one_device(calls, 0.15, 0.0, 1), async_schedule.batch_order(times, 0.0, 1))
  for k in (1, 2):
    one, free = async_schedule.one_device(calls, 0.15, 0.35, k), async_schedule.batch_order(times, 0.35, k)
    assert np.all(one >= free - 1e-9) and one[-1] > free[-1] and one[-1] < sync[-1]
