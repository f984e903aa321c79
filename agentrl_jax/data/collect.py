"""Trajectory collection: REAL end-to-end tool-use trajectories of a policy -> the recipe's SFT parquet.

    python -m agentrl_jax.main --config=configs/collect_trajectories.py --workdir=DIR \
        --config.model.checkpoint=runs/x/checkpoints --config.data.train_path=prompts.parquet

The policy samples n episodes per prompt with the tool loop, its code running in the real sandbox; the reward
judges each episode; the kept ones are turned back into chat messages and written in the SFT schema
(`messages` with assistant `tool_calls` and `tool` turns, `tools` as JSON text), ready for
`data.prepare(SourceConfig(schema="sft"))` and the SFT trainer. An episode is kept when, in this order:

    complete        it ended its last turn itself (`stop_reason == "end"`; truncated or turn-capped ones are not
                    answers, and their text has no closing <|im_end|> to train on)
    correct         the reward judged the answer correct
    tool calls      it made at least `min_tool_calls` calls (malformed and failed calls count: recovering from
                    them is part of real tool use)
    exact           its messages, rendered by the tokenizer's chat template the way SFT renders them, give back
                    exactly the episode's text (so SFT trains on what the model generated plus the real tool
                    output; the token match is checked too and reported as `token_exact`)
    not a near-duplicate  of an episode of the same prompt already kept (word n-gram Jaccard similarity of the
                    normalised responses >= `dedup_threshold`; 0 disables)
    under the cap   fewer than `max_per_prompt` episodes of its prompt kept so far (0 = no cap)

Episodes are considered in sample order, so under the cap the kept ones are a random subset of the good ones.

Reconstruction (`episode_messages`): each assistant turn's generated text is split into content and tool calls
as the hermes chat template writes them: the trailing `<tool_call>` blocks that are well-formed calls of a known
tool, in the exact layout the template renders (`{"name": ..., "arguments": <tojson>}`), become structured
`tool_calls`; anything else (a malformed call, an oddly spaced one) stays in the content as the model wrote it,
which renders back to the same text. Each executed, failed, malformed or skipped call of the turn is followed
by a `tool` message holding exactly the text the model read back.

Outputs in the workdir: `trajectories.parquet` (the SFT rows, plus provenance columns the SFT reader ignores),
`trajectories.jsonl` (the same rows, appended batch by batch so a killed run keeps what it had),
`collect_report.jsonl` (every episode and overlong prompt with its decision) and `collect_summary.json`.
`config.builder = "stitched"` runs the synthetic baseline instead (`agentrl_jax/data/stitched.py`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from agentrl_jax import multihost
from agentrl_jax.data import records as rec
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.data.writers import CollectResult, output_path, sft_row, write_parquet, write_sft_parquet  # noqa: F401
from agentrl_jax.models.tokenizer import IM_END, TOOL_CALL, TOOL_CALL_END
from agentrl_jax.rollout.episode import STOP_END, Episode
from agentrl_jax.rollout.parser import parse_tool_calls

log = logging.getLogger(__name__)

# Decisions written to the report (KEPT, or why not).
KEPT = "kept"
PROMPT_TOO_LONG = "prompt_too_long"
INCOMPLETE = "incomplete"
INCORRECT = "incorrect"
FEW_TOOL_CALLS = "too_few_tool_calls"
INEXACT = "inexact_render"
NEAR_DUPLICATE = "near_duplicate"
OVER_CAP = "over_cap"

_BLOCK = re.compile(re.escape(TOOL_CALL) + r".*?" + re.escape(TOOL_CALL_END), re.DOTALL)
_MARKUP = re.compile(r"<\|[^|]*\|>")


@dataclasses.dataclass(frozen=True)
class CollectConfig:
  """The `collect` config block.

  Attributes:
    n: episodes sampled per prompt.
    temperature: sampling temperature (0 = greedy); top_p, top_k: nucleus / top-k sampling (top_k 0 = off).
    prompts_per_batch: prompts rolled out together (output is flushed after each batch).
    limit: collect from the first `limit` prompts only (0 = all).
    min_tool_calls: keep only episodes with at least this many tool calls (0 = no requirement).
    max_per_prompt: keep at most this many episodes per prompt (0 = no cap).
    dedup_threshold: drop an episode whose word n-gram Jaccard similarity to a kept episode of the same prompt is
      >= this (1.0: identical n-gram sets only; 0 disables).
    dedup_ngram: n of those word n-grams.
    output: the SFT parquet, relative to the workdir unless absolute.
  """

  n: int = 8
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  prompts_per_batch: int = 64
  limit: int = 0
  min_tool_calls: int = 1
  max_per_prompt: int = 2
  dedup_threshold: float = 0.8
  dedup_ngram: int = 4
  output: str = "trajectories.parquet"

  def __post_init__(self):
    for name in ("n", "prompts_per_batch", "dedup_ngram"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"CollectConfig.{name}: must be an int >= 1, got {getattr(self, name)!r}")
    for name in ("limit", "min_tool_calls", "max_per_prompt", "top_k"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
        raise ValueError(f"CollectConfig.{name}: must be an int >= 0, got {getattr(self, name)!r}")
    if not self.temperature >= 0:
      raise ValueError(f"CollectConfig.temperature: must be >= 0 (0 = greedy), got {self.temperature!r}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"CollectConfig.top_p: must be in (0, 1], got {self.top_p!r}")
    if not 0 <= self.dedup_threshold <= 1:
      raise ValueError(f"CollectConfig.dedup_threshold: must be in [0, 1] (0 disables), got {self.dedup_threshold!r}")
    if not self.output:
      raise ValueError("CollectConfig.output: must name a file")


# ------------------------------------------------------------------------------------------------------------
# Reconstruction: episode turns -> chat messages
# ------------------------------------------------------------------------------------------------------------


def _structured_call(block: str, tool_names: Sequence[str]) -> dict[str, Any] | None:
  """The `tool_calls` entry of one `<tool_call>...</tool_call>` block, or None when the block is not a
  well-formed call of a known tool in exactly the layout the hermes template renders."""
  calls = parse_tool_calls(block, tool_names)
  if len(calls) != 1 or not calls[0].ok:
    return None
  name, args = calls[0].name, calls[0].arguments
  rendered = (f'{TOOL_CALL}\n{{"name": "{name}", "arguments": '
              f'{json.dumps(args, ensure_ascii=False)}}}\n{TOOL_CALL_END}')
  if rendered != block:
    return None
  return {"type": "function", "function": {"name": name, "arguments": args}}


def split_turn(text: str, tool_names: Sequence[str] = ("code_interpreter",)) -> tuple[str, list[dict[str, Any]]]:
  """Content and structured tool calls of an assistant turn's text (its closing <|im_end|> removed).

  The hermes template renders a turn as `content`, then each call as `<tool_call>\\n{json}\\n</tool_call>`, with
  a newline before every call except a first one that follows empty content. The trailing blocks that fit
  that layout become `tool_calls`; the rest (malformed calls included) stays in the content verbatim, so the
  template renders the result back to `text`.

  Returns:
    `(content, tool_calls)`; `tool_calls` is empty when no trailing block fits.
  """
  calls: list[dict[str, Any]] = []
  cut = len(text)  # start of the structured calls' region (including the newline before the first)
  for m in reversed(list(_BLOCK.finditer(text))):
    if m.end() != cut:
      break
    call = _structured_call(m.group(0), tool_names)
    if call is None:
      break
    before = text[:m.start()]
    if before and (before == "\n" or not before.endswith("\n")):
      break  # the template would write content + "\n" + call: not this text
    calls.insert(0, call)
    cut = max(m.start() - 1, 0)
  return text[:cut], calls


def episode_messages(episode: Episode, prompt: Sequence[dict[str, Any]], tokenizer,
                     tool_names: Sequence[str] = ("code_interpreter",)) -> list[dict[str, Any]]:
  """The chat messages of an episode: the prompt the policy saw, then per turn the assistant message (content
  and `tool_calls`, see `split_turn`) and one `tool` message per call with the text the model read back.

  Args:
    episode: a finished episode (its `turns` index into `response_ids`).
    prompt: the messages its prompt was rendered from (styled, as the policy saw them).
    tokenizer: the policy's tokenizer.
    tool_names: tools whose calls may become structured `tool_calls`.
  """
  messages = [dict(m) for m in prompt]
  ids = np.asarray(episode.response_ids)
  for turn in episode.turns:
    text = tokenizer.decode(ids[turn.start:turn.start + turn.num_generated].tolist(), skip_special_tokens=False)
    if text.endswith(IM_END):
      text = text[:-len(IM_END)]
    content, calls = split_turn(text, tool_names)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
      message["tool_calls"] = calls
    messages.append(message)
    if turn.num_tool_tokens:  # the tool responses were appended (not the case when the episode ended there)
      messages += [{"role": "tool", "content": call.output} for call in turn.calls]
  return messages


def check_render(tokenizer, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
                 episode: Episode) -> tuple[str, bool]:
  """Whether SFT would train on exactly this episode.

  Renders `messages` the way the SFT trainer does (`sft.masking.render_pieces`) and compares with the
  episode's prompt + response text.

  Returns:
    `(problem, token_exact)`: problem is '' when the render equals the episode's text (up to the template's
    trailing whitespace), else what differs; token_exact says whether SFT's tokens also equal the episode's.
  """
  from agentrl_jax.sft import masking  # the SFT view of a conversation (and its checks)

  try:
    pieces = masking.render_pieces(tokenizer, messages, tools or None)
  except masking.MalformedConversation as e:
    return f"SFT cannot render it: {e}", False
  episode_ids = np.concatenate([np.asarray(episode.prompt_ids), np.asarray(episode.response_ids)]).tolist()
  want = tokenizer.decode(episode_ids, skip_special_tokens=False)
  got = "".join(text for text, _ in pieces)
  if got[:len(want)] != want or got[len(want):].strip():
    i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return (f"the template renders {got[max(i - 30, 0):i + 30]!r} where the episode has "
            f"{want[max(i - 30, 0):i + 30]!r} (char {i})"), False
  ids = [t for text, _ in pieces for t in tokenizer.encode(text, add_special_tokens=False)]
  return "", ids[:len(episode_ids)] == episode_ids


# ------------------------------------------------------------------------------------------------------------
# Filters
# ------------------------------------------------------------------------------------------------------------


def screen(episode: Episode, correct: bool, min_tool_calls: int) -> str:
  """The first cheap filter an episode fails ('' if none): complete, correct, enough tool calls."""
  if episode.stop_reason != STOP_END:
    return INCOMPLETE
  if not correct:
    return INCORRECT
  if episode.num_tool_calls < min_tool_calls:
    return FEW_TOOL_CALLS
  return ""


def normalize_text(text: str) -> str:
  """Text for near-duplicate checks: chat control tokens removed, lower case, whitespace collapsed."""
  return " ".join(_MARKUP.sub(" ", text).lower().split())


def ngrams(text: str, n: int) -> frozenset[tuple[str, ...]]:
  """Word n-grams of `normalize_text(text)` (a text shorter than n words is one gram)."""
  words = normalize_text(text).split()
  if len(words) < n:
    return frozenset([tuple(words)])
  return frozenset(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
  """|a & b| / |a | b| (1.0 for two empty sets)."""
  union = len(a | b)
  return len(a & b) / union if union else 1.0


def select_group(texts: Sequence[str], *, max_per_prompt: int, dedup_threshold: float,
                 dedup_ngram: int) -> list[str]:
  """Decisions for the eligible episodes of ONE prompt, in sample order: KEPT, NEAR_DUPLICATE or OVER_CAP.

  Args:
    texts: their response texts (tool outputs included).
    max_per_prompt: most kept (0 = no cap).
    dedup_threshold: Jaccard similarity at or above which an episode duplicates a kept one (0 disables).
    dedup_ngram: word n-gram size.
  """
  out, kept = [], []
  for text in texts:
    grams = ngrams(text, dedup_ngram)
    if dedup_threshold > 0 and any(jaccard(grams, k) >= dedup_threshold for k in kept):
      out.append(NEAR_DUPLICATE)
    elif max_per_prompt and len(kept) >= max_per_prompt:
      out.append(OVER_CAP)
    else:
      kept.append(grams)
      out.append(KEPT)
  return out


# ------------------------------------------------------------------------------------------------------------
# SFT rows
# ------------------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------------------
# One batch of scored episodes -> decisions and rows
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Collected:
  """What `collect_episodes` made of a batch.

  Attributes:
    rows: the kept SFT rows; episodes: their episodes (aligned with `rows`).
    report: one entry per episode: prompt index, sample, outcome, tool use, decision and detail.
  """

  rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  episodes: list[Episode] = dataclasses.field(default_factory=list)
  report: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def collect_episodes(episodes: Sequence[Episode], correct: Sequence[bool], response_texts: Sequence[str],
                     records: Sequence[PromptRecord], *, tokenizer, tools: Sequence[dict[str, Any]],
                     cfg: CollectConfig, tool_names: Sequence[str] = ("code_interpreter",),
                     preds: Sequence[str] | None = None) -> Collected:
  """Applies the filters (module docstring) to scored episodes and builds the kept rows.

  Args:
    episodes: episodes ordered by (group, sample); `episode.group` indexes `records`.
    correct: the reward's verdict per episode; response_texts: the decoded responses (for near-duplicates).
    records: the prompts as the policy saw them.
    tokenizer: the policy's tokenizer; tools: the tool schemas the policy was shown ([] when none).
    cfg: the filters.
    tool_names: tools whose calls may become structured `tool_calls`.
    preds: the extracted answers (reported only).
  """
  out = Collected()
  decisions = [""] * len(episodes)
  details = [""] * len(episodes)
  messages: dict[int, list[dict[str, Any]]] = {}
  token_exact: dict[int, bool] = {}
  by_group: dict[int, list[int]] = collections.defaultdict(list)
  for i, e in enumerate(episodes):
    decisions[i] = screen(e, bool(correct[i]), cfg.min_tool_calls)
    if not decisions[i]:
      msgs = episode_messages(e, records[e.group].prompt, tokenizer, tool_names)
      problem, token_exact[i] = check_render(tokenizer, msgs, tools, e)
      if problem:
        decisions[i], details[i] = INEXACT, problem
      else:
        messages[i] = msgs
        by_group[e.group].append(i)
  for group, idx in by_group.items():
    for i, d in zip(idx, select_group([response_texts[i] for i in idx], max_per_prompt=cfg.max_per_prompt,
                                      dedup_threshold=cfg.dedup_threshold, dedup_ngram=cfg.dedup_ngram)):
      decisions[i] = d
  for i, e in enumerate(episodes):
    record = records[e.group]
    entry = {"index": record.index, "sample": e.sample, "data_source": record.data_source,
             "ground_truth": record.ground_truth, "pred": preds[i] if preds is not None else None,
             "correct": bool(correct[i]), "stop_reason": e.stop_reason, "num_turns": e.num_turns,
             "num_tool_calls": e.num_tool_calls, "num_failed_calls": e.num_failed_calls,
             "response_tokens": e.response_len, "decision": decisions[i], "detail": details[i],
             "token_exact": token_exact.get(i)}
    out.report.append(entry)
    if decisions[i] == KEPT:
      out.rows.append(sft_row(messages[i], tools, record, sample=e.sample, num_tool_calls=e.num_tool_calls,
                              num_failed_calls=e.num_failed_calls, response_tokens=e.response_len,
                              token_exact=token_exact[i]))
      out.episodes.append(e)
  return out


# ------------------------------------------------------------------------------------------------------------
# The job
# ------------------------------------------------------------------------------------------------------------


def run(config: ml_collections.ConfigDict, workdir: str, *, keep_episodes: bool = False) -> CollectResult:
  """The collection job (module docstring); `config.builder == "stitched"` runs `data.stitched.run`.

  The kept rows stay in memory until the parquet is written (parquet needs them all to fix the nested types).
  """
  # ---------------------------------------------------------------------------------------------- config
  builder = config.get("builder", "rollout")
  if builder == "stitched":
    from agentrl_jax.data import stitched

    return stitched.run(config, workdir)
  if builder != "rollout":
    raise ValueError(f"config.builder: unknown {builder!r} (rollout, stitched)")
  from agentrl_jax.rl import batch as batch_lib
  from agentrl_jax.rollout import jobs

  cfg = CollectConfig(**config.collect)
  if cfg.n > config.rollout.batch_size:
    raise ValueError(f"collect.n={cfg.n} exceeds rollout.batch_size={config.rollout.batch_size} (a prompt's samples "
                     "are decoded together)")
  reward_cfg = jobs.reward_config(config.reward)
  out_path = output_path(workdir, cfg.output)
  t_start = time.perf_counter()

  # ---------------------------------------------------------------------------------------------- prompts & policy
  prompts = jobs.load_prompts(config, workdir, limit=cfg.limit)
  job = jobs.sampling_job(config, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
  tools = job.engine.tools or []
  tool_names = job.engine.cfg.tool_names
  log.info("collect: %d prompts x %d samples (T=%s), keeping correct ones with >= %d tool calls, <= %s per prompt",
           len(prompts.styled), cfg.n, cfg.temperature, cfg.min_tool_calls, cfg.max_per_prompt or "any")

  # ---------------------------------------------------------------------------------------------- loop
  rows, kept_episodes = [], []
  counts: collections.Counter = collections.Counter()
  generated_tokens = 0
  with job, multihost.open_primary(os.path.join(workdir, "collect_report.jsonl")) as report_f, \
      multihost.open_primary(os.path.join(workdir, "trajectories.jsonl")) as rows_f:
    for b, start in enumerate(range(0, len(prompts.styled), cfg.prompts_per_batch)):
      rendered = job.engine.render(prompts.styled[start:start + cfg.prompts_per_batch])
      for index, reason in rendered.skipped:
        report_f.write(json.dumps({"index": index, "decision": PROMPT_TOO_LONG, "detail": reason}) + "\n")
        counts[PROMPT_TOO_LONG] += 1
      if not rendered.ids:
        continue
      episodes, stats = job.engine.run(job.params, rendered.ids, n=cfg.n, key=jax.random.fold_in(job.sample_key, b))
      generated_tokens += stats.generated_tokens
      scored = batch_lib.score_episodes(episodes, rendered.records, tokenizer=job.tokenizer, executor=job.executor,
                                        reward_cfg=reward_cfg, shaping_cfg=jobs.OUTCOME_ONLY)
      got = collect_episodes(episodes, scored.acc, scored.response_text, rendered.records, tokenizer=job.tokenizer,
                             tools=tools, cfg=cfg, tool_names=tool_names, preds=scored.pred)
      for entry in got.report:
        report_f.write(json.dumps(entry) + "\n")
        counts[entry["decision"]] += 1
      for row in got.rows:
        rows_f.write(rec.to_json(row) + "\n")
      report_f.flush()
      rows_f.flush()
      rows += got.rows
      if keep_episodes:
        kept_episodes += got.episodes
      log.info("collect: batch %d: %d episodes, %d kept (%d so far)", b + 1, len(episodes), len(got.rows), len(rows))

  # ---------------------------------------------------------------------------------------------- outputs
  if rows and multihost.is_primary():
    write_sft_parquet(out_path, rows)
  else:
    log.warning("collect: no episode was kept; %s not written (see collect_report.jsonl)", out_path)
  kept_prompts = len({r["prompt_index"] for r in rows})
  summary = {
      "prompts": len(prompts.styled), "prompts_with_kept": kept_prompts, "episodes": sum(
          v for k, v in counts.items() if k != PROMPT_TOO_LONG), "kept": len(rows),
      **{f"decision/{k}": v for k, v in sorted(counts.items())},
      "kept_token_exact": sum(bool(r["token_exact"]) for r in rows),
      "kept_tool_calls_mean": float(np.mean([r["num_tool_calls"] for r in rows])) if rows else 0.0,
      "kept_failed_calls_mean": float(np.mean([r["num_failed_calls"] for r in rows])) if rows else 0.0,
      "generated_tokens": generated_tokens, "wall_s": time.perf_counter() - t_start,
      "output": out_path if rows else "", "malformed_prompt_rows": prompts.num_skipped,
  }
  with multihost.open_primary(os.path.join(workdir, "collect_summary.json")) as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  log.info("collect: kept %d of %d episodes from %d of %d prompts -> %s", len(rows), summary["episodes"],
           kept_prompts, len(prompts.styled), summary["output"] or "(nothing written)")
  return CollectResult(summary=summary, rows=rows, episodes=kept_episodes)
