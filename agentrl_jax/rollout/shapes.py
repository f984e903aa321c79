"""The sampler a rollout config needs (its `SamplingConfig`, the checks of a sampler and prompts against the
config) and the shapes of the sampler calls a rollout makes: how `agent_loop.run_rollout` buckets them, and every
shape a config can reach (the programs a run compiles; `agentrl_jax.aot` compiles each of them for a TPU slice)."""

from __future__ import annotations

import dataclasses

from agentrl_jax.rollout.chat import stop_token_ids
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.sampling.config import SamplingConfig, bucket, bucket_values, pow2_bucket


def sampling_config(tokenizer, cfg: RolloutConfig, **kw) -> SamplingConfig:
  """The sampling settings `run_rollout` expects for `cfg`: the tokenizer's end tokens, and a pause at
  `</tool_call>` when one call per turn is executed (with more, turns run to `<|im_end|>`).

  Args:
    **kw: temperature, top_p, top_k, greedy.
  """
  end, tool_end = stop_token_ids(tokenizer)
  return SamplingConfig(end_token_ids=end, tool_end_token_ids=tool_end if cfg.max_calls_per_turn == 1 else (),
                        segment_len=cfg.segment_len, **kw)


def check_prompts(prompts, n, cfg: RolloutConfig, scripts, sampler) -> None:
  """ValueError unless `sampler` (a `sampling.Sampler`) was built for `cfg` and the prompts, n and teacher-forcing
  `scripts` fit it."""
  if n < 1 or n > cfg.batch_size:
    raise ValueError(f"run_rollout: n must be in [1, batch_size={cfg.batch_size}], got {n}")
  if sampler.batch != cfg.batch_size:
    raise ValueError(f"run_rollout: sampler batch {sampler.batch} != RolloutConfig.batch_size {cfg.batch_size}")
  if sampler.sampling.segment_len != cfg.segment_len:
    raise ValueError(f"run_rollout: sampler segment_len {sampler.sampling.segment_len} != RolloutConfig.segment_len "
                     f"{cfg.segment_len}")
  if cfg.max_calls_per_turn > 1 and sampler.sampling.tool_end_token_ids:
    raise ValueError("run_rollout: RolloutConfig.max_calls_per_turn > 1 needs a sampler that does not stop at "
                     "</tool_call> (build its SamplingConfig with rollout.sampling_config)")
  for i, p in enumerate(prompts):
    if len(p) == 0:
      raise ValueError(f"run_rollout: prompt {i} is empty")
    if len(p) > cfg.max_prompt_len:
      raise ValueError(f"run_rollout: prompt {i} has {len(p)} tokens > RolloutConfig.max_prompt_len "
                       f"{cfg.max_prompt_len}")
  if scripts is not None:
    if len(scripts) != len(prompts) * n:
      raise ValueError(f"run_rollout: {len(scripts)} scripts for {len(prompts) * n} episodes")
    if not sampler.n_forced:
      raise ValueError("run_rollout: scripts need a sampler built with n_forced > 0")
    longest = max((len(t) for s in scripts for t in s), default=0)
    if longest > sampler.n_forced:
      raise ValueError(f"run_rollout: a script turn has {longest} tokens > the sampler's n_forced {sampler.n_forced}")


def prefill_groups(g: int, n: int, cfg: RolloutConfig, *, refill: bool = False) -> int:
  """Prompt groups one prefill call computes when g groups start: g rounded up to a power of two (or
  `groups_per_prefill`'s, with `pad_prefill_groups`), at most what the batch's row slots hold.

  `refill` (a stream's loop, whose slots refill between decode segments): a start of at most half a full call's
  groups runs as that many one-group calls (returns 1), a larger one as one full call. A stream starts every
  count from one group to a full batch (in the main job at staleness 1: 1, 2, 3, 5, 7, 12-16 groups), so the
  synchronous rule would compile a program per power of two (and, with `pad_prefill_groups`, pad one group to a
  full call); this one compiles two per prompt bucket and pads a call at most 2x."""
  top = max(1, pow2_bucket(cfg.groups_per_prefill))
  while top * n > cfg.batch_size and top > 1:
    top //= 2
  if refill:
    return 1 if 2 * g <= top else max(top, g)
  gp = top if cfg.pad_prefill_groups else min(pow2_bucket(g), top)
  return max(gp, g)


def extend_calls(chunk_lens: dict[int, int], rows: int, chunk_len: int, batch: int) -> list[list[tuple[int, int]]]:
  """The extend calls that append chunks of `chunk_lens[slot]` tokens to their rows' caches: each call a list of
  `(slot, piece)`, piece j being tokens `[j * chunk_len, (j + 1) * chunk_len)` of its slot's chunk. Calls of
  `rows < batch` rows take every row's first piece, then every second piece, ..., `rows` at a time; whole-batch
  calls (`rows == batch`, in place) append piece j of every row that has one, at the row's own index."""
  pieces = [(slot, j) for slot in sorted(chunk_lens) for j in range(-(-chunk_lens[slot] // chunk_len))]
  pieces.sort(key=lambda p: p[1])  # all first pieces, then all second pieces, ...
  if rows == batch:
    return [[p for p in pieces if p[1] == j] for j in range(pieces[-1][1] + 1)] if pieces else []
  return [pieces[lo:lo + rows] for lo in range(0, len(pieces), rows)]


def max_capacity(cfg: RolloutConfig) -> int:
  """The largest KV cache capacity a rollout uses: the longest prompt's bucket, the response, a segment."""
  return bucket(cfg.max_prompt_len, cfg.prompt_bucket_min) + cfg.max_response_len + cfg.segment_len + 1


@dataclasses.dataclass(frozen=True)
class RolloutShapes:
  """The shapes of every sampler program `run_rollout` can call for a config (what a run compiles).

  Attributes:
    capacities: KV cache capacities the rollout can reach (the cache's length axis).
    prefill: `(prompt groups, prompt bucket, capacity)` of each prefill call shape.
    extend: `(rows, chunk tokens, capacity)` of each extend call shape.
    decode: capacities of the decode calls.
    grow: `(from, to)` capacities of each cache growth.
  """

  capacities: tuple[int, ...]
  prefill: tuple[tuple[int, int, int], ...]
  extend: tuple[tuple[int, int, int], ...]
  decode: tuple[int, ...]
  grow: tuple[tuple[int, int], ...]


def rollout_shapes(cfg: RolloutConfig, n: int, *, fixed_capacity: bool, refill: bool = False) -> RolloutShapes:
  """Every sampler call shape `run_rollout` can reach with `cfg` and n samples per prompt (the bucket rules of
  `run_rollout`'s `start_groups`, `resume_ready` and `ensure_capacity`): the programs a run compiles, for the
  ahead-of-time pre-flight (`agentrl_jax.aot`). `fixed_capacity`: `Sampler.fixed_capacity`; `refill`: the
  shapes of an asynchronous run's rollout stream (`prefill_groups`' refill rule) as well."""
  max_cap = max_capacity(cfg)
  caps = (max_cap,) if fixed_capacity else tuple(
      c for c in bucket_values(cfg.cache_bucket_min, max_cap))
  starts = range(1, min(cfg.batch_size // n, cfg.groups_per_prefill) + 1)
  groups = sorted({prefill_groups(g, n, cfg) for g in starts}
                  | ({prefill_groups(g, n, cfg, refill=True) for g in starts} if refill else set()))
  prompts = bucket_values(cfg.prompt_bucket_min, bucket(cfg.max_prompt_len, cfg.prompt_bucket_min))
  prefill = tuple((gp, t, c) for gp in groups for t in prompts for c in caps if c >= t)
  rows = cfg.rows_per_extend
  extend = tuple((rows, cfg.chunk_len, c) for c in caps)
  # The cache grows by what one call appends at most: a segment, or a turn's tool responses (a token holds at
  # least one character; the chat template adds a few dozen tokens per response).
  jump = max(cfg.segment_len, cfg.max_calls_per_turn * (cfg.max_tool_output_chars + 64)) + 1
  grow = tuple(sorted({(c, min(bucket(need, cfg.cache_bucket_min), max_cap))
                       for c in caps[:-1] for need in range(c + 1, c + jump + 1)}))
  return RolloutShapes(capacities=caps, prefill=prefill, extend=extend, decode=caps, grow=grow)
