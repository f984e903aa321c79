"""Host side of one RL step between the rollout and the update: rewards, groups, and the update batch.

    scored = score_episodes(episodes, records, tokenizer=tok, executor=ex, reward_cfg=..., shaping_cfg=...)
    keep = informative_groups(scored.reward, n)                   # dynamic sampling (optional)
    batch = update_batch(collate(episodes), advantages)           # token-aligned arrays for rl.update

Scoring runs the reward functions in a thread pool: code rewards wait on the sandbox, and a crashing scorer
becomes score 0 with a message (`rewards.compute_score`), so a bad response never stops the run.

Rewards read the model's own tokens only (`model_text`: loss mask 1), never what a tool printed. A response whose
reward could not be computed for a reason outside it (`RewardResult.failure`: sandbox down, harness or scorer
error, malformed ground truth; never something the response itself provoked: the executor and the registry
count a failure as infrastructure only when a probe fails too) is an infrastructure failure, not an answer:
`update_batch` leaves its row out of the loss, the trainer leaves it out of its group's advantage, and
`InfraTally` counts such responses per data source and stops the run (`RunStopped`) when a step has more than
the configured fraction of them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
from collections.abc import Sequence

import jax
import numpy as np

from agentrl_jax import multihost, rewards
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.rollout.episode import STOP_LENGTH, Episode


@dataclasses.dataclass
class Scored:
  """Per-episode reward information, arrays of length E (episodes in rollout order).

  Attributes:
    score: outcome score of the reward function (e.g. +1 / -1 for math in strict mode).
    acc: whether the answer was judged correct.
    reward: the training reward: `score` after tool-call shaping (executed calls, by default) and the overlong
      penalty.
    overlong_penalty: the overlong part of `reward` (<= 0).
    truncated: the episode hit its response budget.
    pred: the extracted answer of each episode (for logs and majority voting).
    info: scorer messages (empty when all went well).
    response_text: what the scorer read: the text of the tokens the model generated (`model_text`).
    failure: per episode, '' or why its reward could not be computed (a `rewards.FAILURES` kind).
    data_source: per episode, its row's data source.
  """

  score: np.ndarray
  acc: np.ndarray
  reward: np.ndarray
  overlong_penalty: np.ndarray
  truncated: np.ndarray
  pred: list[str]
  info: list[str]
  response_text: list[str]
  failure: list[str] = dataclasses.field(default_factory=list)
  data_source: list[str] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    n = len(self.score)
    self.failure = list(self.failure) or [""] * n
    self.data_source = list(self.data_source) or [""] * n

  @property
  def infra(self) -> np.ndarray:
    """Bool [E]: the reward could not be computed (excluded from advantages and the loss)."""
    return np.array([bool(f) for f in self.failure], bool)

  def select(self, indices) -> Scored:
    """The entries at `indices` (in that order)."""
    idx = np.asarray(indices, dtype=np.int64)
    return Scored(**{f.name: (v[idx] if isinstance(v := getattr(self, f.name), np.ndarray) else [v[i] for i in idx])
                     for f in dataclasses.fields(self)})

  @staticmethod
  def concat(parts: Sequence[Scored]) -> Scored:
    return Scored(**{f.name: (np.concatenate([getattr(p, f.name) for p in parts])
                              if isinstance(getattr(parts[0], f.name), np.ndarray)
                              else [x for p in parts for x in getattr(p, f.name)])
                     for f in dataclasses.fields(Scored)})


def response_text(tokenizer, episode: Episode) -> str:
  """The whole response (model and tool tokens) as text, for logs."""
  return tokenizer.decode(episode.response_ids.tolist(), skip_special_tokens=False)


def model_text(tokenizer, episode: Episode) -> str:
  """The text of the tokens the model generated (loss mask 1), each turn's run decoded on its own and joined with
  a newline: what every reward reads. Tool output (and the chat markup around it) is not the model's answer,
  whatever it prints."""
  mask = np.asarray(episode.loss_mask) != 0
  ids = np.asarray(episode.response_ids)
  edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
  runs = [ids[a:b].tolist() for a, b in zip(edges[::2], edges[1::2])]
  return "\n".join(tokenizer.decode(run, skip_special_tokens=False) for run in runs)


def score_episodes(episodes: Sequence[Episode], records: Sequence[PromptRecord], *, tokenizer, executor,
                   reward_cfg: rewards.RewardConfig, shaping_cfg: rewards.ShapingConfig,
                   max_workers: int = 8) -> Scored:
  """Scores every episode against the record of its group (`episode.group` indexes `records`).

  Several processes: each scores a contiguous share of the episodes (code rewards run in its own sandbox) and
  the shares are gathered, so every process holds the same scores (never recomputed apart: a tool timeout on one
  host must not change another host's batch)."""
  kw = dict(tokenizer=tokenizer, executor=executor, reward_cfg=reward_cfg, shaping_cfg=shaping_cfg,
            max_workers=max_workers)
  procs = jax.process_count()
  if procs == 1:
    return _score_local(episodes, records, **kw)
  me = jax.process_index()
  part = _score_local(episodes[len(episodes) * me // procs:len(episodes) * (me + 1) // procs], records, **kw)
  return Scored.concat(multihost.allgather_objects(part))


@functools.lru_cache(maxsize=None)
def _scoring_pool(max_workers: int) -> concurrent.futures.ThreadPoolExecutor:
  """One pool of scoring threads per width, kept for the process: the asynchronous stream scores each group as
  it finishes (a thousand calls and more in the main job's RL stage), and a pool made per call cost ~0.6 ms of
  thread start-up and join each time. Its tasks never submit to it, so concurrent callers cannot deadlock."""
  return concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"score-w{max_workers}")


def _score_local(episodes, records, *, tokenizer, executor, reward_cfg, shaping_cfg, max_workers) -> Scored:
  texts = [model_text(tokenizer, e) for e in episodes]

  def one(i: int) -> rewards.RewardResult:
    rec = records[episodes[i].group]
    return rewards.compute_score(rec.data_source, texts[i], rec.ground_truth, rec.extra_info, executor=executor,
                                 cfg=reward_cfg)

  results = list(_scoring_pool(max(1, max_workers)).map(one, range(len(episodes))))
  score = np.array([r.score for r in results], np.float32)
  lengths = np.array([e.response_len for e in episodes])
  penalty = np.asarray(rewards.shaping.overlong_penalty(lengths, shaping_cfg.max_response_tokens,
                                                        shaping_cfg.overlong_buffer_tokens,
                                                        shaping_cfg.overlong_penalty_factor), np.float32)
  # Only calls the executor ran count (ShapingConfig.tool_call_count): malformed or unrun <tool_call> text is free
  # to emit and must not lift a wrong answer's reward.
  shaped = np.array([rewards.shaping.shape(r.score, n_tool_calls=e.counted_calls(shaping_cfg.tool_call_count),
                                           response_tokens=e.response_len, cfg=shaping_cfg)
                     for r, e in zip(results, episodes)], np.float32)
  return Scored(score=score, acc=np.array([bool(r.acc) for r in results]), reward=shaped,
                overlong_penalty=penalty, truncated=np.array([e.stop_reason == STOP_LENGTH for e in episodes]),
                pred=[r.pred for r in results], info=[r.info for r in results], response_text=texts,
                failure=[r.failure for r in results],
                data_source=[records[e.group].data_source for e in episodes])


def informative_groups(score: np.ndarray, n: int, valid: np.ndarray | None = None) -> np.ndarray:
  """Boolean `[G]`: groups (consecutive runs of n episodes) whose outcome scores are not all equal.

  A group whose samples are all right (or all wrong) teaches nothing but dilutes the token-mean; DAPO's dynamic
  sampling drops such groups and draws more prompts instead. The outcome score decides, not the shaped reward:
  an overlong penalty alone does not make a group informative about correctness. With `valid` ([E], False for
  infrastructure failures), only valid episodes count, and a group needs two of them.
  """
  r = np.asarray(score, np.float64).reshape(-1, n)
  ok = np.ones_like(r, bool) if valid is None else np.asarray(valid, bool).reshape(-1, n)
  hi = np.where(ok, r, -np.inf).max(axis=1)
  lo = np.where(ok, r, np.inf).min(axis=1)
  return (ok.sum(axis=1) >= 2) & ~np.isclose(hi, lo)


def update_batch(collated: dict[str, np.ndarray], advantages: np.ndarray,
                 keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Token-aligned arrays for `rl.update` from `rollout.collate` output and per-episode advantages.

  `collate` lays each row out as prompt then response in `input_ids` (the response starts at `prompt_lens[b]`),
  with response-aligned masks; this places the loss mask and sampler log-probs at the same offsets.

  Args:
    collated: `collate(episodes)`.
    advantages: [E] per episode.
    keep: [E] bool, False for episodes left out of the loss (infrastructure failures): their rows get loss mask
      0 and advantage 0, so they add nothing to the loss nor to the token-mean's denominator.

  Returns:
    tokens [B, T], loss_mask [B, T], sampler_logp [B, T], advantages [B] (0 on padding and excluded rows).
  """
  tokens = collated["input_ids"]
  b, t = tokens.shape
  r = collated["response_ids"].shape[1]
  cols = collated["prompt_lens"][:, None] + np.arange(r)[None, :]  # [B, R] positions in the full row
  rows = np.broadcast_to(np.arange(b)[:, None], (b, r))
  inside = cols < t
  loss_mask = np.zeros((b, t), np.float32)
  sampler_logp = np.zeros((b, t), np.float32)
  loss_mask[rows[inside], cols[inside]] = collated["loss_mask"][inside]
  sampler_logp[rows[inside], cols[inside]] = collated["logp_raw"][inside]
  adv = np.zeros((b,), np.float32)
  adv[:len(advantages)] = advantages
  row_ok = collated["valid"].astype(np.float32)
  if keep is not None:
    row_ok[:len(keep)] *= np.asarray(keep, np.float32)
  adv *= row_ok
  loss_mask *= row_ok[:, None]
  return {"tokens": tokens, "loss_mask": loss_mask, "sampler_logp": sampler_logp, "advantages": adv}


def split_minibatches(batch: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
  """Consecutive slices of `size` rows (the last one may be shorter only if B is not a multiple of size)."""
  b = next(iter(batch.values())).shape[0]
  return [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, b, size)]


def pack_minibatch(mb: dict[str, np.ndarray], lengths: np.ndarray, *, pack_len: int,
                   micro_batch_size: int) -> dict[str, np.ndarray]:
  """Packs a mini-batch of episode rows (`update_batch` layout, one episode per row) into rows of `pack_len`
  tokens, several episodes per row, as verl's `use_dynamic_bsz` with `ppo_max_token_len_per_gpu` does.

  The packed batch keeps the mini-batch's row count B (the worst case: every episode fills a row), so the update
  compiles once whatever the episodes' lengths, and lays the rows out so that whole micro-batches stay empty
  at the end (micro-batch i holds rows i, i + B / micro_batch_size, ...; see `rl.update._to_micro`), which the
  update skips. Each episode becomes a segment (`segment_ids` from 1, positions from 0); its first token, a
  prompt token, is never trained, as packed rows require.

  Args:
    mb: tokens, loss_mask, sampler_logp [B, T] and advantages [B] of B episode rows (prompt then response).
    lengths: [B] tokens of each row's episode (0 for padding rows).
    pack_len: tokens per packed row (>= the longest episode).
    micro_batch_size: rows per micro-batch of the update (divides B).

  Returns:
    tokens, loss_mask, sampler_logp, advantages (per token), positions, segment_ids: [B, pack_len].

  Raises:
    ValueError: an episode longer than `pack_len`.
  """
  b = mb["tokens"].shape[0]
  if b % micro_batch_size:
    raise ValueError(f"pack_minibatch: {b} rows are not a multiple of micro_batch_size={micro_batch_size}")
  longest = int(np.max(lengths, initial=0))
  if longest > pack_len:
    raise ValueError(f"pack_minibatch: an episode of {longest} tokens does not fit rows of pack_len={pack_len} "
                     "(rl.pack_len must be >= rollout.max_prompt_len + rollout.max_response_len)")
  rows: list[list[int]] = []
  free: list[int] = []
  for i in sorted(np.flatnonzero(lengths > 0), key=lambda i: -lengths[i]):  # first fit, longest first
    for r, space in enumerate(free):
      if space >= lengths[i]:
        rows[r].append(i)
        free[r] -= lengths[i]
        break
    else:
      rows.append([i])
      free.append(pack_len - lengths[i])
  n_micro = b // micro_batch_size
  out = {k: np.zeros((b, pack_len), np.int32 if k in ("tokens", "positions", "segment_ids") else np.float32)
         for k in ("tokens", "loss_mask", "sampler_logp", "advantages", "positions", "segment_ids")}
  for j, ids in enumerate(rows):
    dest = j // micro_batch_size + (j % micro_batch_size) * n_micro
    start = 0
    for seg, i in enumerate(ids, start=1):
      n = int(lengths[i])
      sl = slice(start, start + n)
      out["tokens"][dest, sl] = mb["tokens"][i, :n]
      out["loss_mask"][dest, sl] = mb["loss_mask"][i, :n]
      out["sampler_logp"][dest, sl] = mb["sampler_logp"][i, :n]
      out["advantages"][dest, sl] = mb["advantages"][i]
      out["positions"][dest, sl] = np.arange(n)
      out["segment_ids"][dest, sl] = seg
      start += n
  return out


class RunStopped(RuntimeError):
  """The trainer stopped the run itself, for the reason its message names (its last checkpoint is kept)."""


@dataclasses.dataclass
class InfraTally:
  """Responses of one step whose reward could not be computed, by data source and kind (`Scored.failure`)."""

  responses: int = 0
  failures: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (source, kind) -> n
  example: str = ""

  def add(self, scored: Scored) -> None:
    self.responses += len(scored.score)
    for source, kind, info in zip(scored.data_source, scored.failure, scored.info):
      if kind:
        self.failures[(source, kind)] += 1
        self.example = self.example or info

  @property
  def count(self) -> int:
    return sum(self.failures.values())

  def metrics(self) -> dict[str, float]:
    """`reward/infra_failures` and `reward/infra_failures/<data_source>` (sources with failures)."""
    out = {"reward/infra_failures": float(self.count)}
    for (source, _), n in sorted(self.failures.items()):
      key = f"reward/infra_failures/{source}"
      out[key] = out.get(key, 0.0) + n
    return out

  def check(self, max_frac: float, step: int) -> None:
    """Raises `RunStopped` naming the causes when more than `max_frac` of the step's responses failed."""
    if not self.responses or self.count <= max_frac * self.responses:
      return
    causes = collections.Counter()
    for (_, kind), n in self.failures.items():
      causes[kind] += n
    def by_source(kind):
      return ", ".join(f"{s} x{c}" for (s, k), c in sorted(self.failures.items()) if k == kind)

    detail = "; ".join(f"{kind} x{n} ({by_source(kind)})" for kind, n in causes.most_common())
    raise RunStopped(
        f"rl: step {step}: the reward of {self.count} of {self.responses} responses "
        f"({self.count / self.responses:.1%}) could not be computed for reasons outside them, more than "
        f"rl.max_infra_failure_frac={max_frac:g}: {detail}; e.g. {self.example[:300]!r}. Stopping before the "
        "update; the checkpoints written so far are kept: fix the cause and rerun with the same workdir to resume.")
