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

Every schedule sees the same draws. Fields: *_step_s (mean seconds a step), speedup_* (synchronous over each),
over `--steps` steps from an empty pipeline (the steady state at the default 3,000) and over the first
`--window` of them (bench.async_rl's clock, which starts the stream empty), and the draws' mean slowest group.
The model leaves out what a 2-core host adds: decode and update sharing the cores (bench.async_rl's
cpu_busy_frac) and the stream's decode calls costing their slots, not their live rows.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

SIGMA = math.log(10.0) / 2.326  # the calls' lognormal: median m, p99 = m * exp(2.326 sigma) = 10 m


def group_times(rng: np.random.Generator, steps: int, prompts: int, n: int, tool_turns: int, tool_median_s: float,
                decode_s: float) -> np.ndarray:
  """[steps, prompts] seconds: each group's slowest episode (its calls one after another, and its decode)."""
  calls = tool_median_s * np.exp(SIGMA * rng.standard_normal((steps, prompts, n, tool_turns)))
  return (calls.sum(-1) + decode_s * (tool_turns + 1)).max(-1)


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
  times = group_times(np.random.default_rng(seed), steps, prompts, n, tool_turns, tool_median_s, decode_s)
  ends = {"sync": synchronous(times, update_s), "batch_order": batch_order(times, update_s, staleness),
          "completion_order": completion_order(times, update_s, staleness, slots=(staleness + 1) * prompts)}
  out = {"bench": "async_schedule", "prompts": prompts, "n": n, "tool_turns": tool_turns,
         "tool_median_s": tool_median_s, "decode_s": decode_s, "update_s": update_s, "staleness": staleness,
         "steps": steps, "window": window, "slowest_group_mean_s": float(times.max(1).mean())}
  for name, end in ends.items():
    out[f"{name}_step_s"] = float(end[-1] / steps)
  for name in ("batch_order", "completion_order"):
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
