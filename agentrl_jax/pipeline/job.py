"""The recipe pipeline job: `python -m agentrl_jax.main --config=configs/default.py --workdir=runs/local_demo`.

Runs the stages of `pipeline.stages` in order, each in `<workdir>/<stage>/`, then writes the report
(`summary.json`, `report.md`, plots) and prints the before/after table. A stage that finished writes
`<stage>/stage.json` (its result, wall and compile seconds, and the config it ran with); a rerun with the same
command skips finished stages and resumes the interrupted one from its checkpoint (the SFT and RL trainers
resume exactly; the evaluation, filter, data and teacher stages are deterministic and simply run again). A
rerun with a config that changes what a finished stage computed is refused with the differing fields, instead
of mixing results of two configs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import ml_collections

from agentrl_jax import compile_stats
from agentrl_jax.pipeline import console, report, stages

log = logging.getLogger(__name__)

# The config blocks each stage reads (what its result depends on), besides the stages before it.
_INPUTS = {
    "data": ("seed", "task", "data_dir"),
    "teacher": ("teacher", "tools", "rollout.max_tool_output_chars", "rollout.advertise_tools"),
    "sft": ("model", "tokenizer", "mesh", "sft", "sft_optimizer"),
    "eval_sft": ("eval", "rollout", "tools", "reward", "prompt_style"),
    "filter": ("filter", "rollout", "tools", "reward", "prompt_style"),
    "rl": ("rl", "optimizer", "lora", "eval", "rollout", "tools", "reward", "prompt_style"),
    "eval_rl": ("eval",),
}
# Blocks recorded only when they differ from these values (LoRA off): a run made before the block existed
# compares equal to one of today's that leaves it off.
_DEFAULTS = {"lora": {"rank": 0}}
# Fields added to a block after runs were recorded, left out when at the value that means what those runs did
# (no context parallelism; attention's default strategy and a cache in the compute dtype), so a stage recorded
# before they existed still matches.
_ADDED = {"mesh": {"context": (1,)}, "model": {"context_strategy": ("", "all_gather"), "kv_cache_dtype": ("",)}}
_DEPENDS = {"data": (), "teacher": ("data",), "sft": ("teacher",), "eval_sft": ("sft",), "filter": ("sft",),
            "rl": ("filter",), "eval_rl": ("rl",)}
_TITLES = {
    "data": "build the task's splits as TFDS datasets",
    "teacher": "teacher trajectories through the real sandbox",
    "sft": "multi-turn SFT on the trajectories",
    "eval_sft": "evaluate the SFT policy on the held-out split",
    "filter": "model-aware prompt filter (pass-rate band under the SFT policy)",
    "rl": "GRPO-TCR with the code tool",
    "eval_rl": "evaluate the RL policy on the held-out split",
}


def _get(config: ml_collections.ConfigDict, dotted: str) -> Any:
  node: Any = config
  for part in dotted.split("."):
    node = node[part]
  return node.to_dict() if isinstance(node, ml_collections.ConfigDict) else node


def stage_inputs(config: ml_collections.ConfigDict, stage: str) -> dict[str, Any]:
  """Everything a stage's result depends on: its own config fields and those of the stages it builds on."""
  out: dict[str, Any] = {}
  for dep in _DEPENDS[stage]:
    out.update(stage_inputs(config, dep))
  for k in _INPUTS[stage]:
    if k in _DEFAULTS:
      value = _get(config, k) if k in config else None
      if value is None or all(value.get(f) == v for f, v in _DEFAULTS[k].items()):
        continue
    out[k] = _get(config, k)
    if isinstance(out[k], dict) and k in _ADDED:
      out[k] = {f: v for f, v in out[k].items() if f not in _ADDED[k] or v not in _ADDED[k][f]}
  return json.loads(json.dumps(out, sort_keys=True, default=str))


def _check_same(stage: str, path: str, want: dict[str, Any]) -> None:
  with open(path) as f:
    got = json.load(f)
  got = got.get("inputs", got)
  if got != want:
    diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    raise ValueError(f"pipeline: stage {stage!r} in {os.path.dirname(path)} ran with a different config (differs "
                     f"in {', '.join(diff)}); use a new --workdir, or delete that stage's directory and the ones "
                     "after it")


_ran_before = False  # a second run in one process (the ablations) does not count the process's start-up


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs (or resumes) every stage and writes the report; returns the summary."""
  global _ran_before
  t_entry = time.perf_counter()
  startup = 0.0 if _ran_before else console.process_elapsed_s()  # interpreter start-up and imports
  _ran_before = True
  # ---------------------------------------------------------------------------------------------- console & caches
  console.setup_logging(os.path.join(workdir, "pipeline.log"))
  compile_stats.enable_compilation_cache(config.compile_cache_dir or os.path.join(workdir, "jax_cache"))
  console.say(f"pipeline: {config.name} in {workdir} (log: {os.path.join(workdir, 'pipeline.log')})")
  order = [s for s in stages.ORDER if s in config.stages]
  results: dict[str, Any] = {}
  timings: dict[str, dict[str, Any]] = {}
  reused_wall = 0.0

  # ---------------------------------------------------------------------------------------------- stages
  for i, stage in enumerate(order):
    out_dir = stages.stage_dir(workdir, stage)
    marker, started = os.path.join(out_dir, "stage.json"), os.path.join(out_dir, "stage_config.json")
    inputs = stage_inputs(config, stage)
    head = f"[{i + 1}/{len(order)}] {stage}: {_TITLES[stage]}"
    if os.path.exists(marker):
      _check_same(stage, marker, inputs)
      with open(marker) as f:
        done = json.load(f)
      results[stage], timings[stage] = done["result"], dict(done["timing"], reused=True)
      reused_wall += done["timing"]["wall_s"]
      console.say(f"{head}: done earlier, reused ({done['timing']['wall_s']:.1f}s then)")
      continue
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(started):  # interrupted earlier: resume only under the same config
      _check_same(stage, started, inputs)
      console.say(f"{head} (resuming)")
    else:
      with open(started, "w") as f:
        json.dump({"inputs": inputs}, f, indent=1, sort_keys=True)
      console.say(head)
    with compile_stats.measured() as m:
      results[stage] = stages.RUNNERS[stage](config, workdir, results)
    c = m["compile"]
    timings[stage] = {"wall_s": m["wall_s"], "compile_s": c.compile_s, "compiled_programs": c.programs,
                      "cache_hits": c.cache_hits, "reused": False}
    with open(marker + ".tmp", "w") as f:
      json.dump({"inputs": inputs, "result": results[stage], "timing": timings[stage]}, f, indent=1,
                sort_keys=True, default=float)
    os.replace(marker + ".tmp", marker)
    console.say(f"      {report.stage_line(stage, results[stage])}  [{m['wall_s']:.1f}s, compile {c.compile_s:.1f}s "
                f"for {c.programs} programs, {c.cache_hits} from cache]")

  # ---------------------------------------------------------------------------------------------- report
  summary = report.write(config, workdir, results, timings, wall_s=lambda: startup + time.perf_counter() - t_entry + reused_wall)
  console.say(report.table(summary))
  return summary
