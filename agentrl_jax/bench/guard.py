"""The regression guard of the benchmarks: every ratio a benchmark measures within one run, against a threshold.

Each benchmark (sampler, rollout, update, sandbox) holds its JSON line to these thresholds (`judge`, recorded in the
line as `guard`), prints it, and exits with status 1 naming each figure that fell short (`exit_on`). Only ratios of quantities measured side
by side in the same run are checked (ours against the XLA:CPU step floor, a peer, the re-prefill loop, or the
matmul peak of the same rounds), never absolute times, so a threshold holds on any machine whose load does not
change faster than a round. The thresholds live here, in one table:

  full   the benchmarks' default workloads (bench_5m / bench_58m; the README's performance table);
  smoke  the reduced workloads of `--smoke` (what `tests/bench/test_bench_guard.py`, marked slow, runs): looser,
         as short runs are noisier, but each still fails when the figure loses a third (a decode step 1.5x
         slower, a speedup at 2/3), from the values measured on a loaded 2-core machine (the comments).

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
}

THRESHOLDS: dict[str, dict[str, tuple[Bound, ...]]] = {
    "sampler": {
        # issue 32's targets; measured: see the README's performance table
        "full": (Bound("step_over_floor", "max", 1.35), Bound("speedup_tunix", "min", 1.8),
                 Bound("speedup_hf", "min", 1.8)),
        "smoke": (Bound("step_over_floor", "max", 1.6), Bound("speedup_tunix", "min", 1.4),
                  Bound("speedup_hf", "min", 1.4)),
    },
    "rollout": {
        "full": (Bound("speedup_over_reprefill", "min", 3.5), Bound("compile_frac_of_round", "max", 0.25),
                 Bound("transcripts_match", "min", 1), Bound("prefill_exact", "min", 1)),
        "smoke": (Bound("speedup_over_reprefill", "min", 2.0), Bound("compile_frac_of_round", "max", 1.0),
                  Bound("transcripts_match", "min", 1), Bound("prefill_exact", "min", 1)),
    },
    "update": {
        "full": (Bound("mfu", "min", 0.45), Bound("step_over_floor", "max", 1.5), Bound("speedup_tunix", "min", 1.4)),
        "smoke": (Bound("mfu", "min", 0.25), Bound("step_over_floor", "max", 2.5), Bound("speedup_tunix", "min", 1.0)),
    },
    "sandbox": {
        "full": (Bound("serial_speedup", "min", 2.0), Bound("batch_speedup", "min", 1.5)),
        "smoke": (Bound("serial_speedup", "min", 1.3), Bound("batch_speedup", "min", 1.0)),
    },
}


# Exactness figures (0/1): their bound is 1, whatever the machine.
EXACT = ("transcripts_match", "prefill_exact")

# What the thresholds were set from: each figure as measured on this project's machine (2 shared cores), the full
# workloads in the README's performance run, the smoke ones by `--smoke` (medians of the runs named in the
# comments). `tests/bench/test_bench_guard.py` checks that every bound passes these and fails them a third worse.
MEASURED: dict[str, dict[str, dict[str, float]]] = {}


def check(bench: str, line: dict, scale: str) -> list[str]:
  """The failures of `line` (a benchmark's JSON record) against `THRESHOLDS[bench][scale]`, one message each;
  figures this run did not measure are skipped."""
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
  """`check`, recorded in the line as `guard` (the scale and whether it passed; None when not checked), so the
  printed record says what it was held to. Returns the failures."""
  if not enabled:
    line["guard"] = None
    return []
  failures = check(bench, line, scale)
  line["guard"] = {"scale": scale, "passed": not failures, "failures": failures}
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
