"""The paper's three findings in miniature: arms of the main job that differ in one choice, run with several
seeds, compared in one table (`bash launch/ablations.sh`; `configs/ablations.py`).

    (a) SFT data     real end-to-end teacher trajectories vs the stitched synthetic baseline, then the same RL
    (b) clipping     clip-higher (0.2 / 0.28) vs symmetric (0.2 / 0.2): entropy and held-out accuracy per step
    (c) tool use     the deliberative teacher (one call where the tool is needed) vs the frequent one (a call
                     for every problem and every operation): calls per response, tool success rate, accuracy

Every arm is the pipeline job itself (`pipeline.job.run`) in `<workdir>/<arm>-s<seed>/`. Arms of one seed share
the stages whose inputs are identical (the clipping arm reuses the baseline's data, teacher, SFT, evaluation
and filter stages through symlinks; every arm shares the data stage), and all arms share one compilation cache.
Outputs in the workdir: `ablations.md`, `ablations.json` and the comparison plots.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import ml_collections
import numpy as np

from agentrl_jax.pipeline import console, job, stages

log = logging.getLogger(__name__)

# finding -> (title, [(arm, label)]); the first arm of each finding is the baseline.
FINDINGS = {
    "a": ("SFT on real end-to-end trajectories vs stitched synthetic ones (then the same RL)",
          [("real", "real trajectories"), ("stitched", "stitched")]),
    "b": ("clip-higher vs symmetric clipping", [("real", "clip 0.2 / 0.28"), ("clip_sym", "clip 0.2 / 0.2")]),
    "c": ("deliberative vs frequent tool use", [("real", "deliberative teacher"), ("frequent", "frequent teacher")]),
}


def arm_config(base: ml_collections.ConfigDict, overrides: dict[str, Any], seed: int,
               cache_dir: str) -> ml_collections.ConfigDict:
  """The pipeline config of one arm: `base` with dotted-key `overrides`, the seed and the shared cache."""
  config = ml_collections.ConfigDict(base.to_dict())
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node[p]
    if leaf not in node:
      raise ValueError(f"ablations: arm override {key!r} names no field of the pipeline config")
    node[leaf] = value
  config.seed = seed
  config.compile_cache_dir = cache_dir
  config.name = f"{base.name}: {overrides or 'baseline'} seed {seed}"
  config.lock()
  return config


def _share_stages(config: ml_collections.ConfigDict, arm_dir: str, done: list[tuple[ml_collections.ConfigDict, str]]):
  """Symlinks the stages of earlier arms whose inputs equal this arm's (the pipeline then reuses them)."""
  for stage in stages.ORDER:
    target = os.path.join(arm_dir, stage)
    if os.path.lexists(target):
      continue
    want = job.stage_inputs(config, stage)
    for other, other_dir in done:
      src = os.path.join(other_dir, stage)
      if os.path.exists(os.path.join(src, "stage.json")) and job.stage_inputs(other, stage) == want:
        os.makedirs(arm_dir, exist_ok=True)
        os.symlink(os.path.realpath(src), target)
        break
    else:
      return  # later stages depend on this one: nothing after it can be shared


def _curve(rows: list[dict], key: str) -> list[list[float]]:
  return [[r["step"], r[key]] for r in rows if r.get(key) is not None]


def _arm_result(workdir: str, summary: dict[str, Any], k: int) -> dict[str, Any]:
  rows = stages.read_jsonl(os.path.join(workdir, "rl", "metrics.jsonl"))
  source = "toy_arith"
  return {"sft": summary["sft"], "rl": summary["rl"], "wall_s": summary["wall_s"],
          "teacher": summary.get("teacher", {}), "filter": summary.get("filter", {}),
          "curves": {"entropy": _curve(rows, "train/entropy"), "clip_frac_high": _curve(rows, "train/clip_frac_high"),
                     "clip_frac_low": _curve(rows, "train/clip_frac_low"),
                     "heldout_avg": _curve(rows, f"eval/{source}/avg@{k}"), "reward": _curve(rows, "reward/mean"),
                     "tool_calls": _curve(rows, "response/tool_calls_mean")}}


def _stat(values: list[float]) -> dict[str, float]:
  v = np.asarray([x for x in values if x is not None], np.float64)
  if not len(v):
    return {"mean": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
  return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max()), "n": int(len(v))}


def _cell(s: dict[str, float], spec: str = "{:.3f}") -> str:
  if not s["n"]:
    return "n/a"
  if s["n"] == 1:
    return spec.format(s["mean"])
  return f"{spec.format(s['mean'])} ({spec.format(s['min'])}-{spec.format(s['max'])})"


def table(results: dict[str, dict[int, dict]], seeds: list[int], k: int) -> str:
  """The comparison table in markdown: per finding, per arm, the mean over seeds (min-max)."""
  metrics = [("sft", f"avg@{k}", f"SFT avg@{k}", "{:.3f}"), ("rl", f"avg@{k}", f"RL avg@{k}", "{:.3f}"),
             ("rl", f"pass@{k}", f"RL pass@{k}", "{:.3f}"),
             ("rl", "tool_calls_per_response", "RL calls/resp", "{:.2f}"),
             ("rl", "tool_success_rate", "RL tool success", "{:.3f}"),
             ("rl", "response_len_mean", "RL resp. len", "{:.1f}")]
  lines = [f"Seeds: {', '.join(map(str, seeds))}; cells are means over seeds with (min-max).", ""]
  for finding, (title, arms) in FINDINGS.items():
    lines += [f"### ({finding}) {title}", "",
              "| arm | " + " | ".join(m[2] for m in metrics) + " | final entropy |",
              "|---|" + "---|" * (len(metrics) + 1)]
    for arm, label in arms:
      runs = [results[arm][s] for s in seeds if s in results.get(arm, {})]
      cells = [_cell(_stat([r[stage].get(key) for r in runs]), spec) for stage, key, _, spec in metrics]
      ent = _cell(_stat([r["curves"]["entropy"][-1][1] if r["curves"]["entropy"] else None for r in runs]))
      lines.append(f"| {label} | " + " | ".join(cells) + f" | {ent} |")
    lines.append("")
  return "\n".join(lines)


def plot(results: dict[str, dict[int, dict]], out_dir: str, k: int) -> list[str]:
  """Entropy and held-out accuracy against the RL step for the clipping arms, and the arms' final accuracy."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = []
  fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
  for arm, style in (("real", "-"), ("clip_sym", "--")):
    for seed, r in sorted(results.get(arm, {}).items()):
      label = f"{'clip 0.28' if arm == 'real' else 'clip 0.2'} s{seed}"
      for ax, key in zip(axes, ("entropy", "heldout_avg", "clip_frac_high")):
        pts = r["curves"][key]
        if pts:
          ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
  for ax, title in zip(axes, ("policy entropy", "held-out avg@k (curve subset)", "clip fraction (high)")):
    ax.set_title(title)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "clip_higher.png"), dpi=90)
  plt.close(fig)
  names.append("clip_higher.png")

  fig, ax = plt.subplots(figsize=(7, 3.8))
  arms = ["real", "stitched", "clip_sym", "frequent"]
  for j, (stage, label) in enumerate((("sft", "after SFT"), ("rl", "after RL"))):
    means = [np.mean([r[stage].get(f"avg@{k}") or 0 for r in results.get(a, {}).values()] or [0]) for a in arms]
    ax.bar(np.arange(len(arms)) + 0.38 * j, means, width=0.38, label=label)
  ax.set_xticks(np.arange(len(arms)) + 0.19, arms)
  ax.set_ylabel("held-out avg@k")
  ax.legend()
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "arms.png"), dpi=90)
  plt.close(fig)
  names.append("arms.png")
  return names


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every arm for every seed (resuming finished ones), then writes the table, JSON and plots."""
  console.setup_logging(os.path.join(workdir, "ablations.log"))
  cache_dir = os.path.join(workdir, "jax_cache")
  base = config.pipeline
  k = max(base.eval.ks)
  results: dict[str, dict[int, dict]] = {}
  for seed in config.seeds:
    done: list[tuple[ml_collections.ConfigDict, str]] = []
    for arm in config.arms:
      overrides = {key: value for key, value in config.arm_overrides[arm]}
      cfg = arm_config(base, overrides, seed, cache_dir)
      arm_dir = os.path.join(workdir, f"{arm}-s{seed}")
      _share_stages(cfg, arm_dir, done)
      console.say(f"\n=== ablations: arm {arm!r} seed {seed} ({overrides or 'baseline'}) -> {arm_dir}")
      summary = job.run(cfg, arm_dir)
      console.setup_logging(os.path.join(workdir, "ablations.log"))  # job.run pointed logging at the arm's log
      results.setdefault(arm, {})[seed] = _arm_result(arm_dir, summary, k)
      done.append((cfg, arm_dir))
  text = table(results, list(config.seeds), k)
  plots = plot(results, workdir, k)
  out = {"seeds": list(config.seeds), "arms": {a: {k_: v for k_, v in config.arm_overrides[a]} for a in config.arms},
         "results": {a: {str(s): r for s, r in v.items()} for a, v in results.items()}, "plots": plots}
  with open(os.path.join(workdir, "ablations.json"), "w") as f:
    json.dump(out, f, indent=1, default=float)
  with open(os.path.join(workdir, "ablations.md"), "w") as f:
    f.write("# Findings in miniature\n\n" + text + "\n" + "".join(f"![{p}]({p})\n" for p in plots))
  console.say("\n" + text)
  return out
