"""Fresh problems for any policy: a newly drawn set of the embedded arithmetic family, none of whose problems
(by canonical form) any given run has seen, evaluated exactly as the main job's evaluation stages do, with the
same before/after table and 95% bootstrap intervals (`configs/eval_embedded.py`):

    python -m agentrl_jax.main --config=configs/eval_embedded.py --workdir=runs/fresh \
        --config.run=runs/local_demo --config.seed=1234 --config.problems=1024

evaluates the run's SFT and RL checkpoints (`before`, `after`: any checkpoint directory of ours or HF
directory instead) on `problems` problems drawn with `seed` and `level_weights`, leaving out every problem of
the run's data splits (held-out, SFT, RL pool) and of the runs or split files in `exclude`. Outputs in the
workdir: `fresh.parquet` (the problems), one evaluation directory per policy (rollouts, greedy answers),
`fresh_eval.json` (values, intervals, paired changes, by level) and `fresh_eval.md` (the printed table).
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any

import ml_collections

from agentrl_jax import compile_stats
from agentrl_jax.pipeline import changes as changes_lib
from agentrl_jax.pipeline import console, stages
from agentrl_jax.tasks import arithmetic

log = logging.getLogger(__name__)


def excluded_keys(sources: list[str]) -> tuple[set[str], dict[str, int]]:
  """Canonical forms of every problem in `sources` (run directories: all their `data/*.parquet` splits; or split
  files), and how many problems each file held.

  Raises:
    ValueError: a source that is neither a run directory with splits nor a parquet file.
  """
  keys, counts = set(), {}
  for source in sources:
    files = sorted(glob.glob(os.path.join(source, "data", "*.parquet"))) if os.path.isdir(source) else [source]
    if not files or not all(f.endswith(".parquet") and os.path.isfile(f) for f in files):
      raise ValueError(f"eval_embedded: {source!r} is neither a run directory with data/*.parquet nor a parquet "
                       "file of the arithmetic family")
    for path in files:
      problems = arithmetic.read_rl_parquet(path)
      keys.update(p.key for p in problems)
      counts[path] = len(problems)
  return keys, counts


def policy_model(config: ml_collections.ConfigDict, path: str) -> ml_collections.ConfigDict:
  """The `model` block of a policy directory: a HF directory (`config.json` + safetensors, its own tokenizer)
  or one of our checkpoint directories (the embedded tokenizer unless `model.tokenizer_path` says otherwise)."""
  if not os.path.isdir(path):
    raise ValueError(f"eval_embedded: policy directory {path!r} does not exist")
  if os.path.exists(os.path.join(path, "config.json")) and glob.glob(os.path.join(path, "*.safetensors")):
    block = stages.model_block(config)
    block.update(hf_path=path, checkpoint="")
    return block
  return stages.checkpoint_model(config, path)


def _policies(config: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  run = config.run
  before = config.before or (os.path.join(run, "sft", "checkpoints") if run else "")
  after = config.after or (os.path.join(run, "rl", "checkpoints") if run else "")
  out = [(label, path) for label, path in ((config.before_label, before), (config.after_label, after)) if path]
  if not out:
    raise ValueError("eval_embedded: nothing to evaluate; set config.run, or config.before / config.after")
  return out


def value_table(values: dict[str, dict[str, Any]], k: int, name: str) -> str:
  """Markdown rows `| metric | value | 95% CI |` of one policy (`changes.values`)."""
  lines = [f"| {'metric':<26} | {name:>8} | {'95% CI':>18} |", f"|{'-' * 28}|{'-' * 10}|{'-' * 20}|"]
  for metric, v in values.items():
    spec = changes_lib.SPECS.get(metric, "{:.3f}")
    ci = v["ci95"]
    fmt = (lambda x: "n/a" if x is None else spec.format(x))  # noqa: E731
    lines.append(f"| {changes_lib.label(metric, k):<26} | {fmt(v['value']):>8} | "
                 f"{'n/a' if not ci else f'[{fmt(ci[0])}, {fmt(ci[1])}]':>18} |")
  return "\n".join(lines)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Draws the fresh set, evaluates every policy on it, prints and writes the table; returns the results."""
  # ---------------------------------------------------------------------------------------------- console & caches
  console.setup_logging(os.path.join(workdir, "eval_embedded.log"))
  compile_stats.enable_compilation_cache(config.compile_cache_dir or os.path.join(workdir, "jax_cache"))
  policies = _policies(config)
  sources = [config.run] if config.run else []
  sources += [s.strip() for s in config.exclude.split(",") if s.strip()]

  # ---------------------------------------------------------------------------------------------- fresh problems
  exclude, counts = excluded_keys(sources)
  weights = stages.level_weights(config.level_weights)
  problems = arithmetic.make_fresh(config.problems, level_weights=weights, seed=config.seed, exclude=exclude)
  assert not {p.key for p in problems} & exclude  # make_fresh's contract, checked where it matters
  path = arithmetic.write_rl_parquet(os.path.join(workdir, "fresh.parquet"), problems)
  console.say(f"eval_embedded: {len(problems)} fresh problems (seed {config.seed}, levels "
              f"{arithmetic.level_counts(problems)}), none of the {len(exclude)} distinct problems of "
              f"{', '.join(sources) or 'no run'} in any rendering")

  # ---------------------------------------------------------------------------------------------- evaluate
  k = max(config.eval.ks)
  tables = {}
  for label, policy in policies:
    out_dir = os.path.join(workdir, label.lower())
    os.makedirs(out_dir, exist_ok=True)
    console.say(f"eval_embedded: {label}: {policy}")
    stages.evaluate_policy(config, workdir, out_dir, path, policy_model(config, policy))
    tables[label] = changes_lib.policy_table(out_dir, k)

  # ---------------------------------------------------------------------------------------------- report
  levels = {(arithmetic.DATA_SOURCE, i): p.level for i, p in enumerate(problems)}
  result: dict[str, Any] = {
      "seed": config.seed, "problems": len(problems), "levels": arithmetic.level_counts(problems),
      "excluded": {"sources": sources, "files": counts, "distinct_problems": len(exclude)},
      "policies": dict(policies), "k": k, "eval_temperature": config.eval.temperature,
      "values": {label: changes_lib.values(t, k) for label, t in tables.items()},
  }
  head = (f"fresh problems: {len(problems)} x {k} samples (T={config.eval.temperature}) + one greedy answer each; "
          "95% CI: bootstrap over problems (paired for the change)")
  if len(tables) == 2:
    (b, before), (a, after) = tables.items()
    result["changes"] = changes_lib.changes(before, after, k)
    result["by_level"] = changes_lib.by_level(before, after, levels, f"avg@{k}")
    text = "\n\n".join([head, changes_lib.change_table(result["changes"], k, before=b, after=a),
                        changes_lib.level_table(result["by_level"], f"avg@{k}", before=b, after=a)])
  else:
    (label, values), = result["values"].items()
    text = "\n\n".join([head, value_table(values, k, label)])
  with open(os.path.join(workdir, "fresh_eval.json"), "w") as f:
    json.dump(result, f, indent=2, sort_keys=True, default=float)
  with open(os.path.join(workdir, "fresh_eval.md"), "w") as f:
    f.write(text + "\n")
  console.say(text)
  return result
