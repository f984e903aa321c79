"""Before/after changes of held-out metrics with paired 95% bootstrap intervals over problems, read from the
rollouts the evaluation stages save (`<eval dir>/eval_rollouts.jsonl`, and `greedy/` beside it).

    before, after = policy_table("runs/x/eval_sft", k=4), policy_table("runs/x/eval_rl", k=4)
    changes(before, after, k=4)["avg@4"]   # {"before": .586, "after": .770, "change": .184, "ci95": [.16, .21], ...}
    by_level(before, after, levels, "avg@4")  # the same per level of the task family

The main job's report, the ablations and the fresh-problem evaluation all compute their intervals here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Mapping
from typing import Any

from agentrl_jax.evaluation import bootstrap
from agentrl_jax.evaluation import runner as eval_runner
from agentrl_jax.tasks import arithmetic

ROLLOUTS = "eval_rollouts.jsonl"
GREEDY = "greedy"


def metric_names(k: int) -> tuple[str, ...]:
  """The reported metrics, in table order."""
  return (f"avg@{k}", f"pass@{k}", f"maj@{k}", "tool_calls_per_response", "tool_success_rate", "response_len_mean",
          "greedy@1")


def _rows(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def policy_table(eval_dir: str, k: int) -> dict[str, dict[Hashable, tuple[float, float]]]:
  """Per problem `(num, den)` of every metric of `metric_names(k)` (`bootstrap.problem_table`) from an evaluation
  directory; `greedy@1` from its `greedy/` run when there is one."""
  table = bootstrap.problem_table(eval_runner.samples_from_rows(_rows(os.path.join(eval_dir, ROLLOUTS))), k)
  greedy = os.path.join(eval_dir, GREEDY, ROLLOUTS)
  if os.path.exists(greedy):
    table["greedy@1"] = bootstrap.problem_table(eval_runner.samples_from_rows(_rows(greedy)), 1)["avg@1"]
  return table


def values(table: Mapping[str, bootstrap.Stats], k: int) -> dict[str, dict[str, Any]]:
  """Each metric of one policy with its interval: `{metric: {"value": v, "ci95": [lo, hi]}}`."""
  return {m: {"value": bootstrap.value(table[m]), "ci95": bootstrap.interval(table[m])}
          for m in metric_names(k) if m in table}


def changes(before: Mapping[str, bootstrap.Stats], after: Mapping[str, bootstrap.Stats],
            k: int) -> dict[str, dict[str, Any]]:
  """`bootstrap.paired_change` of every metric both tables have, in `metric_names(k)` order."""
  return {m: bootstrap.paired_change(before[m], after[m]) for m in metric_names(k) if m in before and m in after}


def split_levels(path: str) -> dict[Hashable, int]:
  """Problem id (as `bootstrap.problem_table` keys it) -> level, for a split file of the arithmetic family."""
  return {(arithmetic.DATA_SOURCE, i): p.level for i, p in enumerate(arithmetic.read_rl_parquet(path))}


def by_level(before: Mapping[str, bootstrap.Stats], after: Mapping[str, bootstrap.Stats],
             levels: Mapping[Hashable, int], metric: str) -> dict[str, dict[str, Any]]:
  """`paired_change` of `metric` on the problems of each level: `{"0": {..., "problems": n}, ...}`."""
  out = {}
  for level in arithmetic.LEVELS:
    b = {pid: v for pid, v in before[metric].items() if levels.get(pid) == level}
    a = {pid: v for pid, v in after[metric].items() if levels.get(pid) == level}
    if b and a:
      out[str(level)] = bootstrap.paired_change(b, a)
  return out


def _fmt(value, spec: str, signed: bool = False) -> str:
  if value is None:
    return "n/a"
  text = spec.format(value)
  return f"+{text}" if signed and value >= 0 else text


SPECS = {"tool_calls_per_response": "{:.2f}", "response_len_mean": "{:.1f}"}
LABELS = {"pass@{k}": "pass@{k} (unbiased)", "tool_calls_per_response": "tool calls / response",
          "tool_success_rate": "tool success rate", "response_len_mean": "response length (tokens)",
          "greedy@1": "greedy accuracy"}


def label(metric: str, k: int) -> str:
  for template, text in LABELS.items():
    if template.format(k=k) == metric:
      return text.format(k=k)
  return metric


def change_table(changed: Mapping[str, Mapping[str, Any]], k: int, *, before: str = "SFT",
                 after: str = "RL") -> str:
  """Markdown rows `| metric | before | after | change | 95% CI |` of `changes(...)`."""
  lines = [f"| {'metric':<26} | {before:>8} | {after:>8} | {'change':>8} | {'95% CI of change':>18} |",
           f"|{'-' * 28}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 20}|"]
  for metric, c in changed.items():
    spec = SPECS.get(metric, "{:.3f}")
    ci = c.get("ci95")
    ci_text = "n/a" if not ci else f"[{_fmt(ci[0], spec, True)}, {_fmt(ci[1], spec, True)}]"
    lines.append(f"| {label(metric, k):<26} | {_fmt(c['before'], spec):>8} | {_fmt(c['after'], spec):>8} | "
                 f"{_fmt(c['change'], spec, True):>8} | {ci_text:>18} |")
  return "\n".join(lines)


def level_table(levels: Mapping[str, Mapping[str, Any]], metric: str, *, before: str = "SFT",
                after: str = "RL") -> str:
  """Markdown rows `| level | problems | before | after | change | 95% CI |` of `by_level(...)`."""
  lines = [f"| {metric + ' by level':<18} | {'problems':>8} | {before:>8} | {after:>8} | {'change':>8} | "
           f"{'95% CI of change':>18} |",
           f"|{'-' * 20}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 20}|"]
  for level, c in levels.items():
    name = f"{level} ({arithmetic.LEVEL_NAMES[int(level)]})"
    ci = c.get("ci95")
    ci_text = "n/a" if not ci else f"[{_fmt(ci[0], '{:.3f}', True)}, {_fmt(ci[1], '{:.3f}', True)}]"
    lines.append(f"| {name:<18} | {c['problems']:>8d} | {_fmt(c['before'], '{:.3f}'):>8} | "
                 f"{_fmt(c['after'], '{:.3f}'):>8} | {_fmt(c['change'], '{:.3f}', True):>8} | {ci_text:>18} |")
  return "\n".join(lines)
