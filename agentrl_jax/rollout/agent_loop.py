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
import logging
import time
from collections.abc import Callable, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import multihost
from agentrl_jax.rollout import episode as episode_lib
from agentrl_jax.rollout import rows as rows_lib, shapes
from agentrl_jax.rollout.chat import ToolResponseRenderer
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.episode import Episode
from agentrl_jax.rollout.rows import RolloutStats
from agentrl_jax.sampling import sampler as sampler_lib
from agentrl_jax.sampling.config import StopReason, bucket
from agentrl_jax.sampling.sampler import Sampler
from agentrl_jax.tools.base import Executor

log = logging.getLogger(__name__)
_NO_LIMIT = np.iinfo(np.int32).max


class AgentLoop:
  """The host side of a rollout as a resumable stream of B row slots.

  `run_rollout` drives one to completion for a fixed set of prompts; the asynchronous RL trainer keeps one alive
  across policy updates (`agentrl_jax/rl/stream.py`): it adds prompt groups as it admits them, calls `step` with
  the sampler's current params and their policy version, and collects groups as they finish. Every drawn token
  is stamped with the version of the params of the call that drew it (`Episode.versions`), so an episode whose
  weights changed mid-way (a partial rollout) says which policy drew each token.

      loop = AgentLoop(sampler, n=8, tokenizer=tok, executor=ex, cfg=cfg, key=key)
      loop.add(prompt_ids, groups=[0, 1, 2])
      while loop.busy:
        loop.step(params, version=v)
        for group, episodes in loop.pop_finished_groups(): ...

  Scheduling decisions depend only on what the host has read back (tokens, stop reasons, tool results), never on
  clocks (pause mode), so a run is a deterministic function of its inputs and the sequence of calls.

  `scripts` (teacher forcing, as in `run_rollout`) may also be a function `episode -> turns` (episode
  `group * n + sample`) for a stream whose groups are not known in advance. `refill`: in pause mode, queued groups
  start in free slots between decode segments instead of waiting for every row to pause (a stream's slots stay
  full; `run_rollout` keeps the batch's pause points as the only start points). `record_tool_waits`: each wait for
  tools goes into `tool_wait_spans` as its (start, end) `time.perf_counter()`.
  """

  def __init__(self, sampler: Sampler, *, n: int, tokenizer, executor: Executor, cfg: RolloutConfig,
               key: jax.Array, scripts: Sequence[Sequence[Sequence[int]]] | Callable | None = None,
               on_episode: Callable[[Episode], None] | None = None, refill: bool = False,
               record_tool_waits: bool = False):
    shapes.check_prompts([], n, cfg, None, sampler)
    self.procs, self.me = jax.process_count(), jax.process_index()
    if self.procs > 1 and cfg.overlap_tools:
      raise ValueError("run_rollout: overlap_tools needs one process; with several, every process must resume "
                       "the same rows at the same time (set rollout.overlap_tools=False)")
    self.sampler, self.n, self.tokenizer, self.executor, self.cfg = sampler, n, tokenizer, executor, cfg
    self.scripts, self.on_episode, self.refill = scripts, on_episode, refill
    self.stats = RolloutStats()
    self.renderer = ToolResponseRenderer(tokenizer)
    self.b, self.seg = cfg.batch_size, cfg.segment_len
    self.resumable = set(sampler.sampling.tool_end_token_ids) | (
        {self.renderer.im_end} if self.renderer.im_end is not None else set())
    self.f_len = sampler.n_forced
    self.max_cap = shapes.max_capacity(cfg)
    self.key = key
    # The cache grows in buckets as rows get longer (attention over the xla path reads every slot), or is
    # allocated at its largest once where attention reads each row's own length (Sampler.fixed_capacity). It is
    # made by the first `ensure_capacity` (the first prefill's), at the bucket that call needs, so no grow program
    # is built and run before the first token.
    self.state = None
    self.rows: list[rows_lib.Row | None] = [None] * self.b
    self.prompts: dict[int, np.ndarray] = {}
    self.queue: collections.deque[int] = collections.deque()
    self.done: dict[int, Episode] = {}
    # (slots, rows of the draw they read, Draw on device, policy version): processed at the next sync. Rows are
    # picked on the host after the fetch; indexing the device array would compile a gather per distinct row count.
    self.pending_draws: list[tuple[list[int], list[int], object, int]] = []
    self.version = 0
    self._max_steps = jnp.int32(self.seg)
    self._min_stops = jnp.int32(cfg.min_tool_stops if cfg.overlap_tools else _NO_LIMIT)
    self._t_start = time.perf_counter()
    self._traces_before = dict(sampler_lib.TRACE_COUNTS)
    # Each wait for tools as its (start, end), with `record_tool_waits` (a stream subtracts them from the time an
    # update blocked it).
    self.tool_wait_spans: list[tuple[float, float]] | None = [] if record_tool_waits else None

  # ------------------------------------------------------------------------------------------------ public API
  def add(self, prompts: Sequence[Sequence[int]], groups: Sequence[int] | None = None) -> None:
    """Queues prompt groups (n episodes each) to start as row slots free. `groups`: their ids (default the
    next free ones from 0); episode `group * n + sample` is the key of `done`."""
    shapes.check_prompts(prompts, self.n, self.cfg, None, self.sampler)
    if groups is None:
      start = max(self.prompts, default=-1) + 1
      groups = range(start, start + len(prompts))
    for g, p in zip(groups, prompts, strict=True):
      if g in self.prompts:
        raise ValueError(f"AgentLoop.add: group {g} was already added")
      self.prompts[g] = np.asarray(p, np.int32)
      self.queue.append(g)

  @property
  def busy(self) -> bool:
    """Groups are queued or rows are occupied."""
    return bool(self.queue) or any(r is not None for r in self.rows)

  @property
  def occupied(self) -> int:
    """Row slots holding an episode (decoding, waiting for tools or ready to resume)."""
    return sum(r is not None for r in self.rows)

  def in_flight_groups(self) -> list[int]:
    """Groups with an episode in a row slot, oldest first."""
    return sorted({r.group for r in self.rows if r is not None})

  def pop_finished_groups(self) -> list[tuple[int, list[Episode]]]:
    """Groups whose n episodes have all finished, as `(group, episodes by sample)`, removed from `done`."""
    out = []
    for g in sorted({ep // self.n for ep in self.done}):
      eps = [self.done.get(g * self.n + s) for s in range(self.n)]
      if all(e is not None for e in eps):
        for s in range(self.n):
          del self.done[g * self.n + s]
        del self.prompts[g]
        out.append((g, eps))
    return out

  def abort(self, key: jax.Array) -> list[int]:
    """Drops every queued and in-flight group (their partial episodes are discarded; tool calls still running
    are ignored) and frees the sampler state; the next prefill starts a fresh cache drawn from `key`.

    Returns:
      The dropped groups (in flight, then queued, each oldest first); finished episodes stay in `done`.
    """
    in_flight = self.in_flight_groups()
    dropped = in_flight + [g for g in self.queue if g not in in_flight]
    for g in dropped:
      for s in range(self.n):
        self.done.pop(g * self.n + s, None)
      self.prompts.pop(g, None)
    self.rows = [None] * self.b
    self.queue.clear()
    self.pending_draws = []
    self.state = None
    self.key = key
    return dropped

  def recompute(self, params: nnx.State) -> int:
    """Rebuilds the KV cache of every row in flight under `params` (AReaL's interruptible rollouts: after a
    weight update the context so far is recomputed by the new policy instead of continuing on a cache the old
    one wrote). Tokens already drawn keep their versions and log-probs (their behaviour policy drew them).

    Returns:
      Tokens recomputed.
    """
    self._sync_draws()  # a draw in flight belongs to its row's context
    rows = [i for i, r in enumerate(self.rows) if r is not None]
    if not rows or self.state is None:
      return 0
    self.state = self.sampler.reset_rows(self.state, np.asarray(rows + [self.b] * (self.b - len(rows)), np.int32))
    # The cache holds the prompt and every response token but the row's pending one (the last drawn, which
    # enters the cache with the next decode step or as the first token of the next tool chunk).
    chunks = {i: np.concatenate([self.rows[i].prompt, np.asarray(self.rows[i].resp[:-1], np.int32)]).tolist()
              for i in rows}
    self._extend_chunks(params, chunks, draw=False)
    return sum(len(c) for c in chunks.values())

  def step(self, params: nnx.State, version: int = 0) -> None:
    """One scheduling round: wait for / resume tool calls, start queued groups in free slots, decode one
    segment of the active rows (or sync outstanding draws), all with `params` of policy `version`."""
    self.version = version
    rows, cfg = self.rows, self.cfg
    active = [i for i, r in enumerate(rows) if r is not None and r.status == "active"]
    if cfg.overlap_tools or not active:
      if not cfg.overlap_tools and self._waiting_slots():
        self._wait_tools(all_of=True)  # pause mode: the whole batch waits for every tool call
      ready = self._ready_slots()
      if ready and (len(ready) >= cfg.min_resume_rows or not active or not cfg.overlap_tools):
        self._resume_ready(params, ready)
      if self.queue:
        self._start_groups(params)
      # Rows just resumed/started count as active: a row whose first draw stopped it is inactive on device
      # and draws nothing in the decode; its draw is processed (before the segment) at the next sync.
      active = [i for i, r in enumerate(rows) if r is not None and r.status == "active"]
    elif self.refill and self.queue and rows.count(None) >= self.n:
      # A stream keeps its slots full: queued groups start in free slots between segments, beside rows that
      # are still decoding, rather than at the batch's next pause.
      self._start_groups(params)
      active = [i for i, r in enumerate(rows) if r is not None and r.status == "active"]
    if active:
      self._ensure_capacity(max(rows[i].cache_len + self.seg for i in active))
      self.state, segment = self.sampler.decode(params, self.state, self._max_steps, self._min_stops)
      self.stats.decode_calls += 1
      self.stats.active_rows += len(active)
      self.pending_draws.append(([], [], segment, version))
      t0 = time.perf_counter()
      fetched = multihost.to_host([d for _, _, d, _ in self.pending_draws])
      self.stats.device_wait_s += time.perf_counter() - t0
      for (slots, positions, _, v), d in zip(self.pending_draws[:-1], fetched[:-1]):
        self._take_draw(slots, positions, d, v)
      self.pending_draws = []
      segment = fetched[-1]
      self.stats.decode_steps = int(segment.steps)
      for i in active:
        r = rows[i]
        if r is None or r.status != "active":
          continue
        k = int(segment.num[i])
        for j in range(k):
          r.add(segment.tokens[i, j], segment.logp_raw[i, j], segment.logp_sample[i, j], version)
        self.stats.generated_tokens += k
        r.cache_len = int(segment.lengths[i])
        if not segment.active[i]:
          self._on_stop(i, int(segment.stop_reason[i]))
    elif self.pending_draws:
      self._sync_draws()
    elif self._waiting_slots() and not self._ready_slots():
      self._wait_tools(all_of=not cfg.overlap_tools)

  def finish_stats(self) -> RolloutStats:
    """The counters so far, with wall time and the sampler functions traced since the loop was made."""
    self.stats.wall_s = time.perf_counter() - self._t_start
    self.stats.traces = {k: v - self._traces_before.get(k, 0) for k, v in sampler_lib.TRACE_COUNTS.items()
                         if v - self._traces_before.get(k, 0)}
    return self.stats

  # ------------------------------------------------------------------------------------------------ internals
  def _owner(self, slot: int) -> int:
    return slot * self.procs // self.b  # the process whose devices hold the row (batch blocks)

  def _forced_row(self, ep: int, turn: int) -> np.ndarray:
    out = np.full((self.f_len,), -1, np.int32)
    if self.scripts is not None:
      turns = self.scripts(ep) if callable(self.scripts) else self.scripts[ep]
      if turn < len(turns):
        out[:len(turns[turn])] = turns[turn]
    return out

  def _ensure_capacity(self, need: int):
    if self.state is not None and need <= self.state.capacity:
      return
    cap = self.max_cap if self.sampler.fixed_capacity else min(bucket(need, self.cfg.cache_bucket_min), self.max_cap)
    if cap < need:
      raise AssertionError(f"cache capacity {cap} < {need} tokens")  # budgets make this unreachable
    if self.state is None:
      self.state = self.sampler.init(cap, self.key)
    else:
      self.state = self.sampler.grow(self.state, cap)
      self.stats.grow_calls += 1

  def _finish(self, slot: int, reason: str):
    r = self.rows[slot]
    self.done[r.ep] = r.episode(reason, self.tokenizer)
    self.rows[slot] = None
    if self.on_episode is not None:
      self.on_episode(self.done[r.ep])

  def _on_stop(self, slot: int, reason: int):
    """A row stopped drawing: close its turn and either finish the episode or start its tool calls (another
    host's row: placeholders, whose results arrive in `_exchange_results`)."""
    out = rows_lib.end_turn(self.rows[slot], reason, self.cfg, self.tokenizer, self.resumable)
    if isinstance(out, str):
      return self._finish(slot, out)
    rows_lib.start_calls(self.rows[slot], out, self.cfg, self.executor if self._owner(slot) == self.me else None)

  def _take_draw(self, slots: list[int], positions: list[int], draw, version: int):
    for i, slot in zip(positions, slots):
      r = self.rows[slot]
      r.add(draw.token[i], draw.logp_raw[i], draw.logp_sample[i], version)
      self.stats.generated_tokens += 1
      if draw.stop_reason[i] != StopReason.RUNNING:
        self._on_stop(slot, int(draw.stop_reason[i]))

  def _sync_draws(self):
    if self.pending_draws:
      t0 = time.perf_counter()
      fetched = multihost.to_host([d for _, _, d, _ in self.pending_draws])
      self.stats.device_wait_s += time.perf_counter() - t0
      pending, self.pending_draws = self.pending_draws, []
      for (slots, positions, _, v), d in zip(pending, fetched):
        self._take_draw(slots, positions, d, v)

  def _start_groups(self, params):
    """Starts as many queued groups as free slots hold (up to `groups_per_prefill`): one prefill call, or, in a
    stream's loop, one call per group when they are few (`shapes.prefill_groups`' refill rule)."""
    free = [i for i, r in enumerate(self.rows) if r is None]
    g = min(len(free) // self.n, len(self.queue), self.cfg.groups_per_prefill)
    if g == 0:
      return
    gp = shapes.prefill_groups(g, self.n, self.cfg, refill=self.refill)
    if gp < g:  # one group per call
      for j in range(g):
        self._prefill([self.queue.popleft()], free[j * self.n:(j + 1) * self.n], gp, params)
    else:
      self._prefill([self.queue.popleft() for _ in range(g)], free, gp, params)

  def _prefill(self, groups: list[int], free: list[int], gp: int, params):
    """One prefill call of `gp` prompt groups (padding past `groups`), into the first of the `free` slots."""
    cfg, n, b, stats = self.cfg, self.n, self.b, self.stats
    t = bucket(max(len(self.prompts[i]) for i in groups), cfg.prompt_bucket_min)
    tokens = np.zeros((gp, t), np.int32)
    lengths = np.zeros((gp,), np.int32)
    slots = np.full((gp * n,), b, np.int32)
    budgets = np.full((gp * n,), cfg.max_response_len, np.int32)
    forced = np.full((gp * n, self.f_len), -1, np.int32) if self.f_len else None
    used = []
    for j, gi in enumerate(groups):
      p = self.prompts[gi]
      tokens[j, :len(p)] = p
      lengths[j] = len(p)
      stats.prompt_tokens += len(p)
      stats.prefilled_tokens += len(p)
      for s in range(n):
        slot = free[j * n + s]
        slots[j * n + s] = slot
        ep = gi * n + s
        self.rows[slot] = rows_lib.Row(ep=ep, group=gi, sample=s, prompt=p, cache_len=len(p))
        used.append(slot)
        if forced is not None:
          forced[j * n + s] = self._forced_row(ep, 0)
    # The prompt bucket, and a segment past the longest prompt: the decode call that follows needs that much.
    self._ensure_capacity(max(t, int(lengths.max()) + self.seg))
    self.state, draw = self.sampler.prefill_groups(n, params, self.state, tokens, lengths, slots, budgets, forced)
    stats.prefill_calls += 1
    stats.padded_prefill_tokens += gp * t
    self.pending_draws.append((used, list(range(len(used))), draw, self.version))

  def _resume_ready(self, params, slots: list[int]):
    """Builds tool-response chunks for rows whose calls finished, and extends their caches in one call."""
    cfg, stats = self.cfg, self.stats
    chunks: dict[int, list[int]] = {}
    for slot in slots:
      r = self.rows[slot]
      chunk = self.renderer.chunk(r.resp[-1], rows_lib.tool_results(r, cfg))
      if len(r.resp) + len(chunk) - 1 >= cfg.max_response_len:  # the tool-response tokens do not fit
        self._finish(slot, episode_lib.STOP_LENGTH)
        continue
      k = r.add_tool_response(chunk)
      stats.tool_tokens += k
      stats.prefilled_tokens += k
      chunks[slot] = chunk
    if not chunks:
      return
    for slot in chunks:
      self.rows[slot].cache_len += len(chunks[slot])
      self.rows[slot].status = "active"
    self._extend_chunks(params, chunks, draw=True)

  def _extend_chunks(self, params, chunks: dict[int, list[int]], *, draw: bool):
    """Appends each row's chunk to its cache in fixed `[R, T]` extend calls (R = extend_rows, T = chunk_len):
    extend compiles once per cache capacity, whatever the number of rows and the lengths of their chunks; a
    longer chunk takes several calls. With `draw`, each row draws its next token after its chunk's last piece
    (a tool response); without, nothing is drawn (a recomputed context)."""
    cfg, b = self.cfg, self.b
    self._ensure_capacity(max(self.rows[s].cache_len for s in chunks) + 1)
    r, t = cfg.rows_per_extend, cfg.chunk_len
    for call in shapes.extend_calls({slot: len(c) for slot, c in chunks.items()}, r, t, b):
      rows_idx = np.arange(b, dtype=np.int32) if r == b else np.full((r,), b, np.int32)
      tokens = np.zeros((r, t), np.int32)
      lengths = np.zeros((r,), np.int32)
      final = np.zeros((r,), np.bool_)
      budgets = np.zeros((r,), np.int32)
      forced = np.full((r, self.f_len), -1, np.int32) if self.f_len else None
      drew = []
      for i, (slot, j) in enumerate(call):
        c, row = chunks[slot][j * t:(j + 1) * t], self.rows[slot]
        i = slot if r == b else i
        rows_idx[i] = slot
        tokens[i, :len(c)] = c
        lengths[i] = len(c)
        final[i] = draw and (j + 1) * t >= len(chunks[slot])
        if final[i]:
          drew.append((i, slot))
          budgets[i] = cfg.max_response_len - len(row.resp)
          if forced is not None:
            forced[i] = self._forced_row(row.ep, len(row.turns))
      self.state, d = self.sampler.extend(params, self.state, rows_idx, tokens, lengths, final, budgets, forced)
      self.stats.extend_calls += 1
      self.stats.padded_prefill_tokens += r * t
      if drew:
        self.pending_draws.append(([s for _, s in drew], [i for i, _ in drew], d, self.version))

  def _waiting_slots(self):
    return [i for i, r in enumerate(self.rows) if r is not None and r.status == "waiting"]

  def _ready_slots(self):
    return [i for i in self._waiting_slots() if all(f is None or f.done() for _, f in self.rows[i].calls)]

  def _exchange_results(self):
    """Several processes: every process's results of its own rows' calls, set on the others' placeholders."""
    mine = {}
    for slot in self._waiting_slots():
      if self._owner(slot) == self.me:
        for j, (_, fut) in enumerate(self.rows[slot].calls):
          if fut is not None:
            mine[(slot, j)] = rows_lib.future_result(fut)
    for part in multihost.allgather_objects(mine):
      for (slot, j), res in part.items():
        fut = self.rows[slot].calls[j][1]
        if not fut.done():
          fut.set_result(res)

  def _wait_tools(self, all_of: bool):
    t0 = time.perf_counter()
    futs = [f for i in self._waiting_slots() if self._owner(i) == self.me for _, f in self.rows[i].calls
            if f is not None]
    if futs:
      concurrent.futures.wait(futs, return_when=concurrent.futures.ALL_COMPLETED if all_of
                              else concurrent.futures.FIRST_COMPLETED)
    if self.procs > 1:
      self._exchange_results()
    t1 = time.perf_counter()
    self.stats.tool_wait_s += t1 - t0
    if self.tool_wait_spans is not None:
      self.tool_wait_spans.append((t0, t1))


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
  shapes.check_prompts(prompts, n, cfg, scripts, sampler)
  loop = AgentLoop(sampler, n=n, tokenizer=tokenizer, executor=executor, cfg=cfg, key=key, scripts=scripts,
                   on_episode=on_episode)
  loop.add(prompts)
  while loop.busy:
    loop.step(params)
  loop.state = None
  return [loop.done[i] for i in sorted(loop.done)], loop.finish_stats()
