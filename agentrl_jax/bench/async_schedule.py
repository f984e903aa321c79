"""What the asynchronous schedule allows against the synchronous loop when decode and update share nothing (an
accelerator's picture): a model, to read bench.async_rl's measured speedup against. It times nothing.

    python -m agentrl_jax.bench.async_schedule                          # bench.async_rl's 8 x 4 episodes
    python -m agentrl_jax.bench.async_schedule --prompts 4 --n 2        # its --smoke workload

The model. A group's time is the slowest of its n episodes; an episode makes `--tool-turns` remote calls
(bench.async_rl's latency: lognormal, median `--tool-median-s`, p99 ten times that) and decodes `--tool-turns + 1`
turns of `--decode-s` each. The synchronous loop's step is its batch's slowest group, then the update. The rollout
stream (rl/stream.py, `max_staleness` K, row slots for K + 1 batches) trains batch j at step j and starts it once
the update of step j - K - 1 has reached the sampler (admission control): the update of batch j ends at

    T_j = max(T_(j-1), T_(j-K-1) + c_j) + update      (c_j: batch j's slowest group)

At K = 0 that is the synchronous loop. `completion` is an alternative the code does not take, for comparison:
each step trains the first `--prompts` groups to finish, those at their deadline first, and a group starts only
while every started group can still be trained within K versions of its start (AReaL's admission, per group).

`one_device` is `batch_order` on one device that runs its programs one at a time in the order they were
dispatched (an accelerator's, and XLA:CPU's, stream): a decode turn stops while an update runs (an update that
starts mid-turn delays the rest of the turn by its length), so the next batch's episodes wait behind every update
they meet. Colocated, with each update dispatched whole, the stream can do no better than this; `batch_order`'s
ceiling, decode beside every update, needs the sampler on devices of its own.

Every schedule sees the same draws. Fields: *_step_s (mean seconds a step), speedup_* (synchronous over each),
over `--steps` steps from an empty pipeline (the steady state at the default 3,000) and over the first
`--window` of them (bench.async_rl's clock, which starts the stream empty), and the draws' mean slowest group.
The model leaves out what a 2-core host adds: decode and update sharing the cores (bench.async_rl's
cpu_busy_frac) and the stream's decode calls costing their slots, not their live rows.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math

import numpy as np

SIGMA = math.log(10.0) / 2.326  # the calls' lognormal: median m, p99 = m * exp(2.326 sigma) = 10 m


def episode_calls(rng: np.random.Generator, steps: int, prompts: int, n: int, tool_turns: int,
                  tool_median_s: float) -> np.ndarray:
  """[steps, prompts, n, tool_turns] seconds: every call's latency, episode by episode."""
  return tool_median_s * np.exp(SIGMA * rng.standard_normal((steps, prompts, n, tool_turns)))


def slowest_groups(calls: np.ndarray, decode_s: float) -> np.ndarray:
  """[steps, prompts] seconds: each group's slowest episode (its calls one after another, and its decode)."""
  return (calls.sum(-1) + decode_s * (calls.shape[-1] + 1)).max(-1)


def synchronous(times: np.ndarray, update_s: float) -> np.ndarray:
  """When each step's update ends: its batch rolled out from empty slots, then trained."""
  done, out = 0.0, []
  for c in times.max(1):
    done = done + c + update_s
    out.append(done)
  return np.asarray(out)


def batch_order(times: np.ndarray, update_s: float, staleness: int) -> np.ndarray:
  """The rollout stream: batch j starts once update j - staleness - 1 has ended, and is trained at step j."""
  done = [0.0] * (staleness + 1)  # the updates "before" step 0: the pipeline starts empty
  for c in times.max(1):
    done.append(max(done[-1], done[-staleness - 1] + c) + update_s)
  return np.asarray(done[staleness + 1:])


def _decode_on(t: float, work: float, starts: list[float], ends: list[float]) -> float:
  """When `work` seconds of decode started at `t` end, on a device that runs the updates [starts[i], ends[i])
  (sorted, disjoint) whole and in their turn: decode stops while one runs."""
  i = bisect.bisect_right(ends, t)
  while i < len(starts) and starts[i] < t + work:
    work -= max(0.0, starts[i] - t)
    t = max(t, ends[i])
    i += 1
  return t + work


def one_device(calls: np.ndarray, decode_s: float, update_s: float, staleness: int) -> np.ndarray:
  """`batch_order` on one device: batch j starts once update j - staleness - 1 has ended, each of its episodes
  alternates a decode turn of `decode_s` with a call of `calls[j, ..., turn]` (`calls`: [steps, ..., turns]) and
  ends on a decode turn, and a decode turn does not run while an update does."""
  done = [0.0] * (staleness + 1)
  starts: list[float] = []
  ends: list[float] = []
  for batch in calls:
    start, finish = done[-staleness - 1], 0.0
    for episode in batch.reshape(int(np.prod(batch.shape[:-1])), batch.shape[-1]):
      t = start
      for wait in episode:
        t = _decode_on(t, decode_s, starts, ends) + wait
      finish = max(finish, _decode_on(t, decode_s, starts, ends))
    begin = max(done[-1], finish)
    starts.append(begin)
    ends.append(begin + update_s)
    done.append(begin + update_s)
  return np.asarray(done[staleness + 1:])


def completion_order(times: np.ndarray, update_s: float, staleness: int, slots: int) -> np.ndarray:
  """Each step trains the first groups to finish (those due first), a group starting only while every started
  group can still be trained within `staleness` versions of its start."""
  steps, prompts = times.shape
  flat = times.reshape(-1)
  started, running, finished = 0, [], []  # running: (finish time, deadline step); finished: deadlines
  now, out = 0.0, []

  def admit(version: int, step: int):
    nonlocal started
    while len(running) < slots and started < flat.size:
      due = version + staleness
      owed = sum(d <= due for _, d in running) + sum(d <= due for d in finished)
      if owed + 1 > (due - step + 1) * prompts:
        return
      running.append((now + flat[started], due))
      started += 1

  admit(0, 0)
  for step in range(steps):
    while True:
      for g in [g for g in running if g[0] <= now]:
        running.remove(g)
        finished.append(g[1])
      if len(finished) >= prompts and not any(d <= step for _, d in running):
        break
      now = min(f for f, _ in running)
      admit(step, step)
    finished.sort()
    del finished[:prompts]
    now += update_s
    out.append(now)
    admit(step + 1, step + 1)
  return np.asarray(out)


def run(prompts: int = 8, n: int = 4, tool_turns: int = 3, tool_median_s: float = 0.2, decode_s: float = 0.15,
        update_s: float = 0.35, staleness: int = 1, steps: int = 3000, window: int = 16, seed: int = 0) -> dict:
  calls = episode_calls(np.random.default_rng(seed), steps, prompts, n, tool_turns, tool_median_s)
  times = slowest_groups(calls, decode_s)
  ends = {"sync": synchronous(times, update_s), "batch_order": batch_order(times, update_s, staleness),
          "completion_order": completion_order(times, update_s, staleness, slots=(staleness + 1) * prompts),
          "one_device": one_device(calls, decode_s, update_s, staleness)}
  out = {"bench": "async_schedule", "prompts": prompts, "n": n, "tool_turns": tool_turns,
         "tool_median_s": tool_median_s, "decode_s": decode_s, "update_s": update_s, "staleness": staleness,
         "steps": steps, "window": window, "slowest_group_mean_s": float(times.max(1).mean())}
  for name, end in ends.items():
    out[f"{name}_step_s"] = float(end[-1] / steps)
  for name in ("batch_order", "completion_order", "one_device"):
    out[f"speedup_{name}"] = float(ends["sync"][-1] / ends[name][-1])
    out[f"speedup_{name}_window"] = float(ends["sync"][window - 1] / ends[name][window - 1])
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  for name, default in [("prompts", 8), ("n", 4), ("tool-turns", 3), ("tool-median-s", 0.2), ("decode-s", 0.15),
                        ("update-s", 0.35), ("staleness", 1), ("steps", 3000), ("window", 16), ("seed", 0)]:
    p.add_argument(f"--{name}", type=type(default), default=default)
  args = p.parse_args(argv)
  print(json.dumps(run(**vars(args))))


if __name__ == "__main__":
  main()
