"""The regression guard of the benchmarks: every ratio a benchmark measures within one run, against a threshold.

Each benchmark (sampler, rollout, update, sandbox, async_rl) holds its JSON line to these thresholds (`judge`,
recorded in the line as `guard`), prints it, and exits with status 1 naming each figure that fell short
(`exit_on`). Only ratios of quantities measured side by side in the same run are checked (ours against the
XLA:CPU step floor, a peer, the re-prefill loop, or the matmul peak of the same rounds), never absolute times,
so a threshold holds on any machine whose load does not change faster than a round. The thresholds live here,
in one table:

  full   the benchmarks' default workloads (bench_5m / bench_58m; the README's performance table): issue 32's
         targets (the rollout's compile at what XLA:CPU can reach, see its bound), and for the update step what it
         measured before (MFU 0.57, 1.32x its floor, 1.67x Tunix);
  smoke  the reduced workloads of `--smoke` (what `tests/bench/test_bench_guard.py`, marked slow, runs): looser,
         as short runs are noisier and spend more of their time outside the measured loop, but each fails the
         figure `--smoke` measured (`MEASURED`) once it loses a third (a time 1.5x, a speedup or MFU at 2/3).

`--no-check` skips the guard (a bisect, a run on purpose outside the envelope).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Bound:
  """A lower (`min`) or upper (`max`) bound on one figure of a benchmark's JSON line.

  Attributes:
    figure: the name the failure message uses (a field of the line, or derived by `FIGURES`).
    kind: "min" (the figure must be >= value) or "max" (<= value).
    value: the threshold.
  """

  figure: str
  kind: str
  value: float

  def __post_init__(self):
    if self.kind not in ("min", "max"):
      raise ValueError(f"Bound.kind must be 'min' or 'max', got {self.kind!r}")

  def holds(self, x: float) -> bool:
    return x >= self.value if self.kind == "min" else x <= self.value


def _ratio(num: str, den: str) -> Callable[[dict], float | None]:
  return lambda line: line[num] / line[den] if line.get(num) and line.get(den) else None


# Figures derived from a JSON line (None: not measured in this run, e.g. a peer left out; not checked).
FIGURES: dict[str, dict[str, Callable[[dict], Any]]] = {
    "sampler": {
        # our decode step over the XLA:CPU step floor (its matrix products alone) timed in the same rounds
        "step_over_floor": _ratio("ours_step_ms", "xla_step_floor_ms"),
        "speedup_tunix": lambda line: line.get("speedup_tunix"),
        "speedup_hf": lambda line: line.get("speedup_hf"),
    },
    "rollout": {
        "speedup_over_reprefill": lambda line: line["speedup"],
        "compile_frac_of_round": lambda line: line["compile_frac_of_round"],
        # exactness, as 0/1: both loops wrote the same transcripts, and every token was prefilled once
        "transcripts_match": lambda line: float(line["transcripts_match"]),
        "prefill_exact": lambda line: float(line["prefilled_tokens"] == line["expected_prefill_tokens"]),
    },
    "update": {
        "mfu": lambda line: line["mfu"],  # against the best matmul of the same run
        # our step over the step floor (its matrix products alone, forward and backward) of the same rounds
        "step_over_floor": _ratio("mfu_at_step_floor", "mfu"),
        "speedup_tunix": lambda line: line.get("speedup"),
    },
    "sandbox": {
        "serial_speedup": lambda line: line["serial_speedup"],
        "batch_speedup": lambda line: line["batch_speedup"],
    },
    "async_rl": {
        # the rollout stream's trained tokens per second over the synchronous loop's, the same work on the clock
        "speedup": lambda line: line["speedup"],
        # that speedup over what one device allows on the run's own tool draws (`async_schedule.one_device`):
        # the stream's scheduling, less the luck of the draws and the host's speed
        "over_one_device": lambda line: line["async_over_one_device"],
        "trained_tokens_equal": lambda line: float(line["trained_tokens_equal"]),
    },
}

THRESHOLDS: dict[str, dict[str, tuple[Bound, ...]]] = {
    "sampler": {
        "full": (Bound("step_over_floor", "max", 1.35), Bound("speedup_tunix", "min", 1.8),
                 Bound("speedup_hf", "min", 1.8)),
        # 64 tokens: the prefill and the grows are a larger share of the call than at 256
        "smoke": (Bound("step_over_floor", "max", 2.8), Bound("speedup_tunix", "min", 1.4)),  # no HF in --smoke
    },
    "rollout": {
        # Compile: issue 32 asked for 0.25 of a round or the measured reason it cannot be. It cannot on XLA:CPU:
        # the five programs no rollout does without (init, prefill, the layer split, one decode, one extend)
        # take 0.29 of a round to compile, and a rollout at one capacity from its start (6-8 programs) measured
        # 0.32-0.36, its rounds within noise to 9% slower (README, TPU quickstart -> Benchmarks). The default
        # capacity ladder measures 0.78-0.81 (14-16 programs); the bound fails a quarter more.
        "full": (Bound("speedup_over_reprefill", "min", 3.5), Bound("compile_frac_of_round", "max", 1.0),
                 Bound("transcripts_match", "min", 1), Bound("prefill_exact", "min", 1)),
        # 2 tool turns instead of 4 (re-prefill's cost grows with the turns), and 16 episodes: the compile outweighs
        # a round several times over
        "smoke": (Bound("speedup_over_reprefill", "min", 1.5), Bound("compile_frac_of_round", "max", 8.0),
                  Bound("transcripts_match", "min", 1), Bound("prefill_exact", "min", 1)),
    },
    "update": {
        "full": (Bound("mfu", "min", 0.45), Bound("step_over_floor", "max", 1.5), Bound("speedup_tunix", "min", 1.4)),
        "smoke": (Bound("mfu", "min", 0.32), Bound("step_over_floor", "max", 2.0), Bound("speedup_tunix", "min", 1.0)),
    },
    "sandbox": {  # the full run (64-call batches) was not measured apart from the smoke one: the same bounds
        "full": (Bound("serial_speedup", "min", 2.2), Bound("batch_speedup", "min", 1.6)),
        "smoke": (Bound("serial_speedup", "min", 2.2), Bound("batch_speedup", "min", 1.6)),
    },
    "async_rl": {
        # bench_5m on two cores: decode and update fill them (0.91 busy synchronously), so the stream gains little
        # over the synchronous loop (1.02x measured, 2026-12-06 evening; README, Asynchronous RL); the bound asks
        # that it not lose more than the noise of one run to it
        "full": (Bound("speedup", "min", 0.9), Bound("trained_tokens_equal", "min", 1)),
        # The one-device model does not hold at bench_5m, where decode and update share the cores (not bounded
        # there); at tiny size the stream reached it (0.98 at --smoke, 1.02 over 16 timed steps, 2026-12-07).
        "smoke": (Bound("speedup", "min", 1.0), Bound("over_one_device", "min", 0.8),
                  Bound("trained_tokens_equal", "min", 1)),
    },
}


# Exactness figures (0/1): their bound is 1, whatever the machine.
EXACT = ("transcripts_match", "prefill_exact", "trained_tokens_equal")

# What the smoke thresholds were set from: each figure as `--smoke` measured it on this project's machine (2 shared
# cores; medians over the run's rounds). `tests/bench/test_bench_guard.py` checks that every smoke bound passes
# these and fails them a third worse. The full thresholds are issue 32's targets (the README's performance run
# says what this machine measured).
MEASURED: dict[str, dict[str, float]] = {
    # 2026-12-04, load average 18-25 on the 2 cores; the rollout's re-prefill ratio and the update's Tunix ratio
    # from the quiet machine (23:40, alone: CI's bench stage), where both are lower than under load (the peer's
    # side slowed more there): rollout 1.67-1.74 (also at 8716b54, before the later merges), update vs Tunix
    # 1.12-1.18
    "sampler": {"step_over_floor": 2.16, "speedup_tunix": 1.86},  # HF is left out of --smoke
    "rollout": {"speedup_over_reprefill": 1.67, "compile_frac_of_round": 6.31},  # compile 63.5 s (9 programs)
    "update": {"mfu": 0.42, "step_over_floor": 1.56, "speedup_tunix": 1.12},  # best of 3 rounds, as the benchmark
    "sandbox": {"serial_speedup": 2.98, "batch_speedup": 2.13},
    # 2026-12-06, alone (tool chains 6.1 s of the synchronous loop's 7.6 s); over_one_device 2026-12-07, alone
    # (speedup 1.33 again, the one-device model 1.36 on the run's draws)
    "async_rl": {"speedup": 1.33, "over_one_device": 0.98},
}


def skipped(bench: str, line: dict, scale: str) -> list[str]:
  """The bounded figures `line` did not measure (a peer left out), which `check` cannot hold."""
  return [b.figure for b in THRESHOLDS[bench][scale] if FIGURES[bench][b.figure](line) is None]


def check(bench: str, line: dict, scale: str) -> list[str]:
  """The failures of `line` (a benchmark's JSON record) against `THRESHOLDS[bench][scale]`, one message each;
  figures this run did not measure are skipped (`skipped` names them)."""
  failures = []
  for bound in THRESHOLDS[bench][scale]:
    x = FIGURES[bench][bound.figure](line)
    if x is None:
      continue
    if not bound.holds(x):
      op = ">=" if bound.kind == "min" else "<="
      where = f" ({line['size']})" if "size" in line else (f" ({line['model']})" if "model" in line else "")
      failures.append(f"{bench}{where}: {bound.figure} = {x:.3f}, the guard wants {op} {bound.value} ({scale})")
  return failures


def judge(bench: str, line: dict, scale: str, enabled: bool = True) -> list[str]:
  """`check`, recorded in the line as `guard` (the scale, whether it passed, the figures it could not hold as
  the run left them out; None when not checked), so the printed record says what it was held to. Returns the
  failures."""
  if not enabled:
    line["guard"] = None
    return []
  failures = check(bench, line, scale)
  line["guard"] = {"scale": scale, "passed": not failures, "failures": failures,
                   "skipped": skipped(bench, line, scale)}
  return failures


def exit_on(failures: list[str]) -> None:
  """Names each figure that fell short on stderr and exits with status 1 (after the JSON lines are printed)."""
  if failures:
    for msg in failures:
      print(f"[bench guard] FAIL {msg}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None, smoke: tuple[str, ...]
               ) -> tuple[argparse.Namespace, str]:
  """Adds `--smoke` and `--no-check` to a benchmark's parser and parses `argv`; with `--smoke` the `smoke`
  arguments come first (later flags still override them). Returns `(args, scale)`."""
  parser.add_argument("--smoke", action="store_true", help="the reduced workload, held to the smoke thresholds "
                      "of agentrl_jax/bench/guard.py (later flags still override its settings)")
  parser.add_argument("--no-check", dest="check", action="store_false",
                      help="print the JSON line without holding it to agentrl_jax/bench/guard.py")
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parser.parse_args(argv)
  if args.smoke:
    args = parser.parse_args([*smoke, *argv])
  return args, "smoke" if args.smoke else "full"
