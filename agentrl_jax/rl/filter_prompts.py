"""Model-aware prompt filtering: each prompt's pass rate under the current policy, and the prompts in a band.

    python -m agentrl_jax.main --config=configs/filter_prompts.py --workdir=DIR \
        --config.model.checkpoint=runs/sft/checkpoints --config.data.train_path=train.parquet

The recipe trains on a model-aware prompt set: prompts the policy always solves or never solves give GRPO
groups of equal rewards, which carry no gradient. This job samples k episodes per prompt with the tool loop
and the training sampling settings, scores them with the outcome reward (no shaping), and keeps the prompts
whose pass rate (correct / k) lies in the configured band (default: strictly between 0 and 1).

Outputs in the workdir:
  `filtered.parquet`   the kept rows in the RL parquet schema: the ORIGINAL (unstyled) `prompt`, `data_source`,
                       `reward_model.ground_truth`, `extra_info` (with `pass_rate` and `pass_rate_k` added), and
                       a `pass_rate` column; it feeds `data.train_path` of an RL config as is.
  `pass_rates.jsonl`   one line per prompt, in file order, written as batches finish: its pass rate, correct
                       count, tool use, whether it was kept, or why it could not be estimated (too long).
  `filter_summary.json` counts, the band, the pass-rate histogram.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from agentrl_jax import metrics_writer, multihost
from agentrl_jax.data.records import PromptRecord

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PassRateBand:
  """The pass rates kept: from `low` to `high`, each end included or not.

  The default, the open interval (0, 1), keeps every prompt the policy sometimes but not always solves.
  """

  low: float = 0.0
  high: float = 1.0
  include_low: bool = False
  include_high: bool = False

  def __post_init__(self):
    if not 0.0 <= self.low <= self.high <= 1.0:
      raise ValueError(f"PassRateBand: need 0 <= low <= high <= 1, got low={self.low}, high={self.high}")
    if self.low == self.high and not (self.include_low and self.include_high):
      raise ValueError(f"PassRateBand: the band {self} is empty (low == high needs both ends included)")

  def contains(self, rate: float) -> bool:
    above = rate >= self.low if self.include_low else rate > self.low
    below = rate <= self.high if self.include_high else rate < self.high
    return above and below

  def __str__(self) -> str:
    return f"{'[' if self.include_low else '('}{self.low:g}, {self.high:g}{']' if self.include_high else ')'}"


@dataclasses.dataclass(frozen=True)
class FilterConfig:
  """The `filter` config block.

  Attributes:
    k: samples per prompt the pass rate is estimated from.
    temperature, top_p, top_k: sampling settings (the training ones: the rate should be the one RL will see;
      temperature 0 = greedy, whose rates are 0 or 1).
    prompts_per_batch: prompts rolled out together (the report is flushed after each batch).
    limit: the first `limit` prompts only (0 = all).
    min_pass_rate, max_pass_rate, include_min, include_max: the band (`PassRateBand`).
    output: the kept prompts' RL parquet; report: the per-prompt JSONL (both relative to the workdir unless
      absolute).
  """

  k: int = 16
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  prompts_per_batch: int = 64
  limit: int = 0
  min_pass_rate: float = 0.0
  max_pass_rate: float = 1.0
  include_min: bool = False
  include_max: bool = False
  output: str = "filtered.parquet"
  report: str = "pass_rates.jsonl"

  def __post_init__(self):
    for name in ("k", "prompts_per_batch"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"FilterConfig.{name}: must be an int >= 1, got {getattr(self, name)!r}")
    for name in ("limit", "top_k"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
        raise ValueError(f"FilterConfig.{name}: must be an int >= 0, got {getattr(self, name)!r}")
    if not self.temperature >= 0:
      raise ValueError(f"FilterConfig.temperature: must be >= 0 (0 = greedy), got {self.temperature!r}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"FilterConfig.top_p: must be in (0, 1], got {self.top_p!r}")
    if not self.output or not self.report:
      raise ValueError("FilterConfig.output and FilterConfig.report must name files")
    try:
      self.band
    except ValueError as e:
      raise ValueError(f"FilterConfig.min_pass_rate / max_pass_rate: {e}") from None

  @property
  def band(self) -> PassRateBand:
    return PassRateBand(self.min_pass_rate, self.max_pass_rate, self.include_min, self.include_max)


@dataclasses.dataclass(frozen=True)
class Outcomes:
  """The k sampled episodes of one prompt.

  Attributes:
    correct: `[k]` bool, the reward's verdict per episode.
    tool_calls: `[k]` tool calls per episode (None if unknown).
    response_tokens: `[k]` response lengths (None if unknown).
  """

  correct: np.ndarray
  tool_calls: np.ndarray | None = None
  response_tokens: np.ndarray | None = None

  @property
  def pass_rate(self) -> float:
    return float(np.mean(self.correct)) if len(self.correct) else 0.0


# `(styled prompts of a batch, batch number) -> per prompt its Outcomes, or why it was not sampled`.
SampleFn = Callable[[Sequence[PromptRecord], int], list["Outcomes | str"]]


def estimate(raw: Sequence[PromptRecord], styled: Sequence[PromptRecord], sample: SampleFn, *,
             band: PassRateBand, prompts_per_batch: int) -> Iterator[dict[str, Any]]:
  """Yields one report entry per prompt, in order, batch by batch.

  Args:
    raw: the prompts as stored (what is written back); styled: as the policy sees them (aligned with `raw`).
    sample: draws and scores k episodes per prompt (`engine_sampler`, or a stand-in in tests).
    band: the pass rates kept.
    prompts_per_batch: prompts handed to `sample` at once.

  Each entry: `index`, `data_source`, `ground_truth`, `k`, `correct`, `pass_rate` (None when not estimated),
  `kept`, `skipped` (why not estimated, else ''), `tool_calls_mean`, `response_tokens_mean`.
  """
  if len(raw) != len(styled):
    raise ValueError(f"estimate: {len(raw)} raw and {len(styled)} styled prompts")
  for b, start in enumerate(range(0, len(raw), prompts_per_batch)):
    outs = sample(styled[start:start + prompts_per_batch], b)
    if len(outs) != len(styled[start:start + prompts_per_batch]):
      raise ValueError(f"estimate: the sampler returned {len(outs)} outcomes for batch {b}")
    for record, out in zip(raw[start:start + prompts_per_batch], outs):
      entry = {"index": record.index, "data_source": record.data_source, "ground_truth": record.ground_truth}
      if isinstance(out, str):
        entry.update(k=0, correct=0, pass_rate=None, kept=False, skipped=out, tool_calls_mean=None,
                     response_tokens_mean=None)
      else:
        rate = out.pass_rate
        entry.update(k=int(len(out.correct)), correct=int(np.sum(out.correct)), pass_rate=rate,
                     kept=band.contains(rate), skipped="",
                     tool_calls_mean=None if out.tool_calls is None else float(np.mean(out.tool_calls)),
                     response_tokens_mean=None if out.response_tokens is None else float(np.mean(out.response_tokens)))
      yield entry


def rl_row(record: PromptRecord, pass_rate: float, k: int) -> dict[str, Any]:
  """A row of the recipe's RL parquet schema for `record` (its stored, unstyled prompt), with the pass rate in
  `extra_info` and in a `pass_rate` column."""
  return {"prompt": [dict(m) for m in record.prompt], "data_source": record.data_source,
          "reward_model": {"style": "rule", "ground_truth": record.ground_truth},
          "extra_info": {**record.extra_info, "pass_rate": pass_rate, "pass_rate_k": k}, "pass_rate": pass_rate}


def engine_sampler(job, *, k: int, reward_cfg, on_episode=None) -> SampleFn:
  """A `SampleFn` that samples k episodes per prompt with `job.engine` (a `rollout.jobs.SamplingJob`) and
  scores them with the outcome reward; over-long prompts come back as the reason they were skipped.
  `on_episode` is called as each episode finishes (progress bars)."""
  from agentrl_jax.rl import batch as batch_lib
  from agentrl_jax.rollout import jobs

  def sample(batch: Sequence[PromptRecord], b: int) -> list[Outcomes | str]:
    out: list[Outcomes | str] = ["not sampled"] * len(batch)
    position = {r.index: i for i, r in enumerate(batch)}
    rendered = job.engine.render(batch)
    for index, reason in rendered.skipped:
      out[position[index]] = reason
    if not rendered.ids:
      return out
    episodes, _ = job.engine.run(job.params, rendered.ids, n=k, key=jax.random.fold_in(job.sample_key, b),
                                 on_episode=on_episode)
    scored = batch_lib.score_episodes(episodes, rendered.records, tokenizer=job.tokenizer, executor=job.executor,
                                      reward_cfg=reward_cfg, shaping_cfg=jobs.OUTCOME_ONLY)
    by_group = collections.defaultdict(list)
    for i, e in enumerate(episodes):
      by_group[e.group].append(i)
    for g, idx in by_group.items():
      out[position[rendered.records[g].index]] = Outcomes(
          correct=np.asarray(scored.acc)[idx], tool_calls=np.array([episodes[i].num_tool_calls for i in idx]),
          response_tokens=np.array([episodes[i].response_len for i in idx]))
    return out

  return sample


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """The filtering job (module docstring); returns the summary."""
  # ---------------------------------------------------------------------------------------------- config
  from agentrl_jax.data import writers
  from agentrl_jax.rollout import jobs

  cfg = FilterConfig(**config.filter)
  if cfg.k > config.rollout.batch_size:
    raise ValueError(f"filter.k={cfg.k} exceeds rollout.batch_size={config.rollout.batch_size} (a prompt's samples "
                     "are decoded together)")
  band = cfg.band
  out_path = writers.output_path(workdir, cfg.output)
  report_path = writers.output_path(workdir, cfg.report)
  t_start = time.perf_counter()

  # ---------------------------------------------------------------------------------------------- prompts & policy
  prompts = jobs.load_prompts(config, workdir, limit=cfg.limit)
  job = jobs.sampling_job(config, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
  bar = metrics_writer.progress_bar(len(prompts.raw) * cfg.k, desc="filter")
  sample = engine_sampler(job, k=cfg.k, reward_cfg=jobs.reward_config(config.reward),
                          on_episode=lambda _: bar.update(1))
  log.info("filter: %d prompts x %d samples (T=%s); keeping pass rates in %s", len(prompts.raw), cfg.k,
           cfg.temperature, band)

  # ---------------------------------------------------------------------------------------------- loop
  rows, entries = [], []
  by_index = {r.index: r for r in prompts.raw}
  with job, bar, multihost.open_primary(report_path) as report_f:
    for entry in estimate(prompts.raw, prompts.styled, sample, band=band, prompts_per_batch=cfg.prompts_per_batch):
      report_f.write(json.dumps(entry) + "\n")
      report_f.flush()
      entries.append(entry)
      if entry["kept"]:
        rows.append(rl_row(by_index[entry["index"]], entry["pass_rate"], entry["k"]))

  # ---------------------------------------------------------------------------------------------- outputs
  if rows and multihost.is_primary():
    writers.write_parquet(out_path, rows, nested=("prompt", "reward_model", "extra_info"))
  else:
    log.warning("filter: no prompt has a pass rate in %s; %s not written (see %s)", band, out_path, report_path)
  rates = [e["pass_rate"] for e in entries if e["pass_rate"] is not None]
  histogram = collections.Counter(f"{r:.4f}" for r in rates)
  summary = {"prompts": len(entries), "estimated": len(rates), "skipped": len(entries) - len(rates),
             "kept": len(rows), "band": str(band), "k": cfg.k,
             "pass_rate_mean": float(np.mean(rates)) if rates else 0.0,
             "all_correct": sum(r == 1.0 for r in rates), "all_wrong": sum(r == 0.0 for r in rates),
             "pass_rate_histogram": dict(sorted(histogram.items())), "output": out_path if rows else "",
             "malformed_prompt_rows": prompts.num_skipped, "wall_s": time.perf_counter() - t_start}
  with multihost.open_primary(os.path.join(workdir, "filter_summary.json")) as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  log.info("filter: kept %d of %d prompts (pass rate in %s; %d always right, %d always wrong, %d not estimated) "
           "-> %s", len(rows), len(entries), band, summary["all_correct"], summary["all_wrong"], summary["skipped"],
           summary["output"] or "(nothing written)")
  return summary
