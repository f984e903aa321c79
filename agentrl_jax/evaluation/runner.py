"""Evaluation with the tool loop: n samples per problem -> avg@k / pass@k / maj@k per source, every rollout saved.

`evaluate` is what the RL trainer calls periodically; `run` is the standalone job
(`python -m agentrl_jax.main --config=configs/eval_demystify.py --workdir=DIR`), which loads a checkpoint (ours
or a HF directory), evaluates every configured source, prints the metrics and writes `eval_metrics.json` and
`eval_rollouts.jsonl` under the workdir.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence

from flax import nnx
import jax
import ml_collections

from agentrl_jax import data, metrics_writer, multihost, rewards
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.evaluation import bootstrap
from agentrl_jax.evaluation import metrics as metrics_lib
from agentrl_jax.rl import batch as batch_lib
from agentrl_jax.rollout import engine as engine_lib
from agentrl_jax.rollout import jobs

log = logging.getLogger(__name__)
# Evaluation scores the outcome only: no overlong penalty, no tool-call shaping.
_NO_SHAPING = jobs.OUTCOME_ONLY


def evaluate(engine: engine_lib.RolloutEngine, params: nnx.State, records: Sequence[PromptRecord], *, n: int,
             key: jax.Array, reward_cfg: rewards.RewardConfig, ks: Sequence[int], progress: str = "eval",
             leave: bool = True) -> tuple[dict, list[dict]]:
  """Samples n episodes per record with the tool loop and scores them.

  `progress` names the progress bar over episodes ("" = none); `leave=False` clears it when done.

  Returns:
    `(metrics, rows)`: metrics as `evaluation.metrics.compute_metrics` names them ('<source>/pass@k', ...), the
    95% bootstrap interval over problems of each avg@k and pass@k ('<source>/avg@k_ci95_lo' and '..._hi'),
    'eval/skipped_prompts' and timing; one row per episode (prompt, transcript, prediction, its answer key,
    correctness, tool use: `samples_from_rows` turns them back into `EvalSample`s).
  """
  t0 = time.perf_counter()
  prompts = engine.render(records)
  if not prompts.ids:
    raise ValueError("evaluate: every prompt was longer than max_prompt_len")
  bar = metrics_writer.progress_bar(len(prompts.ids) * n, desc=progress, leave=leave, disable=not progress)
  try:
    episodes, stats = engine.run(params, prompts.ids, n=n, key=key, on_episode=lambda _: bar.update(1))
  finally:
    bar.close()
  scored = batch_lib.score_episodes(episodes, prompts.records, tokenizer=engine.tokenizer, executor=engine.executor,
                                    reward_cfg=reward_cfg, shaping_cfg=_NO_SHAPING)
  samples, rows = [], []
  for i, e in enumerate(episodes):
    rec = prompts.records[e.group]
    pred = scored.pred[i]
    answer_key = rewards.answer_key(rec.data_source, pred, reward_cfg) if pred else None
    samples.append(metrics_lib.EvalSample(
        data_source=rec.data_source, prompt_id=rec.index, acc=bool(scored.acc[i]), score=float(scored.score[i]),
        answer_key=answer_key, n_tool_calls=e.num_tool_calls, n_tool_ok=e.num_tool_calls - e.num_failed_calls,
        response_tokens=e.response_len))
    rows.append({"data_source": rec.data_source, "index": rec.index, "sample": e.sample,
                 "ground_truth": rec.ground_truth, "pred": pred, "answer_key": answer_key,
                 "acc": bool(scored.acc[i]), "score": float(scored.score[i]), "info": scored.info[i],
                 "failure": scored.failure[i], "num_tool_calls": e.num_tool_calls,
                 "num_failed_calls": e.num_failed_calls, "stop_reason": e.stop_reason,
                 "response_tokens": e.response_len, "transcript": e.transcript})
  ks = [k for k in ks if k <= n]
  out = metrics_lib.compute_metrics(samples, ks=ks)
  out.update(intervals(samples, ks))
  out["eval/skipped_prompts"] = float(len(prompts.skipped))
  out["eval/infra_failures"] = float(sum(bool(f) for f in scored.failure))  # rewards not computed: counted wrong
  out["eval/wall_s"] = time.perf_counter() - t0
  out["eval/generated_tokens"] = float(stats.generated_tokens)
  return out, rows


def intervals(samples: Sequence[metrics_lib.EvalSample], ks: Sequence[int]) -> dict[str, float]:
  """'<source>/avg@k_ci95_lo' / '_hi' and the same for pass@k: 95% bootstrap intervals over problems."""
  out = {}
  for source in sorted({s.data_source for s in samples}):
    for k in ks:
      table = bootstrap.problem_table([s for s in samples if s.data_source == source], k)
      for metric in (f"avg@{k}", f"pass@{k}"):
        ci = bootstrap.interval(table[metric]) if table.get(metric) else None
        if ci is not None:
          out[f"{source}/{metric}_ci95_lo"], out[f"{source}/{metric}_ci95_hi"] = ci
  return out


def samples_from_rows(rows: Sequence[dict]) -> list[metrics_lib.EvalSample]:
  """The `EvalSample`s of the rows `evaluate` returns (and `run` writes to `eval_rollouts.jsonl`)."""
  return [metrics_lib.EvalSample(
      data_source=r["data_source"], prompt_id=r["index"], acc=bool(r["acc"]), score=float(r.get("score", 0.0)),
      answer_key=r.get("answer_key"), n_tool_calls=int(r["num_tool_calls"]),
      n_tool_ok=int(r["num_tool_calls"]) - int(r["num_failed_calls"]), response_tokens=int(r["response_tokens"]))
      for r in rows]


@dataclasses.dataclass(frozen=True)
class EvalSource:
  """One evaluation set: a local file in a published schema."""

  name: str
  path: str
  schema: str
  limit: int = 0  # evaluate the first `limit` problems only (0 = all)


def load_sources(sources: Sequence[dict], data_dir: str, style: data.PromptStyle,
                 check: Callable[[str], object] | None = None) -> list[PromptRecord]:
  """Builds (once, cached under `data_dir`) and reads every configured source; a missing file is a ValueError,
  and so is a data source `check` refuses (`data.refuse_unknown_sources`: file and row named)."""
  records = []
  for s in sources:
    src = EvalSource(**dict(s))
    prep = data.prepare(data.SourceConfig(path=src.path, schema=src.schema, data_dir=data_dir, skip_malformed=True))
    if check is not None:
      data.refuse_unknown_sources(prep, check)
    if prep.num_skipped:
      log.warning("eval: %s: %d malformed rows skipped", src.name, prep.num_skipped)
    records += data.all_prompt_records(prep.data_source, style, limit=src.limit or None)
  return records


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """The standalone evaluation job (module docstring)."""
  ev = config.eval
  sources = list(ev.sources)
  if not sources and config.get("eval_root"):
    from agentrl_jax.rl import recipe

    sources = recipe.eval_sources(config.eval_root)
  if not sources:
    raise ValueError("config.eval.sources is empty and config.eval_root is not set: nothing to evaluate")
  reward_cfg = jobs.reward_config(config.reward)
  records = multihost.primary_first("eval_data", lambda: load_sources(
      sources, config.data.data_dir or os.path.join(workdir, "tfds"), jobs.prompt_style(config.get("prompt_style")),
      check=lambda source: rewards.kind_for(source, reward_cfg)))
  log.info("eval: %d problems x %d samples", len(records), ev.n)
  with jobs.sampling_job(config, temperature=ev.temperature, top_p=ev.top_p, top_k=ev.top_k) as job:
    metrics, rows = evaluate(job.engine, job.params, records, n=ev.n, key=job.sample_key,
                             reward_cfg=jobs.reward_config(config.reward), ks=ev.ks)
  with multihost.open_primary(os.path.join(workdir, "eval_rollouts.jsonl")) as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  with multihost.open_primary(os.path.join(workdir, "eval_metrics.json")) as f:
    json.dump(metrics, f, indent=2, sort_keys=True)
  for name in sorted(metrics) if ev.get("print_metrics", True) and multihost.is_primary() else ():  # a pipeline prints its own report
    if "@" in name or name.endswith(("tool_calls_mean", "tool_success_rate", "response_tokens_mean")):
      print(f"{name:40s} {metrics[name]:.4f}")
  return metrics
