"""The pipeline's report: `summary.json`, `report.md`, the before/after table, and the RL curves as PNG plots.

    summary = {"sft": {"avg@4": ..., "pass@4": ..., "maj@4": ..., "tool_calls_per_response": ...,
                       "tool_success_rate": ..., "response_len_mean": ..., "greedy@1": ...},
               "rl": {...the same keys...},
               "delta": {"avg@4": {"before": ..., "after": ..., "change": ..., "ci95": [lo, hi], "problems": n},
                         ...every key...},
               "ci95": {"sft": {"avg@4": [lo, hi], ...}, "rl": {...}},
               "by_level": {"0": {...avg@4 of the level's problems, as in delta...}, "1": ..., ...},
               "stages": {"<stage>": {"wall_s": ..., "compile_s": ..., "compiled_programs": ..., ...}, ...},
               "wall_s": ..., "plots": ["rl_curves.png", ...], ...}

Accuracies are fractions in [0, 1]; `tool_success_rate` is null when no tool was called. Intervals are 95%
percentile bootstrap intervals over the held-out problems (`evaluation.bootstrap`); a change's interval is
paired: both policies' values on the same resampled problems (`pipeline.changes`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import ml_collections

from agentrl_jax.pipeline import changes as changes_lib
from agentrl_jax.pipeline import stages

# (file stem, title, [(metrics.jsonl key, label)]) for each plot against the RL step.
CURVES = (
    ("reward", "training reward", [("reward/mean", "reward (shaped)"), ("reward/acc", "accuracy (train)")]),
    ("heldout_accuracy", "held-out accuracy", [("eval/{source}/avg@{k}", "avg@{k}"),
                                               ("eval/{source}/pass@{k}", "pass@{k}")]),
    ("entropy", "policy entropy (nats/token)", [("train/entropy", "entropy")]),
    ("clip_fraction", "clip fractions", [("train/clip_frac_low", "low (1 - 0.2)"),
                                         ("train/clip_frac_high", "high (1 + clip_high)")]),
    ("tool_calls", "tool calls per response", [("response/tool_calls_mean", "calls / response")]),
    ("response_length", "response length (tokens)", [("response/length_mean", "mean")]),
)
# Plotted only when the run logs them: asynchronous runs (the stream's metrics) and runs whose update sees the
# sampler's log-probs (behaviour vs trainer).
EXTRA_CURVES = (
    ("asynchrony", "asynchronous RL", "async/buffer_groups",
     [("async/staleness_mean", "staleness: mean (versions)"), ("async/staleness_max", "staleness: max"),
      ("time/trainer_idle_frac", "trainer idle (fraction)"), ("time/rollout_idle_frac", "rollout idle (fraction)"),
      ("time/cpu_busy_frac", "host cores busy (fraction)"), ("async/partial_frac", "partial episodes (fraction)")]),
    ("offpolicy", "behaviour vs trainer policy", "train/is_ess",
     [("train/is_weight_mean", "IS weight: mean"), ("train/is_ess", "IS effective sample size"),
      ("train/behav_kl_k3", "KL (k3)"), ("train/rejected_token_frac", "rejected tokens (fraction)")]),
)


def stage_line(stage: str, result: dict[str, Any]) -> str:
  """What a finished stage did, in one line."""
  if stage == "data":
    s = result["splits"]
    return (f"held-out {s['heldout']['problems']}, SFT {s['sft']['problems']}, RL pool {s['rl']['problems']} "
            "problems (disjoint)")
  if stage == "teacher":
    calls = result.get("tool_calls_per_conversation")
    extra = f", {calls:.2f} tool calls each" if calls is not None else ""
    return f"{result['conversations']} {result['source']} trajectories ({result['dropped']} dropped){extra}"
  if stage == "sft":
    f = result["final"]
    return f"final loss {f.get('loss', float('nan')):.4f} after {int(f.get('tokens', 0))} tokens in the last log window"
  if stage in ("eval_sft", "eval_rl"):
    m = result["metrics"]
    return "  ".join(f"{k} {_fmt(v, '{:.3f}')}" for k, v in m.items())
  if stage == "filter":
    return (f"kept {result['kept']} of {result['prompts']} prompts with pass rate in {result['band']} "
            f"({result['all_correct']} always right, {result['all_wrong']} always wrong)")
  if stage == "rl":
    f = result["final"]
    return f"last step: reward {f.get('reward/mean', float('nan')):.3f}, train accuracy {f.get('reward/acc', 0):.3f}"
  return ""


def _fmt(value, spec: str) -> str:
  return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else spec.format(value)


def table(summary: dict[str, Any]) -> str:
  """The before/after table on the held-out split (each change with its paired 95% interval), avg@k by level,
  then each stage's wall and compile time."""
  k = summary["k"]
  lines = [f"held-out split: {summary['heldout_problems']} problems x {k} samples (T={summary['eval_temperature']}); "
           "95% CI: paired bootstrap over problems", ""]
  delta = summary.get("delta") or {}
  rows = {}
  for metric in changes_lib.metric_names(k):
    a, b = summary["sft"].get(metric), summary["rl"].get(metric)
    if metric not in summary["sft"] and metric not in summary["rl"]:
      continue
    d = delta.get(metric) if isinstance(delta.get(metric), dict) else {}
    change = d.get("change", None if a is None or b is None else b - a)
    rows[metric] = {"before": a, "after": b, "change": change, "ci95": d.get("ci95")}
  lines.append(changes_lib.change_table(rows, k))
  if summary.get("by_level"):
    lines += ["", changes_lib.level_table(summary["by_level"], f"avg@{k}")]
  lines += ["", f"| {'stage':<10} | {'wall s':>8} | {'compile s':>9} | {'programs':>8} |",
            f"|{'-' * 12}|{'-' * 10}|{'-' * 11}|{'-' * 10}|"]
  for stage, t in summary["stages"].items():
    lines.append(f"| {stage:<10} | {t['wall_s']:>8.1f} | {t['compile_s']:>9.1f} | {t['compiled_programs']:>8d} |"
                 + (" (earlier run)" if t.get("reused") else ""))
  lines.append(f"| {'total':<10} | {summary['wall_s']:>8.1f} | {summary['compile_s']:>9.1f} | {'':>8} |")
  return "\n".join(lines)


def plot_curves(rows: list[dict], out_dir: str, *, source: str, k: int, curve_problems: int = 0) -> list[str]:
  """One PNG per curve of `CURVES`, plus `rl_curves.png` with all of them; returns the file names.

  `curve_problems`: how many held-out problems the RL trainer's periodic evaluation uses (shown in the title).
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  def series(key):
    pts = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]

  names = []
  overview, axes = plt.subplots(2, 3, figsize=(13, 7))
  for (stem, title, keys), ax_all in zip(CURVES, axes.flat):
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for a in (ax, ax_all):
      for key, label in keys:
        key = key.format(source=source, k=k)
        x, y = series(key)
        if x:
          line, = a.plot(x, y, marker="o" if len(x) < 12 else None, markersize=3, label=label.format(k=k))
          xl, lo = series(f"{key}_ci95_lo")
          xh, hi = series(f"{key}_ci95_hi")
          if xl and xl == xh:  # the evaluation's 95% bootstrap interval over its problems
            a.fill_between(xl, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
      a.set_title(f"{title} ({curve_problems} problems, 95% CI)" if stem == "heldout_accuracy" and curve_problems
                  else title)
      a.set_xlabel("RL step")
      a.grid(alpha=0.3)
      if len(keys) > 1:
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, f"{stem}.png"), dpi=100)
    plt.close(fig)
    names.append(f"{stem}.png")
  overview.tight_layout()
  overview.savefig(os.path.join(out_dir, "rl_curves.png"), dpi=90)
  plt.close(overview)
  for stem, title, marker, keys in EXTRA_CURVES:
    if not any(marker in r for r in rows):
      continue
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, label in keys:
      x, y = series(key)
      if x:
        ax.plot(x, y, marker="o" if len(x) < 12 else None, markersize=3, label=label)
    ax.set_title(title)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, f"{stem}.png"), dpi=100)
    plt.close(fig)
    names.append(f"{stem}.png")
  return ["rl_curves.png", *names]


def _numbers(tree: Any, prefix: str = "") -> dict[str, float]:
  """The numeric leaves of a stage result, flattened to 'a/b/c' keys."""
  out: dict[str, float] = {}
  if isinstance(tree, dict):
    for key, value in tree.items():
      out.update(_numbers(value, f"{prefix}/{key}" if prefix else str(key)))
  elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
    out[prefix] = float(tree)
  return out


def write_stage_metrics(workdir: str, results: dict[str, Any], timings: dict[str, dict]) -> None:
  """Every stage's timing and numeric results as TensorBoard scalars and `metrics.jsonl` rows in the run's
  workdir, one step per stage in pipeline order (the trainers also log their own steps under sft/ and rl/)."""
  from agentrl_jax import metrics_writer

  with metrics_writer.MetricsWriter(workdir) as writer:
    for i, stage in enumerate(stages.ORDER):
      if stage in timings:
        values = {f"{stage}/{k}": v for k, v in _numbers(results.get(stage, {})).items()}
        values.update({f"{stage}/time/{k}": float(v) for k, v in timings[stage].items() if k != "reused"})
        writer.write(i + 1, values)


def _intervals(workdir: str, results: dict[str, Any], k: int) -> tuple[dict, dict, dict]:
  """`(delta, ci95, by_level)` of the summary from the evaluation stages' rollouts (empty where a stage did
  not run)."""
  tables = {}
  for name, stage in (("sft", "eval_sft"), ("rl", "eval_rl")):
    path = os.path.join(stages.stage_dir(workdir, stage), changes_lib.ROLLOUTS)
    if stage in results and os.path.exists(path):
      tables[name] = changes_lib.policy_table(stages.stage_dir(workdir, stage), k)
  ci95 = {name: {m: v["ci95"] for m, v in changes_lib.values(t, k).items()} for name, t in tables.items()}
  if len(tables) < 2:
    return {}, ci95, {}
  delta = changes_lib.changes(tables["sft"], tables["rl"], k)
  levels = changes_lib.split_levels(results["data"]["splits"][stages.HELDOUT]["path"])
  return delta, ci95, changes_lib.by_level(tables["sft"], tables["rl"], levels, f"avg@{k}")


def write(config: ml_collections.ConfigDict, workdir: str, results: dict[str, Any], timings: dict[str, dict],
          *, wall_s: Callable[[], float]) -> dict[str, Any]:
  """Writes summary.json, report.md, the plots and the per-stage TensorBoard scalars into `workdir`; returns
  the summary."""
  write_stage_metrics(workdir, results, timings)
  k = max(config.eval.ks)
  sft = results.get("eval_sft", {}).get("metrics", {})
  rl = results.get("eval_rl", {}).get("metrics", {})
  delta, ci95, levels = _intervals(workdir, results, k)
  plots = []
  if "rl" in results and os.path.exists(results["rl"]["metrics"]):
    plots = plot_curves(stages.read_jsonl(results["rl"]["metrics"]), workdir, source="toy_arith", k=k,
                        curve_problems=config.task.curve_problems)
  summary = {
      "name": config.name, "seed": config.seed, "k": k, "eval_temperature": config.eval.temperature,
      "heldout_problems": results.get("data", {}).get("splits", {}).get(stages.HELDOUT, {}).get("problems", 0),
      "sft": sft, "rl": rl, "delta": delta, "ci95": ci95, "by_level": levels,
      "teacher": {key: results["teacher"][key] for key in ("source", "conversations", "dropped")
                  if key in results.get("teacher", {})},
      "filter": {key: results["filter"][key] for key in ("prompts", "kept", "band", "pass_rate_mean")
                 if key in results.get("filter", {})},
      "stages": timings, "compile_s": sum(t["compile_s"] for t in timings.values()), "plots": plots,
  }
  summary["wall_s"] = wall_s()
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True, default=float)
  with open(os.path.join(workdir, "report.md"), "w") as f:
    f.write(f"# {config.name}\n\n{table(summary)}\n\n" + "".join(f"![{p}]({p})\n" for p in plots[:1]))
  return summary
