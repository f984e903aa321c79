"""Two runs of the main job compared on the same held-out problems, with paired 95% bootstrap intervals.

    python -m agentrl_jax.pipeline.compare runs/sync runs/async [--stage eval_rl] [--k 4] [--json]

Reads each run's evaluation rollouts (`<run>/<stage>/eval_rollouts.jsonl`, and `greedy/` beside it) and prints
`pipeline.changes`' table of A -> B: each metric of both policies and the paired change with its interval (both
policies' values on the same resampled problems). The runs must have evaluated the same problems (the same seed
of the task's splits), e.g. the synchronous and asynchronous arms of one seed; also the RL wall time of each.
"""

from __future__ import annotations

import argparse
import json
import os

from agentrl_jax.pipeline import changes as changes_lib


def compare(run_a: str, run_b: str, *, stage: str = "eval_rl", k: int = 4) -> dict:
  """`{metric: paired change}` of A -> B (`changes_lib.changes`), plus each run's RL-stage wall seconds.

  Raises:
    ValueError: a run lacks the stage's rollouts, or the runs evaluated different problems.
  """
  tables = []
  for run in (run_a, run_b):
    d = os.path.join(run, stage)
    if not os.path.exists(os.path.join(d, changes_lib.ROLLOUTS)):
      raise ValueError(f"compare: {d} has no {changes_lib.ROLLOUTS} (has the run finished its {stage} stage?)")
    tables.append(changes_lib.policy_table(d, k))
  a, b = tables
  metric = f"avg@{k}"
  if set(a[metric]) != set(b[metric]):
    raise ValueError(f"compare: {run_a} and {run_b} evaluated different problems (another task seed?)")
  out = {"changes": changes_lib.changes(a, b, k)}
  for name, run in (("a", run_a), ("b", run_b)):
    path = os.path.join(run, "rl", "stage.json")
    if os.path.exists(path):
      with open(path) as f:
        out[f"rl_wall_s_{name}"] = json.load(f)["timing"]["wall_s"]
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("run_a")
  p.add_argument("run_b")
  p.add_argument("--stage", default="eval_rl")
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--json", action="store_true")
  args = p.parse_args(argv)
  out = compare(args.run_a, args.run_b, stage=args.stage, k=args.k)
  if args.json:
    print(json.dumps(out))
    return
  print(changes_lib.change_table(out["changes"], args.k, before="A", after="B"))
  if "rl_wall_s_a" in out and "rl_wall_s_b" in out:
    print(f"RL stage wall: A {out['rl_wall_s_a']:.1f} s, B {out['rl_wall_s_b']:.1f} s "
          f"(A / B = {out['rl_wall_s_a'] / out['rl_wall_s_b']:.2f})")


if __name__ == "__main__":
  main()
