"""Single-turn generation on top of the compiled sampler (evaluation, benchmarks, parity tests).

    sampler = make_sampler(graphdef, model_cfg, SamplingConfig(end_token_ids=(im_end,)), batch=16)
    out = generate(sampler, params, prompts, key=jax.random.key(0), max_new_tokens=256)
    out.tokens[i], out.logp_raw[i], out.stop_reason[i]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import multihost
from agentrl_jax.sampling.config import StopReason, bucket, pow2_bucket
from agentrl_jax.sampling.sampler import Sampler


@dataclasses.dataclass
class GenerateOutput:
  """Per row (prompt-major: prompt p's samples are rows p*n ... p*n + n - 1).

  Attributes:
    tokens: drawn tokens of each row (the stop token included).
    logp_raw: their log-probs under the policy at temperature 1.
    logp_sample: their log-probs under the sampling distribution.
    stop_reason: `StopReason` of each row.
    prefill_tokens: prompt tokens run through the model (each prompt once, whatever n).
  """

  tokens: list[np.ndarray]
  logp_raw: list[np.ndarray]
  logp_sample: list[np.ndarray]
  stop_reason: list[StopReason]
  prefill_tokens: int


def pad_prompts(prompts: Sequence[Sequence[int]], groups: int, length: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads prompts to `[groups, length]` (extra groups empty); returns (tokens, lengths)."""
  tokens = np.zeros((groups, length), np.int32)
  lengths = np.zeros((groups,), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
    lengths[i] = len(p)
  return tokens, lengths


def generate(sampler: Sampler, params: nnx.State, prompts: Sequence[Sequence[int]], *, key: jax.Array,
             max_new_tokens: int, n: int = 1, min_prompt_bucket: int = 16) -> GenerateOutput:
  """Samples `n` continuations of every prompt (all rows at once; `len(prompts) * n <= sampler.batch`).

  Each row stops at an end or tool-end token of the sampling config or after `max_new_tokens` draws.
  """
  b = sampler.batch
  if not prompts or len(prompts) * n > b:
    raise ValueError(f"generate: {len(prompts)} prompts x n={n} must be in [1, batch={b}]")
  if any(len(p) == 0 for p in prompts):
    raise ValueError("generate: empty prompt")
  if max_new_tokens < 1:
    raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
  t = bucket(max(len(p) for p in prompts), min_prompt_bucket)
  seg_len = sampler.sampling.segment_len
  groups = min(pow2_bucket(len(prompts)), b // n)
  tokens, lengths = pad_prompts(prompts, groups, t)
  slots = np.full((groups * n,), b, np.int32)
  slots[:len(prompts) * n] = np.arange(len(prompts) * n)
  budgets = np.full((groups * n,), max_new_tokens, np.int32)
  forced = None if not sampler.n_forced else np.full((groups * n, sampler.n_forced), -1, np.int32)

  # The cache grows with the rows (decode attends over every slot of it): capacities are multiples of 64, so one
  # generate compiles at most max_new_tokens / segment_len + 1 decode shapes. After `drawn` draws a row holds
  # t + drawn - 1 tokens (its last draw is pending); a decode call writes one token per further draw.
  capacity = lambda need: max(-(-need // 64) * 64, t)
  need = lambda drawn: t + drawn - 1 + min(seg_len, max_new_tokens - drawn)
  # With Sampler.fixed_capacity the largest capacity is allocated once (attention reads each row's own length).
  state = sampler.init(capacity(t + max_new_tokens + seg_len if sampler.fixed_capacity else need(1)), key)
  state, draw = sampler.prefill_groups(n, params, state, tokens, lengths, slots, budgets, forced)
  first = multihost.to_host(draw)
  rows = len(prompts) * n
  toks = [[int(first.token[i])] for i in range(rows)]
  lr = [[float(first.logp_raw[i])] for i in range(rows)]
  ls = [[float(first.logp_sample[i])] for i in range(rows)]
  reason = [int(first.stop_reason[i]) for i in range(rows)]
  big = jnp.int32(np.iinfo(np.int32).max)
  drawn = 1
  while any(r == StopReason.RUNNING for r in reason):
    if need(drawn) > state.capacity:
      state = sampler.grow(state, capacity(need(drawn)))
    state, seg = sampler.decode(params, state, jnp.int32(seg_len), big)
    seg = multihost.to_host(seg)
    drawn += seg_len
    for i in range(rows):
      k = int(seg.num[i])
      toks[i].extend(seg.tokens[i, :k].tolist())
      lr[i].extend(seg.logp_raw[i, :k].tolist())
      ls[i].extend(seg.logp_sample[i, :k].tolist())
      reason[i] = int(seg.stop_reason[i]) if not seg.active[i] else int(StopReason.RUNNING)
  del state
  return GenerateOutput(
      tokens=[np.asarray(x, np.int32) for x in toks], logp_raw=[np.asarray(x, np.float32) for x in lr],
      logp_sample=[np.asarray(x, np.float32) for x in ls], stop_reason=[StopReason(r) for r in reason],
      prefill_tokens=int(sum(len(p) for p in prompts)))
