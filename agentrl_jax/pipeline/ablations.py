"""The paper's three findings in miniature: arms of the main job that differ in one choice, run with several
seeds, compared in one table (`bash launch/ablations.sh`; `configs/ablations.py`).

    (a) SFT data     real end-to-end teacher trajectories vs the stitched synthetic baseline, then the same RL
    (b) clipping     clip-higher (0.2 / 0.28) vs symmetric (0.2 / 0.2): entropy and held-out accuracy per step
    (c) tool use     the deliberative teacher (one call where the tool is needed) vs the frequent one (a call
                     for every problem and every operation): calls per response, tool success rate, accuracy
    (lora)           RL with LoRA adapters on the full SFT checkpoint vs full-parameter RL (not a finding of the
                     paper: what the adapters that fit large models on small chips give up)

Every arm is the pipeline job itself (`pipeline.job.run`) in `<workdir>/<arm>-s<seed>/`. Arms of one seed share
the stages whose inputs are identical (the clipping arm reuses the baseline's data, teacher, SFT, evaluation
and filter stages through symlinks; every arm shares the data stage), also with arms an earlier invocation
finished in the same workdir, and all arms share one compilation cache. Outputs in the workdir: `ablations.md`,
`ablations.json` and the comparison plots, over every arm finished there for the configured seeds.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Any

import ml_collections
import numpy as np

from agentrl_jax.pipeline import changes as changes_lib
from agentrl_jax.pipeline import console, job, stages

log = logging.getLogger(__name__)

# finding -> (title, [(arm, label)]); the first arm of each finding is the baseline.
FINDINGS = {
    "a": ("SFT on real end-to-end trajectories vs stitched synthetic ones (then the same RL)",
          [("real", "real trajectories"), ("stitched", "stitched")]),
    "b": ("clip-higher vs symmetric clipping", [("real", "clip 0.2 / 0.28"), ("clip_sym", "clip 0.2 / 0.2")]),
    "c": ("deliberative vs frequent tool use", [("real", "deliberative teacher"), ("frequent", "frequent teacher")]),
    "b-scaled": ("clip-higher vs symmetric clipping, bounds scaled to the miniature",
                 [("clip_hi_scaled", "clip 0.05 / 0.07"), ("clip_sym_scaled", "clip 0.05 / 0.05")]),
    "b-ep4": ("clip-higher vs symmetric clipping, 4 epochs over each rollout batch",
              [("clip_hi_ep4", "clip 0.2 / 0.28, 4 epochs"), ("clip_sym_ep4", "clip 0.2 / 0.2, 4 epochs")]),
    "lora": ("RL with LoRA adapters on the full SFT checkpoint vs full-parameter RL",
             [("real", "full RL"), ("lora", "LoRA RL")]),
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
  return {"sft": summary["sft"], "rl": summary["rl"], "delta": summary.get("delta", {}), "wall_s": summary["wall_s"],
          "rl_wall_s": summary.get("stages", {}).get("rl", {}).get("wall_s"),
          "teacher": summary.get("teacher", {}), "filter": summary.get("filter", {}),
          "curves": {"entropy": _curve(rows, "train/entropy"), "clip_frac_high": _curve(rows, "train/clip_frac_high"),
                     "clip_frac_low": _curve(rows, "train/clip_frac_low"),
                     "clip_high_reachable": _curve(rows, "train/clip_high_reachable"),
                     "heldout_avg": _curve(rows, f"eval/{source}/avg@{k}"), "reward": _curve(rows, "reward/mean"),
                     "tool_calls": _curve(rows, "response/tool_calls_mean")}}


def versus(workdir: str, seeds: list[int], k: int) -> dict[str, dict[str, dict]]:
  """For each finding and seed, the paired change of held-out avg@k after RL from the baseline arm to the other
  (`pipeline.changes`): `{finding: {seed: {"before": baseline, "after": other, "change", "ci95", ...}}}`; arms
  that did not run are left out."""
  out: dict[str, dict[str, dict]] = {}
  for finding, (_, pair) in FINDINGS.items():
    (base, _), (other, _) = pair
    for seed in seeds:
      dirs = [os.path.join(workdir, f"{arm}-s{seed}", "eval_rl") for arm in (base, other)]
      if all(os.path.exists(os.path.join(d, changes_lib.ROLLOUTS)) for d in dirs):
        before, after = (changes_lib.policy_table(d, k) for d in dirs)
        out.setdefault(finding, {})[str(seed)] = changes_lib.changes(before, after, k)[f"avg@{k}"]
  return out


def _num(value, spec: str = "{:.3f}", signed: bool = False) -> str:
  if value is None:
    return "n/a"
  return ("+" if signed and value >= 0 else "") + spec.format(value)


def _ci(c: dict | None) -> str:
  if not c or c.get("change") is None:
    return "n/a"
  ci = c.get("ci95")
  interval = "" if not ci else f" [{_num(ci[0], signed=True)}, {_num(ci[1], signed=True)}]"
  return _num(c["change"], signed=True) + interval


def _mean_of(points: list[list[float]]) -> float | None:
  return float(np.mean([p[1] for p in points])) if points else None


def verdict(pairs: dict[str, dict], seeds: list[int]) -> str:
  """How many seeds' paired intervals put the baseline arm ahead, behind, or cannot tell."""
  ahead = [s for s in seeds if (pairs.get(str(s)) or {}).get("ci95") and pairs[str(s)]["ci95"][1] < 0]
  behind = [s for s in seeds if (pairs.get(str(s)) or {}).get("ci95") and pairs[str(s)]["ci95"][0] > 0]
  unclear = [s for s in seeds if s not in ahead and s not in behind]
  names = lambda xs: ", ".join(map(str, xs)) or "none"  # noqa: E731
  return (f"baseline arm ahead (95% CI of the difference below 0) on {len(ahead)} of {len(seeds)} seeds "
          f"({names(ahead)}); behind on {len(behind)} ({names(behind)}); not separated on {len(unclear)} "
          f"({names(unclear)})")


def table(results: dict[str, dict[int, dict]], seeds: list[int], k: int,
          pairs: dict[str, dict[str, dict]] | None = None) -> str:
  """The comparison in markdown: per finding, one row per arm and seed with the held-out RL - SFT change and its
  paired 95% interval, the arm's difference to the baseline arm after RL (paired over the same held-out
  problems), tool use, entropy, how often the upper clip bound bound and on how many tokens it could have (A > 0
  and old probability below 1 / (1 + clip_high)); then the verdict over seeds."""
  pairs = pairs or {}
  lines = [f"Seeds: {', '.join(map(str, seeds))}. Intervals: paired 95% bootstrap over the held-out problems.", ""]
  for finding, (title, arms) in FINDINGS.items():
    if not any(results.get(arm) for arm, _ in arms):
      continue
    base_label = arms[0][1]
    lines += [f"### ({finding}) {title}", "",
              f"| arm | seed | SFT avg@{k} | RL avg@{k} | RL - SFT [95% CI] | RL vs {base_label} [95% CI] | "
              "calls/resp | tool success | resp. len | entropy (last) | upper clip binds (mean frac.) | "
              "upper clip reachable (mean frac.) | RL stage s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for j, (arm, label) in enumerate(arms):
      for seed in seeds:
        r = results.get(arm, {}).get(seed)
        if r is None:
          continue
        vs = "(baseline)" if j == 0 else _ci(pairs.get(finding, {}).get(str(seed)))
        ent = r["curves"]["entropy"][-1][1] if r["curves"]["entropy"] else None
        clip = _mean_of(r["curves"]["clip_frac_high"])
        reach = _mean_of(r["curves"].get("clip_high_reachable", []))
        lines.append(f"| {label} | {seed} | {_num(r['sft'].get(f'avg@{k}'))} | {_num(r['rl'].get(f'avg@{k}'))} | "
                     f"{_ci(r.get('delta', {}).get(f'avg@{k}'))} | {vs} | "
                     f"{_num(r['rl'].get('tool_calls_per_response'), '{:.2f}')} | "
                     f"{_num(r['rl'].get('tool_success_rate'))} | {_num(r['rl'].get('response_len_mean'), '{:.1f}')} | "
                     f"{_num(ent)} | {_num(clip, '{:.2e}')} | {_num(reach, '{:.2e}')} | "
                     f"{_num(r.get('rl_wall_s'), '{:.0f}')} |")
    lines += ["", f"({finding}) after RL, {verdict(pairs.get(finding, {}), seeds)}.", ""]
  return "\n".join(lines)


def plot(results: dict[str, dict[int, dict]], out_dir: str, k: int) -> list[str]:
  """Entropy, held-out accuracy and the upper clip bound's binding fraction against the RL step for the
  clipping arms, and every arm's held-out avg@k after SFT and RL per seed."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = []
  fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
  # Line style: the bounds; markers: the 4-pass arms (same bounds as the main job's two-pass ones).
  styles = {"real": ("-", "0.2/0.28"), "clip_sym": ("--", "0.2/0.2"), "clip_hi_scaled": ("-.", "0.05/0.07"),
            "clip_sym_scaled": (":", "0.05/0.05"), "clip_hi_ep4": ("^-", "0.2/0.28 ep4"),
            "clip_sym_ep4": ("v--", "0.2/0.2 ep4")}
  for arm, (style, bounds) in styles.items():
    for seed, r in sorted(results.get(arm, {}).items()):
      label = f"clip {bounds} s{seed}"
      for ax, key in zip(axes, ("entropy", "heldout_avg", "clip_frac_high")):
        pts = r["curves"][key]
        if pts:
          ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=f"C{seed}", label=label, markersize=4,
                  markevery=max(1, len(pts) // 8))
  titles = ("policy entropy", "held-out avg@k (curve subset)", "upper clip bound binds (token frac.)")
  for ax, title in zip(axes, titles):
    ax.set_title(title)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "clip_higher.png"), dpi=90)
  plt.close(fig)
  names.append("clip_higher.png")

  fig, ax = plt.subplots(figsize=(8, 3.8))
  arms = [a for a in ("real", "stitched", "clip_sym", "frequent", "clip_hi_scaled", "clip_sym_scaled", "clip_hi_ep4",
                      "clip_sym_ep4") if a in results]
  seeds = sorted({s for a in arms for s in results[a]})
  width = 0.8 / max(2 * len(seeds), 1)
  for i, seed in enumerate(seeds):
    for j, stage in enumerate(("sft", "rl")):
      vals = [results[a].get(seed, {}).get(stage, {}).get(f"avg@{k}") or 0 for a in arms]
      ax.bar(np.arange(len(arms)) + width * (2 * i + j), vals, width=width, color=f"C{i}", alpha=0.45 + 0.45 * j,
             label=f"s{seed} {'RL' if j else 'SFT'}")
  ax.set_xticks(np.arange(len(arms)) + 0.4 - width / 2, arms)
  ax.set_ylabel("held-out avg@k")
  ax.legend(fontsize=7, ncol=max(len(seeds), 1))
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "arms.png"), dpi=90)
  plt.close(fig)
  names.append("arms.png")
  return names


def _run_seed(config: ml_collections.ConfigDict, workdir: str, seed: int) -> None:
  """Every configured arm of one seed, in order (later arms reuse the stages of earlier ones)."""
  cache_dir = os.path.join(workdir, "jax_cache")
  arms = dict(config.arm_overrides)

  def arm_cfg(arm):
    overrides = {key: value for key, value in [*config.common_overrides, *arms[arm]]}
    return arm_config(config.pipeline, overrides, seed, cache_dir), overrides

  # Arms finished earlier in this workdir (another invocation) share their stages too.
  done = [(arm_cfg(a)[0], os.path.join(workdir, f"{a}-s{seed}")) for a in arms
          if a not in config.arms and os.path.isdir(os.path.join(workdir, f"{a}-s{seed}"))]
  for arm in config.arms:
    cfg, overrides = arm_cfg(arm)
    arm_dir = os.path.join(workdir, f"{arm}-s{seed}")
    _share_stages(cfg, arm_dir, done)
    console.say(f"\n=== ablations: arm {arm!r} seed {seed} ({overrides or 'baseline'}) -> {arm_dir}")
    job.run(cfg, arm_dir)
    console.setup_logging(os.path.join(workdir, "ablations.log"))  # job.run pointed logging at the arm's log
    done.append((cfg, arm_dir))


_PROGRESS = re.compile(r"^(\[\d+/\d+\] |=== |      \S)")  # a seed's stage heads, stage results and arm heads


class _ConsoleFollower:
  """The stage lines of a seed's console file as they appear (progress bars left out), for the user's console."""

  def __init__(self, path: str):
    self.path, self.offset, self.partial = path, os.path.getsize(path) if os.path.exists(path) else 0, ""

  def new_lines(self) -> list[str]:
    with open(self.path, "rb") as f:
      f.seek(self.offset)
      data = f.read()
    self.offset += len(data)
    *lines, self.partial = (self.partial + data.decode("utf-8", "replace")).split("\n")
    shown = [line.rsplit("\r", 1)[-1] for line in lines]  # what a terminal shows: the text after the last \r
    return [line.rstrip() for line in shown if _PROGRESS.match(line)]


def _run_seeds_in_processes(config: ml_collections.ConfigDict, workdir: str) -> None:
  """One process per seed, `config.processes` at a time. Seeds share no stage, and one pipeline process keeps
  1.65 of the 2 cores of the CI machine busy on average (its sandboxes, tokenizer and Python loop leave gaps;
  three keep 1.92 busy), so running seeds side by side finishes sooner. Each seed's console goes to
  `<workdir>/seed<N>.console.txt`; its stage lines are echoed here, prefixed with the seed."""
  import pickle
  import subprocess
  import sys

  path = os.path.join(workdir, "ablations_config.pkl")
  with open(path, "wb") as f:
    pickle.dump(config, f)
  pending, running, failed = list(config.seeds), {}, []
  while pending or running:
    while pending and len(running) < config.processes:
      seed = pending.pop(0)
      out = os.path.join(workdir, f"seed{seed}.console.txt")
      follower = _ConsoleFollower(out)
      with open(out, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "agentrl_jax.pipeline.ablations", path, workdir, str(seed)],
                                stdout=f, stderr=subprocess.STDOUT)
      running[seed] = (proc, out, time.perf_counter(), follower)
      console.say(f"=== ablations: seed {seed} running in process {proc.pid} (console: {out})")
    time.sleep(2.0)
    for seed, (proc, out, t0, follower) in list(running.items()):
      for line in follower.new_lines():
        console.say(f"s{seed} | {line.strip()}")
      if proc.poll() is None:
        continue
      del running[seed]
      if proc.returncode:
        failed.append(seed)
        console.say(f"=== ablations: seed {seed} FAILED (exit {proc.returncode}) after {time.perf_counter() - t0:.0f} "
                    f"s; see {out}")
      else:
        console.say(f"=== ablations: seed {seed} finished in {time.perf_counter() - t0:.0f} s")
  if failed:
    raise RuntimeError(f"ablations: seeds {sorted(failed)} failed (their consoles: seed<N>.console.txt in {workdir}); "
                       "finished arms are kept and a rerun resumes the rest")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every arm for every seed (resuming finished ones), then writes the table, JSON and plots."""
  t0 = time.perf_counter()
  console.setup_logging(os.path.join(workdir, "ablations.log"))
  base = config.pipeline
  k = max(base.eval.ks)
  arms = dict(config.arm_overrides)
  if config.processes > 1 and len(config.seeds) > 1:
    _run_seeds_in_processes(config, workdir)
  else:
    for seed in config.seeds:
      _run_seed(config, workdir, seed)
  # The table covers every arm finished in this workdir for these seeds, whichever invocation ran it.
  results: dict[str, dict[int, dict]] = {}
  for arm in arms:
    for seed in config.seeds:
      path = os.path.join(workdir, f"{arm}-s{seed}", "summary.json")
      if os.path.exists(path):
        with open(path) as f:
          results.setdefault(arm, {})[seed] = _arm_result(os.path.dirname(path), json.load(f), k)
  seeds = list(config.seeds)
  pairs = versus(workdir, seeds, k)
  text = table(results, seeds, k, pairs)
  plots = plot(results, workdir, k)
  out = {"seeds": seeds, "arms": {a: {k_: v for k_, v in arms[a]} for a in results},
         "results": {a: {str(s): r for s, r in v.items()} for a, v in results.items()}, "versus_baseline": pairs,
         "wall_s": time.perf_counter() - t0, "plots": plots}
  with open(os.path.join(workdir, "ablations.json"), "w") as f:
    json.dump(out, f, indent=1, default=float)
  with open(os.path.join(workdir, "ablations.md"), "w") as f:
    f.write("# Findings in miniature\n\n" + text + "\n" + "".join(f"![{p}]({p})\n" for p in plots))
  console.say("\n" + text + f"\nablations: {time.perf_counter() - t0:.0f} s in this process")
  return out


def _seed_process(argv: list[str]) -> None:
  """`python -m agentrl_jax.pipeline.ablations CONFIG_PICKLE WORKDIR SEED`: one seed's arms (the process
  `_run_seeds_in_processes` starts), with the backend and logging set up as `agentrl_jax.main` does."""
  import pickle

  import jax

  with open(argv[1], "rb") as f:
    config = pickle.load(f)
  if config.pipeline.get("jax_platforms") and not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", config.pipeline.jax_platforms)
  logging.getLogger().setLevel(logging.INFO)
  console.setup_logging(os.path.join(argv[2], "ablations.log"))
  _run_seed(config, argv[2], int(argv[3]))


if __name__ == "__main__":
  import sys

  _seed_process(sys.argv)
