"""The multi-turn agent loop: decode, pause at `</tool_call>`, run the tool, extend the SAME cache, resume.

    sampler = make_sampler(graphdef, model_cfg, sampling_cfg, batch=cfg.batch_size)
    episodes, stats = run_rollout(sampler, params, prompt_ids, n=8, tokenizer=tok, executor=ex, cfg=cfg,
                                  key=jax.random.fold_in(sample_key, step))
    batch = collate(episodes)

Host side of the rollout. B row slots decode together in compiled segments (`Sampler.decode`); between
segments the host reads the drawn tokens, parses finished turns and submits tool code to the executor
(futures). By default the batch decodes until every row has stopped, then all tools run at once; with
`cfg.overlap_tools` the other rows keep decoding while tools run (measured slower at short tool latencies, see
RolloutConfig). Rows whose tools returned are resumed with batched `extend` calls that append
`[pending token] + tool-response tokens` to their caches (loss mask 0): the earlier context is never prefilled
again. A finished episode frees its slot, and the next prompt group is prefilled there (one prefill per prompt,
shared by its n samples).

Several processes (one per host): the sampler is one SPMD program over the global mesh, each process's devices
holding its rows (slot blocks of B / processes); every process reads the drawn tokens of all rows (gathered) and
makes the same scheduling decisions, runs the tool calls of its own rows in its own sandbox, and receives the
others' results (gathered) before the batch resumes. Pause mode only: overlapping tools would make the resume
order depend on each host's tool timing.

Nothing raises out of the loop for bad model output: malformed calls are answered with an error message and
counted; executor futures never raise (`tools.Executor`); a failing future is reported as a sandbox error.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import multihost
from agentrl_jax.rollout import episode as episode_lib
from agentrl_jax.rollout.chat import ToolResponseRenderer, stop_token_ids
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.episode import CallInfo, Episode, TurnInfo
from agentrl_jax.rollout.parser import ToolCall, parse_tool_calls
from agentrl_jax.sampling import sampler as sampler_lib
from agentrl_jax.rollout.shapes import max_capacity, prefill_groups
from agentrl_jax.sampling.config import SamplingConfig, StopReason, bucket
from agentrl_jax.sampling.sampler import Sampler
from agentrl_jax.tools.base import ExecResult, Executor
from agentrl_jax.tools.code_interpreter import format_result, prepare_code, truncate_middle

log = logging.getLogger(__name__)
_NO_LIMIT = np.iinfo(np.int32).max


@dataclasses.dataclass
class RolloutStats:
  """Counters of one rollout.

  Attributes:
    prefilled_tokens: non-model tokens written to the cache: each prompt once (shared by its n samples) plus
      every tool-response token. Equal to `prompt_tokens + tool_tokens` when nothing is prefilled twice.
    prompt_tokens: tokens of the distinct prompts.
    tool_tokens: tool-response tokens appended to responses.
    generated_tokens: tokens drawn by the model.
    padded_prefill_tokens: tokens computed by prefill/extend calls including bucket padding and idle rows.
    decode_calls / decode_steps / extend_calls / prefill_calls / grow_calls: device calls made.
    wall_s: wall time; device_wait_s: host blocked on device results; tool_wait_s: host blocked on tools only.
    traces: sampler functions traced (compiled) during the rollout.
  """

  prefilled_tokens: int = 0
  prompt_tokens: int = 0
  tool_tokens: int = 0
  generated_tokens: int = 0
  padded_prefill_tokens: int = 0
  decode_calls: int = 0
  decode_steps: int = 0
  extend_calls: int = 0
  prefill_calls: int = 0
  grow_calls: int = 0
  wall_s: float = 0.0
  device_wait_s: float = 0.0
  tool_wait_s: float = 0.0
  traces: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Row:
  """Host bookkeeping of one occupied slot."""

  ep: int
  group: int
  sample: int
  prompt: np.ndarray
  cache_len: int
  resp: list = dataclasses.field(default_factory=list)
  mask: list = dataclasses.field(default_factory=list)
  lp_raw: list = dataclasses.field(default_factory=list)
  lp_sample: list = dataclasses.field(default_factory=list)
  turns: list = dataclasses.field(default_factory=list)
  turn_start: int = 0
  status: str = "active"  # active | waiting | ready
  calls: list = dataclasses.field(default_factory=list)  # [(CallInfo, Future | None)] of the current turn
  n_calls: int = 0
  n_failed: int = 0
  n_malformed: int = 0

  def add(self, token, lr, ls):
    self.resp.append(int(token))
    self.mask.append(1)
    self.lp_raw.append(float(lr))
    self.lp_sample.append(float(ls))


def sampling_config(tokenizer, cfg: RolloutConfig, **kw) -> SamplingConfig:
  """The sampling settings `run_rollout` expects for `cfg`: the tokenizer's end tokens, and a pause at
  `</tool_call>` when one call per turn is executed (with more, turns run to `<|im_end|>`).

  Args:
    **kw: temperature, top_p, top_k, greedy.
  """
  end, tool_end = stop_token_ids(tokenizer)
  return SamplingConfig(end_token_ids=end, tool_end_token_ids=tool_end if cfg.max_calls_per_turn == 1 else (),
                        segment_len=cfg.segment_len, **kw)


def _check_prompts(prompts, n, cfg: RolloutConfig, scripts, sampler: Sampler):
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


def _future_result(fut: concurrent.futures.Future) -> ExecResult:
  """A finished call's result; an executor future that raised becomes a sandbox error (never raises)."""
  try:
    return fut.result()
  except Exception as e:  # pylint: disable=broad-except
    return ExecResult("sandbox_error", stderr=f"[sandbox] executor failed: {type(e).__name__}: {e}")


def _result_text(result: ExecResult | None, max_chars: int) -> tuple[str, str, float]:
  """(status, text the model reads, wall seconds) of one execution."""
  if result is None:
    return "sandbox_error", "Tool error: no result.", 0.0
  return result.status, format_result(result, max_chars), result.wall_s


def run_rollout(
    sampler: Sampler,
    params: nnx.State,
    prompts: Sequence[Sequence[int]],
    *,
    n: int,
    tokenizer,
    executor: Executor,
    cfg: RolloutConfig,
    key: jax.Array,
    scripts: Sequence[Sequence[Sequence[int]]] | None = None,
    on_episode: Callable[[Episode], None] | None = None,
) -> tuple[list[Episode], RolloutStats]:
  """Runs n episodes per prompt to completion.

  Args:
    sampler: compiled sampler (`make_sampler(..., batch=cfg.batch_size)`, segment_len = cfg.segment_len, and the
      tokenizer's stop tokens in its SamplingConfig, see `chat.stop_token_ids`).
    params: the policy's current parameters (`nnx.State`), read directly by the compiled functions.
    prompts: token ids of each prompt, chat-rendered up to the assistant header (tools advertised).
    n: samples per prompt (a GRPO group); they share one prefill.
    tokenizer: the HF tokenizer (decodes turns, encodes tool responses).
    executor: runs tool code (`tools.make_executor(...)` or any object with `submit(code) -> Future`).
    cfg: limits and scheduling.
    key: PRNG key of this rollout.
    scripts: teacher forcing (tests, benchmarks): per episode (index group * n + sample), per turn, the tokens
      the model is made to emit at the start of that turn (it samples freely afterwards).
    on_episode: called with each episode as it finishes (progress bars).

  Returns:
    `(episodes, stats)`: episodes ordered by (group, sample).
  """
  t_start = time.perf_counter()
  _check_prompts(prompts, n, cfg, scripts, sampler)
  procs, me = jax.process_count(), jax.process_index()
  if procs > 1 and cfg.overlap_tools:
    raise ValueError("run_rollout: overlap_tools needs one process; with several, every process must resume "
                     "the same rows at the same time (set rollout.overlap_tools=False)")
  owner = lambda slot: slot * procs // b  # noqa: E731  # the process whose devices hold the row (batch blocks)
  traces_before = dict(sampler_lib.TRACE_COUNTS)
  stats = RolloutStats()
  renderer = ToolResponseRenderer(tokenizer)
  b, seg = cfg.batch_size, cfg.segment_len
  tool_end_ids = sampler.sampling.tool_end_token_ids
  resumable = set(tool_end_ids) | ({renderer.im_end} if renderer.im_end is not None else set())
  f_len = sampler.n_forced
  max_cap = max_capacity(cfg)
  # The cache grows in buckets as rows get longer (attention over the xla path reads every slot), or is
  # allocated at its largest once where attention reads each row's own length (Sampler.fixed_capacity). It is
  # made by the first `ensure_capacity` (the first prefill's), at the bucket that call needs, so no grow program
  # is built and run before the first token.
  state = None
  rows: list[_Row | None] = [None] * b
  queue = collections.deque(range(len(prompts)))
  done: dict[int, Episode] = {}
  # (slots, rows of the draw they read, Draw on device): processed at the next sync. Rows are picked on the host
  # after the fetch; indexing the device array would compile a gather per distinct row count.
  pending_draws: list[tuple[list[int], list[int], object]] = []

  def forced_row(ep: int, turn: int) -> np.ndarray:
    out = np.full((f_len,), -1, np.int32)
    if scripts is not None and turn < len(scripts[ep]):
      toks = scripts[ep][turn]
      out[:len(toks)] = toks
    return out

  def ensure_capacity(need: int):
    nonlocal state
    if state is not None and need <= state.capacity:
      return
    cap = max_cap if sampler.fixed_capacity else min(bucket(need, cfg.cache_bucket_min), max_cap)
    if cap < need:
      raise AssertionError(f"cache capacity {cap} < {need} tokens")  # budgets make this unreachable
    if state is None:
      state = sampler.init(cap, key)
    else:
      state = sampler.grow(state, cap)
      stats.grow_calls += 1

  def finish(slot: int, reason: str):
    r = rows[slot]
    ids = np.concatenate([r.prompt, np.asarray(r.resp, np.int32)])
    done[r.ep] = Episode(
        group=r.group, sample=r.sample, prompt_ids=r.prompt, response_ids=np.asarray(r.resp, np.int32),
        loss_mask=np.asarray(r.mask, np.int32), logp_raw=np.asarray(r.lp_raw, np.float32),
        logp_sample=np.asarray(r.lp_sample, np.float32), num_tool_calls=r.n_calls, num_failed_calls=r.n_failed,
        num_malformed_calls=r.n_malformed, stop_reason=reason,
        transcript=tokenizer.decode(ids.tolist(), skip_special_tokens=False), turns=r.turns)
    rows[slot] = None
    if on_episode is not None:
      on_episode(done[r.ep])

  def on_stop(slot: int, reason: int):
    """A row stopped drawing: close its turn and either finish the episode or start its tool calls."""
    r = rows[slot]
    stop = {StopReason.END: "end", StopReason.TOOL: "tool", StopReason.LENGTH: "length"}[StopReason(reason)]
    turn = TurnInfo(start=r.turn_start, num_generated=len(r.resp) - r.turn_start, stop=stop)
    r.turns.append(turn)
    if reason == StopReason.LENGTH or len(r.resp) >= cfg.max_response_len:
      return finish(slot, episode_lib.STOP_LENGTH)
    pending = r.resp[-1]
    calls: list[ToolCall] = []
    if pending in resumable:
      text = tokenizer.decode(r.resp[r.turn_start:], skip_special_tokens=False)
      calls = parse_tool_calls(text, cfg.tool_names)
    if not calls:
      return finish(slot, episode_lib.STOP_END)
    if len(r.turns) >= cfg.max_turns:
      turn.calls = [CallInfo(c.name, c.code, "not_run", "") for c in calls]
      return finish(slot, episode_lib.STOP_TURNS)
    r.n_calls += len(calls)
    malformed = [c for c in calls if not c.ok]
    r.n_malformed += len(malformed)
    if malformed and cfg.end_on_failed_call:
      r.n_failed += len(malformed)
      turn.calls = [CallInfo(c.name, c.code, "not_run" if c.ok else "malformed", c.error or "") for c in calls]
      return finish(slot, episode_lib.STOP_FAILED_CALL)
    r.calls = []
    executed = 0
    for c in calls:
      if not c.ok:
        r.calls.append((CallInfo(c.name, "", "malformed", truncate_middle(c.error, cfg.max_tool_output_chars)), None))
      elif executed >= cfg.max_calls_per_turn:
        msg = f"Error: not executed: at most {cfg.max_calls_per_turn} tool call(s) per turn."
        r.calls.append((CallInfo(c.name, c.code, "skipped", msg), None))
      elif owner(slot) != me:  # another host runs it; its result arrives in exchange_results
        executed += 1
        r.calls.append((CallInfo(c.name, c.code, "running", ""), concurrent.futures.Future()))
      else:
        executed += 1
        try:
          future = executor.submit(prepare_code(c.code))
        except Exception as e:  # pylint: disable=broad-except  # a closed/broken executor: tell the model
          future = concurrent.futures.Future()
          future.set_result(ExecResult("sandbox_error", stderr=f"[sandbox] submit failed: {type(e).__name__}: {e}"))
        r.calls.append((CallInfo(c.name, c.code, "running", ""), future))
    r.status = "waiting"

  def take_draw(slots: list[int], positions: list[int], draw):
    for i, slot in zip(positions, slots):
      r = rows[slot]
      r.add(draw.token[i], draw.logp_raw[i], draw.logp_sample[i])
      stats.generated_tokens += 1
      if draw.stop_reason[i] != StopReason.RUNNING:
        on_stop(slot, int(draw.stop_reason[i]))

  def sync_draws():
    nonlocal pending_draws
    if pending_draws:
      t0 = time.perf_counter()
      fetched = multihost.to_host([d for _, _, d in pending_draws])
      stats.device_wait_s += time.perf_counter() - t0
      for (slots, positions, _), d in zip(pending_draws, fetched):
        take_draw(slots, positions, d)
      pending_draws = []

  def start_groups():
    nonlocal state
    free = [i for i, r in enumerate(rows) if r is None]
    g = min(len(free) // n, len(queue), cfg.groups_per_prefill)
    if g == 0:
      return
    groups = [queue.popleft() for _ in range(g)]
    gp = prefill_groups(g, n, cfg)
    t = bucket(max(len(prompts[i]) for i in groups), cfg.prompt_bucket_min)
    tokens = np.zeros((gp, t), np.int32)
    lengths = np.zeros((gp,), np.int32)
    slots = np.full((gp * n,), b, np.int32)
    budgets = np.full((gp * n,), cfg.max_response_len, np.int32)
    forced = np.full((gp * n, f_len), -1, np.int32) if f_len else None
    used = []
    for j, gi in enumerate(groups):
      p = np.asarray(prompts[gi], np.int32)
      tokens[j, :len(p)] = p
      lengths[j] = len(p)
      stats.prompt_tokens += len(p)
      stats.prefilled_tokens += len(p)
      for s in range(n):
        slot = free[j * n + s]
        slots[j * n + s] = slot
        ep = gi * n + s
        rows[slot] = _Row(ep=ep, group=gi, sample=s, prompt=p, cache_len=len(p))
        used.append(slot)
        if forced is not None:
          forced[j * n + s] = forced_row(ep, 0)
    # The prompt bucket, and a segment past the longest prompt: the decode call that follows needs that much.
    ensure_capacity(max(t, int(lengths.max()) + seg))
    state, draw = sampler.prefill_groups(n, params, state, tokens, lengths, slots, budgets, forced)
    stats.prefill_calls += 1
    stats.padded_prefill_tokens += gp * t
    pending_draws.append((used, list(range(len(used))), draw))

  def resume_ready(slots: list[int]):
    """Builds tool-response chunks for rows whose calls finished, and extends their caches in one call."""
    nonlocal state
    chunks: dict[int, list[int]] = {}
    for slot in slots:
      r = rows[slot]
      contents = []
      turn = r.turns[-1]
      for info, fut in r.calls:
        if fut is not None:
          info.status, info.output, info.wall_s = _result_text(_future_result(fut), cfg.max_tool_output_chars)
        if info.failed:
          r.n_failed += 1
        contents.append(info.output)
        turn.calls.append(info)
      r.calls = []
      chunk = renderer.chunk(r.resp[-1], contents)
      k = len(chunk) - 1  # tool-response tokens (the pending token was drawn by the model)
      if len(r.resp) + k >= cfg.max_response_len:
        finish(slot, episode_lib.STOP_LENGTH)
        continue
      r.resp.extend(chunk[1:])
      r.mask.extend([0] * k)
      r.lp_raw.extend([0.0] * k)
      r.lp_sample.extend([0.0] * k)
      turn.num_tool_tokens = k
      r.turn_start = len(r.resp)
      stats.tool_tokens += k
      stats.prefilled_tokens += k
      chunks[slot] = chunk
    if not chunks:
      return
    order = sorted(chunks)
    for slot in order:
      row = rows[slot]
      row.cache_len += len(chunks[slot])
      row.status = "active"
    ensure_capacity(max(rows[s].cache_len for s in order) + 1)
    # Fixed [R, T] calls (R = extend_rows, T = chunk_len): extend compiles once per cache capacity, whatever the
    # number of resuming rows and the lengths of their tool responses. A longer chunk takes several calls.
    r, t = cfg.rows_per_extend, cfg.chunk_len
    pieces = [(slot, j) for slot in order for j in range(-(-len(chunks[slot]) // t))]
    pieces.sort(key=lambda p: p[1])  # all first pieces, then all second pieces, ...
    if r == b:  # whole-batch calls (in place): call j appends every row's piece j, at the row's own index
      calls = [[p for p in pieces if p[1] == j] for j in range(pieces[-1][1] + 1)] if pieces else []
    else:
      calls = [pieces[lo:lo + r] for lo in range(0, len(pieces), r)]
    for call in calls:
      rows_idx = np.arange(b, dtype=np.int32) if r == b else np.full((r,), b, np.int32)
      tokens = np.zeros((r, t), np.int32)
      lengths = np.zeros((r,), np.int32)
      final = np.zeros((r,), np.bool_)
      budgets = np.zeros((r,), np.int32)
      forced = np.full((r, f_len), -1, np.int32) if f_len else None
      drew = []
      for i, (slot, j) in enumerate(call):
        c, row = chunks[slot][j * t:(j + 1) * t], rows[slot]
        i = slot if r == b else i
        rows_idx[i] = slot
        tokens[i, :len(c)] = c
        lengths[i] = len(c)
        final[i] = (j + 1) * t >= len(chunks[slot])
        if final[i]:
          drew.append((i, slot))
          budgets[i] = cfg.max_response_len - len(row.resp)
          if forced is not None:
            forced[i] = forced_row(row.ep, len(row.turns))
      state, draw = sampler.extend(params, state, rows_idx, tokens, lengths, final, budgets, forced)
      stats.extend_calls += 1
      stats.padded_prefill_tokens += r * t
      if drew:
        pending_draws.append(([s for _, s in drew], [i for i, _ in drew], draw))

  def waiting_slots():
    return [i for i, r in enumerate(rows) if r is not None and r.status == "waiting"]

  def ready_slots():
    return [i for i in waiting_slots() if all(f is None or f.done() for _, f in rows[i].calls)]

  def exchange_results():
    """Several processes: every process's results of its own rows' calls, set on the others' placeholders."""
    mine = {}
    for slot in waiting_slots():
      if owner(slot) == me:
        for j, (_, fut) in enumerate(rows[slot].calls):
          if fut is not None:
            mine[(slot, j)] = _future_result(fut)
    for part in multihost.allgather_objects(mine):
      for (slot, j), res in part.items():
        fut = rows[slot].calls[j][1]
        if not fut.done():
          fut.set_result(res)

  def wait_tools(all_of: bool):
    t0 = time.perf_counter()
    futs = [f for i in waiting_slots() if owner(i) == me for _, f in rows[i].calls if f is not None]
    if futs:
      concurrent.futures.wait(futs, return_when=concurrent.futures.ALL_COMPLETED if all_of
                              else concurrent.futures.FIRST_COMPLETED)
    if procs > 1:
      exchange_results()
    stats.tool_wait_s += time.perf_counter() - t0

  max_steps = jnp.int32(seg)
  min_stops = jnp.int32(cfg.min_tool_stops if cfg.overlap_tools else _NO_LIMIT)
  while queue or any(r is not None for r in rows):
    active = [i for i, r in enumerate(rows) if r is not None and r.status == "active"]
    if cfg.overlap_tools or not active:
      if not cfg.overlap_tools and waiting_slots():
        wait_tools(all_of=True)  # pause mode: the whole batch waits for every tool call
      ready = ready_slots()
      if ready and (len(ready) >= cfg.min_resume_rows or not active or not cfg.overlap_tools):
        resume_ready(ready)
      if queue:
        start_groups()
      # Rows just resumed/started count as active: a row whose first draw stopped it is inactive on device
      # and draws nothing in the decode; its draw is processed (before the segment) at the next sync.
      active = [i for i, r in enumerate(rows) if r is not None and r.status == "active"]
    if active:
      ensure_capacity(max(rows[i].cache_len + seg for i in active))
      state, segment = sampler.decode(params, state, max_steps, min_stops)
      stats.decode_calls += 1
      pending_draws.append(([], [], segment))
      t0 = time.perf_counter()
      fetched = multihost.to_host([d for _, _, d in pending_draws])
      stats.device_wait_s += time.perf_counter() - t0
      for (slots, positions, _), d in zip(pending_draws[:-1], fetched[:-1]):
        take_draw(slots, positions, d)
      pending_draws = []
      segment = fetched[-1]
      stats.decode_steps = int(segment.steps)
      for i in active:
        r = rows[i]
        if r is None or r.status != "active":
          continue
        k = int(segment.num[i])
        for j in range(k):
          r.add(segment.tokens[i, j], segment.logp_raw[i, j], segment.logp_sample[i, j])
        stats.generated_tokens += k
        r.cache_len = int(segment.lengths[i])
        if not segment.active[i]:
          on_stop(i, int(segment.stop_reason[i]))
    elif pending_draws:
      sync_draws()
    elif waiting_slots() and not ready_slots():
      wait_tools(all_of=not cfg.overlap_tools)
  del state
  stats.wall_s = time.perf_counter() - t_start
  stats.traces = {k: v - traces_before.get(k, 0) for k, v in sampler_lib.TRACE_COUNTS.items()
                  if v - traces_before.get(k, 0)}
  return [done[i] for i in sorted(done)], stats

