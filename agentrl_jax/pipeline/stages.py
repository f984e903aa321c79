"""The stages of the recipe pipeline, each a call of the project's own job code on a config built from the
pipeline config's blocks (`configs/default.py`).

    data      the embedded task as disjoint splits (held-out / SFT / RL pool), each built as a TFDS dataset
    teacher   real end-to-end tool-use trajectories: the scripted teacher's code RUN in the real sandbox
              (`teacher.source = "stitched"`: the synthetic stitched baseline, `data/stitched.py`, instead)
    sft       `sft.trainer.run` on those trajectories (random init)
    eval_sft  `evaluation.runner.run` of the SFT policy on the held-out split
    filter    `rl.filter_prompts.run`: the RL pool's pass rates under the SFT policy, kept inside a band
    rl        `rl.trainer.run`: GRPO-TCR from the SFT checkpoint on the filtered prompts, with held-out curves
    eval_rl   `evaluation.runner.run` of the RL policy on the held-out split

A stage function takes the pipeline config, the run's workdir and the results of earlier stages, and returns a
JSON-able result (paths and numbers later stages and the report read).
"""

from __future__ import annotations

import json
import logging
import os
import random
from typing import Any

import ml_collections

from agentrl_jax import metrics_writer
from agentrl_jax.tasks import arithmetic

log = logging.getLogger(__name__)

ORDER = ("data", "teacher", "sft", "eval_sft", "filter", "rl", "eval_rl")
HELDOUT = "heldout"
# Held-out metrics the report shows, and the evaluation runner's names for them (per data source).
REPORT_KEYS = {"avg@{k}": "avg@{k}", "pass@{k}": "pass@{k}", "maj@{k}": "maj@{k}",
               "tool_calls_per_response": "tool_calls_mean", "tool_success_rate": "tool_success_rate",
               "response_len_mean": "response_tokens_mean"}


def stage_dir(workdir: str, stage: str) -> str:
  return os.path.join(workdir, stage)


def model_block(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The policy's `model` block with the tokenizer `config.tokenizer` names: "embedded" (the task's own BPE,
  `tasks.tokenizer`), or "qwen2.5" / "qwen3" (the real Qwen vocabulary, `models.qwen_tokenizer`);
  `model.tokenizer_path` wins when set."""
  block = ml_collections.ConfigDict(config.model.to_dict())
  if not block.tokenizer_path and config.tokenizer != "embedded":
    from agentrl_jax.models import qwen_tokenizer

    block.tokenizer_path = qwen_tokenizer.cached_dir(config.tokenizer)
  return block


def _shared(config: ml_collections.ConfigDict, workdir: str, job: str) -> ml_collections.ConfigDict:
  """The blocks every sampling or training job reads, copied from the pipeline config."""
  out = ml_collections.ConfigDict()
  out.job = job
  out.seed = config.seed
  out.model = model_block(config)
  for block in ("mesh", "rollout", "tools", "reward", "prompt_style"):
    out[block] = ml_collections.ConfigDict(config[block].to_dict())
  out.data = ml_collections.ConfigDict(dict(train_path="", train_schema="rl", data_dir=data_dir(config, workdir),
                                            skip_malformed=True, shuffle=True, toy_task="", toy_problems=0,
                                            toy_levels=[]))
  return out


def level_weights(pairs) -> dict[int, float]:
  """`{level: weight}` from a config's `[[level, weight], ...]`."""
  return {int(level): float(w) for level, w in pairs}


def data_dir(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Where every stage's TFDS datasets live (built once by the data stage, reused by the jobs)."""
  return config.data_dir or os.path.join(workdir, "tfds")


# ---------------------------------------------------------------------------------------------------- data
def run_data(config: ml_collections.ConfigDict, workdir: str, results: dict) -> dict[str, Any]:
  """Writes the task's splits (disjoint by canonical form, drawn with the job's seed) in the recipe's RL parquet
  schema and builds each as a TFDS dataset."""
  del results
  from agentrl_jax import data

  task = config.task
  sizes = {HELDOUT: task.heldout_problems, "sft": task.sft_problems, "rl": task.rl_problems}
  splits = arithmetic.make_splits(sizes, level_weights=level_weights(task.level_weights), seed=config.seed)
  out_dir = stage_dir(workdir, "data")
  out: dict[str, Any] = {"splits": {}}
  bar = metrics_writer.progress_bar(len(splits), desc="data")
  for name, problems in splits.items():
    path = os.path.join(out_dir, f"{name}.parquet")
    arithmetic.write_rl_parquet(path, problems)
    prepared = data.prepare(data.SourceConfig(path=path, schema="rl", data_dir=data_dir(config, workdir)))
    levels = {str(lv): n for lv, n in arithmetic.level_counts(problems).items()}
    out["splits"][name] = {"path": path, "problems": prepared.num_examples, "levels": levels}
    bar.update(1)
  bar.close()
  # The held-out subset the RL trainer evaluates periodically (its accuracy curve); the final evaluations use
  # the whole held-out split.
  curve = splits[HELDOUT][:task.curve_problems]
  curve_path = os.path.join(out_dir, "heldout_curve.parquet")
  arithmetic.write_rl_parquet(curve_path, curve)
  out["splits"]["heldout_curve"] = {"path": curve_path, "problems": len(curve)}
  return out


# ---------------------------------------------------------------------------------------------------- teacher
def run_teacher(config: ml_collections.ConfigDict, workdir: str, results: dict) -> dict[str, Any]:
  """SFT conversations for the SFT split: real teacher trajectories or the stitched baseline."""
  from agentrl_jax import tools
  from agentrl_jax.rollout import engine as engine_lib
  from agentrl_jax.tasks import teacher

  t = config.teacher
  out_dir = stage_dir(workdir, "teacher")
  problems = arithmetic.read_rl_parquet(results["data"]["splits"]["sft"]["path"])
  if t.source == "stitched":
    return _stitched(config, workdir, problems, out_dir)
  if t.source != "real":
    raise ValueError(f"config.teacher.source must be 'real' or 'stitched', got {t.source!r}")
  bar = metrics_writer.progress_bar(len(problems), desc="teacher")
  convs, failed = [], 0
  rng = random.Random(config.seed)
  with tools.make_executor(engine_lib.tool_config(config.tools)) as executor:
    for p in problems:
      c = teacher.conversation(p, executor, rng, p_direct=t.p_direct, p_mistake=t.p_mistake, style=t.style)
      if c is None:
        failed += 1
      else:
        convs.append(c)
      bar.update(1)
  bar.close()
  if not config.rollout.advertise_tools:  # SFT sees the prompts exactly as the rollouts render them
    for c in convs:
      c["tools"] = []
  path = teacher.write_sft_parquet(os.path.join(out_dir, "trajectories.parquet"), convs)
  calls = [sum(len(m.get("tool_calls") or []) for m in c["messages"]) for c in convs]
  return {"path": path, "conversations": len(convs), "dropped": failed, "source": "real", "style": t.style,
          "tool_calls_per_conversation": sum(calls) / max(len(calls), 1)}


def _stitched(config, workdir, problems, out_dir) -> dict[str, Any]:
  """The stitched baseline on the same SFT problems: plain solutions with a tool call spliced in."""
  import pandas as pd

  from agentrl_jax.data import stitched

  rows = arithmetic.rl_rows(problems)
  for row, p in zip(rows, problems):
    work = f"The number asked for is {p.answer}." if p.level == 0 else f"We compute {p.expression} = {p.answer}."
    row["extra_info"]["solution"] = f"{work}\nThe answer is \\boxed{{{p.answer}}}."
  src = os.path.join(out_dir, "solutions.parquet")
  pd.DataFrame(rows).to_parquet(src)
  job = _shared(config, workdir, "collect")
  job.builder = "stitched"
  job.data.train_path = src
  job.stitch = ml_collections.ConfigDict(dict(
      output_mode="run", solution_field="solution", bridge="Let me compute this with code.", append_answer=True,
      advertise_tools=config.rollout.advertise_tools, max_tool_output_chars=config.rollout.max_tool_output_chars,
      limit=0,
      output="stitched.parquet"))
  result = stitched.run(job, out_dir)
  return {"path": result.summary["output"], "conversations": result.summary["stitched"],
          "dropped": result.summary["rows"] - result.summary["stitched"], "source": "stitched"}


# ---------------------------------------------------------------------------------------------------- sft
def sft_config(config: ml_collections.ConfigDict, workdir: str, results: dict) -> ml_collections.ConfigDict:
  job = ml_collections.ConfigDict()
  job.job = "sft"
  job.seed = config.seed
  job.model = model_block(config)
  job.mesh = ml_collections.ConfigDict(config.mesh.to_dict())
  job.data = ml_collections.ConfigDict(dict(path=results["teacher"]["path"], data_dir=data_dir(config, workdir),
                                            skip_malformed_rows=True, shuffle=True, toy_conversations=0,
                                            toy_malformed=0, toy_tools=True))
  job.sft = ml_collections.ConfigDict(config.sft.to_dict())
  job.optimizer = ml_collections.ConfigDict(config.sft_optimizer.to_dict())
  job.checkpoint = ml_collections.ConfigDict(config.checkpoint.to_dict())
  job.log_every_steps = config.log_every_steps
  job.wandb_project = config.wandb_project
  job.export_hf = False
  return job


def run_sft(config: ml_collections.ConfigDict, workdir: str, results: dict) -> dict[str, Any]:
  from agentrl_jax.sft import trainer

  out_dir = stage_dir(workdir, "sft")
  last = trainer.run(sft_config(config, workdir, results), out_dir)
  return {"checkpoint": os.path.join(out_dir, "checkpoints"), "final": last}


# ---------------------------------------------------------------------------------------------------- eval
def eval_config(config: ml_collections.ConfigDict, workdir: str, path: str, model: ml_collections.ConfigDict,
                *, greedy: bool = False) -> ml_collections.ConfigDict:
  """The evaluation job of the problems in `path` with the policy `model` (a `model` block), sampled as
  `config.eval` says, or one greedy answer per problem."""
  job = _shared(config, workdir, "eval")
  job.model = model
  ev = config.eval
  job.eval = ml_collections.ConfigDict(dict(
      sources=[dict(name=HELDOUT, path=path, schema="rl")], n=ev.n, temperature=ev.temperature, top_p=ev.top_p,
      top_k=ev.top_k, ks=list(ev.ks), print_metrics=False))
  if greedy:
    job.eval.update(n=1, temperature=0.0, ks=[1])
  return job


def checkpoint_model(config: ml_collections.ConfigDict, checkpoint: str) -> ml_collections.ConfigDict:
  """The policy's `model` block reading one of our checkpoints."""
  block = model_block(config)
  block.checkpoint = checkpoint
  return block


def heldout_metrics(metrics: dict[str, float], k: int) -> dict[str, float | None]:
  """The report's keys from the evaluation runner's metrics of the task's data source."""
  out = {}
  for key, name in REPORT_KEYS.items():
    value = metrics.get(f"{arithmetic.DATA_SOURCE}/{name.format(k=k)}")
    out[key.format(k=k)] = None if value is None else float(value)
  if out[f"maj@{k}"] is None and out[f"avg@{k}"] is not None:
    out[f"maj@{k}"] = 0.0  # the runner omits maj@k when no sample had an extractable answer: no vote is right
  return out


def evaluate_policy(config: ml_collections.ConfigDict, workdir: str, out_dir: str, path: str,
                    model: ml_collections.ConfigDict) -> dict[str, Any]:
  """The problems of `path` evaluated as sampled in training (`eval.n` samples at `eval.temperature`), and with
  `eval.greedy` also one greedy answer per problem (`greedy@1`, in `out_dir/greedy`): whether a policy's most
  likely answer is right, beyond how sharp its distribution is. Rollouts are kept in `out_dir` (the report's
  intervals are computed from them)."""
  from agentrl_jax.evaluation import runner

  metrics = runner.run(eval_config(config, workdir, path, model), out_dir)
  k = max(config.eval.ks)
  out = {"metrics": heldout_metrics(metrics, k), "all": metrics}
  if config.eval.greedy:
    os.makedirs(os.path.join(out_dir, "greedy"), exist_ok=True)
    g = runner.run(eval_config(config, workdir, path, model, greedy=True), os.path.join(out_dir, "greedy"))
    out["metrics"]["greedy@1"] = g.get(f"{arithmetic.DATA_SOURCE}/avg@1")
  return out


def run_eval_sft(config, workdir, results):
  return evaluate_policy(config, workdir, stage_dir(workdir, "eval_sft"), results["data"]["splits"][HELDOUT]["path"],
                         checkpoint_model(config, results["sft"]["checkpoint"]))


def run_eval_rl(config, workdir, results):
  return evaluate_policy(config, workdir, stage_dir(workdir, "eval_rl"), results["data"]["splits"][HELDOUT]["path"],
                         checkpoint_model(config, results["rl"]["checkpoint"]))


# ---------------------------------------------------------------------------------------------------- filter
def filter_config(config: ml_collections.ConfigDict, workdir: str, results: dict) -> ml_collections.ConfigDict:
  job = _shared(config, workdir, "filter")
  job.model.checkpoint = results["sft"]["checkpoint"]
  job.data.train_path = results["data"]["splits"]["rl"]["path"]
  f = config.filter
  job.filter = ml_collections.ConfigDict(dict(
      k=f.k, temperature=config.rollout.temperature, top_p=config.rollout.top_p, top_k=config.rollout.top_k,
      prompts_per_batch=f.prompts_per_batch, limit=0, min_pass_rate=f.min_pass_rate, max_pass_rate=f.max_pass_rate,
      include_min=f.include_min, include_max=f.include_max, output="filtered.parquet", report="pass_rates.jsonl"))
  return job


def run_filter(config, workdir, results):
  from agentrl_jax.rl import filter_prompts

  summary = filter_prompts.run(filter_config(config, workdir, results), stage_dir(workdir, "filter"))
  if not summary["kept"]:
    raise ValueError(f"filter: no RL prompt has a pass rate in {summary['band']} under the SFT policy "
                     f"({summary['all_correct']} always right, {summary['all_wrong']} always wrong); "
                     "widen config.filter or train SFT longer")
  keep = ("prompts", "kept", "band", "k", "pass_rate_mean", "all_correct", "all_wrong", "output")
  return {k: summary[k] for k in keep}


# ---------------------------------------------------------------------------------------------------- rl
def rl_config(config: ml_collections.ConfigDict, workdir: str, results: dict) -> ml_collections.ConfigDict:
  job = _shared(config, workdir, "rl")
  job.model.checkpoint = results["sft"]["checkpoint"]
  job.data.train_path = results["filter"]["output"]
  job.rl = ml_collections.ConfigDict(config.rl.to_dict())
  job.optimizer = ml_collections.ConfigDict(config.optimizer.to_dict())
  if "lora" in config:
    job.lora = ml_collections.ConfigDict(config.lora.to_dict())
  ev = config.eval
  job.eval = ml_collections.ConfigDict(dict(
      sources=[dict(name="heldout_curve", path=results["data"]["splits"]["heldout_curve"]["path"], schema="rl")],
      every_steps=ev.every_steps, at_start=True, n=ev.n, temperature=ev.temperature, top_p=ev.top_p,
      top_k=ev.top_k, ks=list(ev.ks), samples_to_log=ev.samples_to_log))
  job.checkpoint = ml_collections.ConfigDict(config.checkpoint.to_dict())
  job.log_every_steps = 1
  job.samples_every_steps = config.samples_every_steps
  job.samples_per_log = config.samples_per_log
  job.wandb_project = config.wandb_project
  return job


def run_rl(config, workdir, results):
  from agentrl_jax.rl import trainer

  out_dir = stage_dir(workdir, "rl")
  last = trainer.run(rl_config(config, workdir, results), out_dir)
  return {"checkpoint": os.path.join(out_dir, "checkpoints"), "metrics": os.path.join(out_dir, "metrics.jsonl"),
          "final": {k: v for k, v in last.items() if not k.startswith(("time/", "count/"))}}


RUNNERS = {"data": run_data, "teacher": run_teacher, "sft": run_sft, "eval_sft": run_eval_sft,
           "filter": run_filter, "rl": run_rl, "eval_rl": run_eval_rl}
STAGE_CONFIGS = {"sft": sft_config, "filter": filter_config, "rl": rl_config}


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
