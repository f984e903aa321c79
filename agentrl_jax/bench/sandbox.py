"""Local sandbox benchmark: worker mode vs per-call mode of `LocalExecutor`, side by side; prints ONE JSON line.

    python -m agentrl_jax.bench.sandbox                                      # 64-call batches, 2 slots, 5 rounds
    python -m agentrl_jax.bench.sandbox --smoke                              # the guard's test
    python -m agentrl_jax.bench.sandbox --calls 4 --serial 2 --rounds 1 --no-check   # a quick look

Workload: `print(37*41)` (the tool call's fixed cost is what is measured). Per round and mode, interleaved:
`serial` calls one at a time (latency of each, as the caller sees it), then one batch of `calls` calls through
`run_batch` with `concurrency` slots (wall seconds). Each mode's executor is built and warmed up (every slot
started) before the first round.

Fields: <mode>.serial_ms_median / serial_ms_min over all serial calls of all rounds; <mode>.batch_ms_per_call
median / min over rounds of batch seconds / calls; <mode>.batch_calls_s = calls / median batch seconds;
serial_speedup, batch_speedup = median over rounds of the per-round ratio per_call / worker; worker_start_s =
building the worker executor (its first worker and probe program).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from agentrl_jax.bench import guard
from agentrl_jax.tools import sandbox
from agentrl_jax.tools.base import ToolConfig

CODE = "print(37*41)"
# --smoke (the guard's slow test): 16-call batches, 8 serial calls, 2 rounds (later flags override).
SMOKE = ("--calls", "16", "--serial", "8", "--rounds", "2")
MODES = ("per_call", "worker")


def run(args: argparse.Namespace) -> dict:
  """Measures both modes; returns the JSON record."""
  executors, start_s = {}, {}
  try:
    for mode in MODES:
      t = time.perf_counter()
      executors[mode] = sandbox.LocalExecutor(ToolConfig(timeout_s=30.0, memory_mb=512,
                                                         max_concurrency=args.concurrency, local_mode=mode))
      start_s[mode] = time.perf_counter() - t
      if executors[mode].local_mode != mode:
        raise SystemExit(f"bench.sandbox: {mode} mode is not available here: {executors[mode].worker_unavailable}")
      # Warm-up: start every slot (a worker per slot) and page in the interpreter.
      executors[mode].run_batch([f"import time; time.sleep(0.2); {CODE}"] * args.concurrency + [CODE] * 4)
    serial = {m: [] for m in MODES}
    batch = {m: [] for m in MODES}
    ratios = {"serial": [], "batch": []}
    for _ in range(args.rounds):
      round_serial = {}
      for mode in MODES:
        times = []
        for _ in range(args.serial):
          t = time.perf_counter()
          r = executors[mode].submit(CODE).result()
          times.append(time.perf_counter() - t)
          _check(r, mode)
        serial[mode] += times
        round_serial[mode] = statistics.median(times)
        t = time.perf_counter()
        results = executors[mode].run_batch([CODE] * args.calls)
        batch[mode].append(time.perf_counter() - t)
        for r in results:
          _check(r, mode)
      ratios["serial"].append(round_serial["per_call"] / round_serial["worker"])
      ratios["batch"].append(batch["per_call"][-1] / batch["worker"][-1])
  finally:
    for executor in executors.values():
      executor.close()
  out = {"bench": "sandbox", "code": CODE, "calls": args.calls, "serial": args.serial, "rounds": args.rounds,
         "concurrency": args.concurrency}
  for mode in MODES:
    out[mode] = {
        "serial_ms_median": round(1e3 * statistics.median(serial[mode]), 2),
        "serial_ms_min": round(1e3 * min(serial[mode]), 2),
        "batch_ms_per_call_median": round(1e3 * statistics.median(batch[mode]) / args.calls, 2),
        "batch_ms_per_call_min": round(1e3 * min(batch[mode]) / args.calls, 2),
        "batch_calls_s": round(args.calls / statistics.median(batch[mode]), 1),
    }
  out["serial_speedup"] = round(statistics.median(ratios["serial"]), 2)
  out["batch_speedup"] = round(statistics.median(ratios["batch"]), 2)
  out["worker_start_s"] = round(start_s["worker"], 3)
  return out


def _check(r, mode: str) -> None:
  if r.status != "ok" or r.stdout != "1517\n":
    raise RuntimeError(f"bench.sandbox: {mode} call failed: {r}")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  p.add_argument("--calls", type=int, default=64, help="calls per batch")
  p.add_argument("--serial", type=int, default=20, help="one-at-a-time calls per round and mode")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--concurrency", type=int, default=2, help="executor slots (max_concurrency)")
  args, scale = guard.parse_args(p, argv, SMOKE)
  line = run(args)
  failures = guard.judge("sandbox", line, scale, args.check)
  print(json.dumps(line), flush=True)
  guard.exit_on(failures)


if __name__ == "__main__":
  main()
