"""Host side of one RL step between the rollout and the update: rewards, groups, and the update batch.

    scored = score_episodes(episodes, records, tokenizer=tok, executor=ex, reward_cfg=..., shaping_cfg=...)
    keep = informative_groups(scored.reward, n)                   # dynamic sampling (optional)
    batch = update_batch(collate(episodes), advantages)           # token-aligned arrays for rl.update

Scoring runs the reward functions in a thread pool: code rewards wait on the sandbox, and a crashing scorer
becomes score 0 with a message (`rewards.compute_score`), so a bad response never stops the run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
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
    response_text: the decoded response (model and tool tokens), what the scorer read.
  """

  score: np.ndarray
  acc: np.ndarray
  reward: np.ndarray
  overlong_penalty: np.ndarray
  truncated: np.ndarray
  pred: list[str]
  info: list[str]
  response_text: list[str]

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
  return tokenizer.decode(episode.response_ids.tolist(), skip_special_tokens=False)


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


def _score_local(episodes, records, *, tokenizer, executor, reward_cfg, shaping_cfg, max_workers) -> Scored:
  texts = [response_text(tokenizer, e) for e in episodes]

  def one(i: int) -> rewards.RewardResult:
    rec = records[episodes[i].group]
    return rewards.compute_score(rec.data_source, texts[i], rec.ground_truth, rec.extra_info, executor=executor,
                                 cfg=reward_cfg)

  with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
    results = list(pool.map(one, range(len(episodes))))
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
                pred=[r.pred for r in results], info=[r.info for r in results], response_text=texts)


def informative_groups(score: np.ndarray, n: int) -> np.ndarray:
  """Boolean `[G]`: groups (consecutive runs of n episodes) whose outcome scores are not all equal.

  A group whose samples are all right (or all wrong) teaches nothing but dilutes the token-mean; DAPO's dynamic
  sampling drops such groups and draws more prompts instead. The outcome score decides, not the shaped reward:
  an overlong penalty alone does not make a group informative about correctness.
  """
  r = np.asarray(score).reshape(-1, n)
  return ~np.all(np.isclose(r, r[:, :1]), axis=1)


def update_batch(collated: dict[str, np.ndarray], advantages: np.ndarray) -> dict[str, np.ndarray]:
  """Token-aligned arrays for `rl.update` from `rollout.collate` output and per-episode advantages.

  `collate` lays each row out as prompt then response in `input_ids` (the response starts at `prompt_lens[b]`),
  with response-aligned masks; this places the loss mask and sampler log-probs at the same offsets.

  Returns:
    tokens [B, T], loss_mask [B, T], sampler_logp [B, T], advantages [B] (0 on padding rows).
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
  adv *= collated["valid"]
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
