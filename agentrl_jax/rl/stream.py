"""The rollout stream of asynchronous RL: prompt batches in, finished and scored groups out, policy versions on
every token, staleness bounded by admission.

    stream = RolloutStream(engine, data_iter, cfg, n=8, prompts_per_step=16, score=score_fn, key=sample_key)
    for step in ...:
      batch = stream.next_batch(params, version=step)   # the oldest untrained prompt batch, every group finished
      ... advantages, update(s): the new params reach the sampler at its next decode segment (a partial rollout)

The trainer's synchronous loop draws a batch of prompts, runs it to completion under the current params and
trains on it; every row slot idles while the slowest episode finishes and the devices idle while tools run.
Here one `AgentLoop` stays alive across updates: its slots refill from the prompt stream as episodes finish,
finished groups are scored at once and wait in a buffer, and `next_batch` returns as soon as the oldest batch
the trainer has not consumed is complete, while later batches keep running.

Versions and staleness. The trainer's step counter is the policy version: params after s updates are version
s, and batch b is trained at step b (one batch per step; with dynamic sampling's extra rounds a step consumes
several, never fewer). Every drawn token carries the version that drew it (`Episode.versions`). A group's
staleness at training is `step - version_first` of its episodes. Admission control (AReaL's rule, in batches)
starts the groups of batch j only once `(steps done) + (j - first unconsumed batch) - (sampler version) <=
max_staleness`: a batch is never trained more than `max_staleness` versions after its first token was drawn.
As every step consumes at least one batch, no group can arrive older than that; `next_batch` still checks each
group at consumption and drops (and counts, `stale_dropped`) one that does, a guard against a change that
breaks the bound (`tests/rl/test_stream_colocated.py` forces one).

Determinism. What the stream does depends on counts only (which rows stopped, which batch is complete, the
version), never on clocks: with the same seed and config an asynchronous run is bit for bit the same, as the
synchronous loop is (with `rollout.overlap_tools`, when a row resumes after its tool call follows the tools'
timing, as in the synchronous loop). Weights reach the sampler at the first decode segment after
`weight_sync_segments` segments since the update was dispatched (0: the next segment, the colocated default,
which waits for the update's results; more: the segments before decode on the old weights, beside the update on
devices of their own; on the trainer's devices, which run programs in dispatch order, after it).
Updates dispatched before any of their segments ran are superseded by the newest: the sampler keeps at most
one pending copy of the weights a segment count, and takes only the newest of those that fall due together.
When nothing can run without new weights, it takes the oldest pending version that lets the next batch start
(whose update finishes first; the newer keep their countdown), and groups queued to start count as something that
can run: batch b + 1 complete beside b, the two updates dispatched back to back, batch b + 2 (admitted under update
b's weights) starts on them, on devices of its own without waiting for update b + 1 (on the trainer's devices its
segments run after update b + 1 whatever weights they read). `weight_sync="arrival"` trades determinism for never
waiting: weights fall due at the first segment after they have been computed (and moved), as verl's fully-async
and AReaL's rollouts take them.

Checkpoints and evaluations (`stop`, `state_dict` / `load_state_dict`): the stream stops before either: it
aborts the groups in flight (their partial episodes are dropped; they restart from their prompts) and frees its
KV cache, so an evaluation decodes beside no stream cache; a checkpoint keeps finished groups and the prompt
records of every untrained batch. The trainer drains the stream in the step before a checkpoint or an evaluation
(`next_batch(drain=True)`: no later batch starts, the groups in flight finish), so the abort finds nothing to
drop. An uninterrupted run does the same at the same steps, so a run killed at any point and resumed from its
checkpoint trains every prompt exactly once, on the same episodes, as the uninterrupted run
(`tests/rl/test_async_trainer.py`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from agentrl_jax.data.records import PromptRecord
from agentrl_jax.rl.async_config import AsyncConfig
from agentrl_jax.rollout.agent_loop import AgentLoop
from agentrl_jax.rollout.episode import Episode


@dataclasses.dataclass
class Batch:
  """One prompt batch of the stream: its records, rendered prompts and, as they finish, its scored groups.

  Attributes:
    index: position in the stream (batch b is trained at step b when every step consumes one).
    records: the kept records (prompts too long for the sampler were dropped at rendering).
    ids: their rendered prompt tokens.
    skipped: how many records of the drawn batch rendering dropped.
    groups: finished groups by their position in `records`: `(episodes by sample, scored)`.
  """

  index: int
  records: list[PromptRecord]
  ids: list[list[int]]
  skipped: int = 0
  groups: dict[int, tuple[list[Episode], Any]] = dataclasses.field(default_factory=dict)

  @property
  def complete(self) -> bool:
    return len(self.groups) == len(self.records)


@dataclasses.dataclass
class StreamStats:
  """What the stream did since the last `take_stats` (wall seconds and counts)."""

  rollout_s: float = 0.0     # inside next_batch: the trainer waited for its batch (trainer idle)
  tool_wait_s: float = 0.0   # the loop blocked on tools with nothing to decode
  scoring_s: float = 0.0
  recompute_s: float = 0.0
  recomputed_tokens: int = 0
  generated_tokens: int = 0
  weight_syncs: int = 0
  transfer_s: float = 0.0    # dispatching weight transfers (disaggregated) or reshards to the sampler's layout
  weight_wait_s: float = 0.0  # disaggregated: the sampler blocked until new weights had arrived
  update_device_s: float = 0.0  # an update from its dispatch until its results were ready (a thread waits on them)
  update_blocked_s: float = 0.0  # colocated: of that, the time next_batch ran, the device busy with the update, but
  #                                for the tool waits in it (tool_wait_s holds them)
  buffered_groups: int = 0   # finished groups waiting for training, when the stats were taken
  in_flight: int = 0         # groups in the loop (running or queued), when the stats were taken
  stale_dropped: int = 0     # groups older than max_staleness at consumption
  admission_stalls: int = 0  # scheduling rounds in which a free slot waited for the version to advance
  occupied_rows: float = 0.0  # mean rows decoding per decode segment
  rounds: int = 0


_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


def _ready(tree) -> bool:
  """Whether every array of `tree` has been computed (an update's outputs: true once it has finished)."""
  return all(x.is_ready() for x in jax.tree.leaves(tree))


def _group_id(batch: int, position: int, stride: int) -> int:
  return batch * stride + position


class RolloutStream:
  """Keeps an `AgentLoop` running across policy updates (module docstring)."""

  def __init__(self, engine, data_iter: Iterator[Sequence[PromptRecord]], cfg: AsyncConfig, *, n: int,
               prompts_per_step: int, score: Callable[[list[Episode], PromptRecord], Any], key: jax.Array,
               place: Callable[[Any], Any] | None = None, scripts: Callable | None = None):
    """
    Args:
      engine: the `RolloutEngine` (tokenizer, sampler, executor, limits).
      data_iter: yields prompt batches (the trainer's grain iterator; its position is checkpointed with the run).
      cfg: AsyncConfig.
      n: samples per prompt.
      prompts_per_step: prompts per batch (the stride of group ids).
      score: `(episodes of one group, its record) -> Scored`, called as each group finishes.
      key: the sampling key; the loop's cache is drawn from `fold_in(key, restart)` at each (re)start.
      place: the trainer's params -> the sampler's copy (disaggregated: `transfer.WeightTransfer`); default the
        sampler's `place_params` (the same arrays, or a reshard onto its layout over the same devices).
      scripts: teacher forcing for benchmarks (`AgentLoop`'s callable form: episode id -> turns).
    """
    self.engine, self.data_iter, self.cfg, self.n = engine, data_iter, cfg, n
    self.stride = prompts_per_step
    self.score, self.key = score, key
    self.place = place or engine.sampler.place_params
    self.scripts = scripts
    self.batches: collections.OrderedDict[int, Batch] = collections.OrderedDict()
    self.next_draw = 0        # index of the next batch to draw from data_iter
    self.next_admit = 0       # first batch whose groups are not all admitted
    self.consumed = 0         # batches handed to the trainer
    self.restarts = 0
    self.stats = StreamStats()
    self._admitted: dict[int, int] = {}  # batch -> groups of it added to the loop
    self._sampler_version = 0
    self._latest_version = -1
    self._latest_params = None  # the trainer's params of that version (handed again by a step that skipped its update)
    self._gen_mark = 0
    self._sampler_params = None
    # [version, params, segments left before it applies, whether params are still the trainer's (not yet placed)]
    self._pending: collections.deque = collections.deque()
    # (dispatch time, [time its results were ready]) of each watched update not yet recorded, oldest first, and
    # when the last recorded one's results were ready: the idle metrics' update time.
    self._watches: collections.deque = collections.deque()
    self._watch_done = 0.0
    self.loop = self._new_loop()

  # ------------------------------------------------------------------------------------------------ weights
  def set_params(self, params, version: int) -> None:
    """The trainer's params of `version` (after its update was dispatched). They reach the sampler after
    `weight_sync_segments` decode segments (colocated default: at once). The same params object again (a step
    that skipped its update) only renames the newest weights' version: nothing is copied, moved or recomputed."""
    same, self._latest_params = params is self._latest_params, params
    self._latest_version = version
    if self._sampler_params is None:
      self._sampler_params, self._sampler_version = self._placed(params), version
      return
    if same:  # a step that skipped its update (no informative group): the newest weights are this version's too
      if self._pending:
        self._pending[-1][0] = version
      else:
        self._sampler_version = version
      return
    # A pending copy no decode segment has counted down since (as many segments left) would fall due with this
    # one and be replaced at once: drop it now rather than hold its weights (or its transfer) until then.
    while self._pending and self._pending[-1][2] >= self._countdown:
      self._pending.pop()
    # Disaggregated with delayed weights, the transfer is dispatched once the update has produced these params
    # (`_dispatch_transfers`), not now: queued now, it would hold every decode segment dispatched after it on the
    # sampler's devices (which run their programs in order) until the update ends, the overlap asked for lost.
    deferred = self.cfg.placement == "disaggregated" and self.cfg.delayed
    self._pending.append([version, params if deferred else self._placed(params), self._countdown,
                          deferred])

  @property
  def _countdown(self) -> float:
    """Decode segments new weights wait before they fall due (arrival: until they have arrived)."""
    return math.inf if self.cfg.weight_sync == "arrival" else self.cfg.weight_sync_segments

  def _arrived(self) -> None:
    """Arrival: the pending weights that have been computed (and moved) fall due."""
    if self.cfg.weight_sync == "arrival":
      for p in self._pending:
        if not p[3] and _ready(p[1]):
          p[2] = 0

  def _placed(self, params):
    """The trainer's params as the sampler's weights (`place`: a transfer, a reshard or the same arrays)."""
    t0 = time.perf_counter()
    placed = self.place(params)
    if self.cfg.placement == "colocated" and self.cfg.delayed:
      # The sampler keeps decoding on the previous weights while the update computes: they must be its own
      # copy, as the update overwrites the trainer's arrays in place (donation).
      placed = _copy(placed)
    self.stats.transfer_s += time.perf_counter() - t0
    return placed

  def _dispatch_transfers(self, force: bool = False) -> None:
    """Dispatches the deferred transfers whose params the update has produced (`force`: all of them, as the
    trainer's next update donates its params' buffers once `next_batch` returns)."""
    for p in self._pending:
      if p[3] and (force or _ready(p[1])):
        p[1], p[3] = self._placed(p[1]), False

  def watch_update(self, outputs) -> None:
    """Times the update whose `outputs` were just dispatched (metrics only: a thread waits for them, nothing
    else does). An update dispatched while an earlier one still runs is watched too: its time starts when the
    earlier one's results were ready (the devices run them one after the other)."""
    self.poll_update()
    t0, ready = time.perf_counter(), []

    def wait(leaves=jax.tree.leaves(outputs)):
      jax.block_until_ready(leaves)
      ready.append(time.perf_counter())

    thread = threading.Thread(target=wait, name="rollout-stream-update-watch", daemon=True)
    thread.start()
    self._watches.append((t0, ready, thread))

  def poll_update(self, entered: float | None = None, into: StreamStats | None = None, wait: bool = False) -> None:
    """Records the time of the watched updates whose results are ready in `into` (default the stream's stats)
    (`entered`: when next_batch began; the device time after it blocked the rollout, colocated; `wait`: for every
    watched update, whose results the caller has)."""
    into = into or self.stats
    if wait:
      for _, _, thread in self._watches:
        thread.join()
    spans = self.loop.tool_wait_spans
    while self._watches and self._watches[0][1]:
      t0, (done,), _ = self._watches.popleft()
      start = max(t0, self._watch_done)  # an update queued behind the previous one starts when it ends
      self._watch_done = done
      into.update_device_s += max(0.0, done - start)
      if self.cfg.placement == "colocated":
        b0 = max(start, done if entered is None else entered)
        tools = sum(max(0.0, min(e, done) - max(s, b0)) for s, e in spans)  # idle for tools, counted there
        into.update_blocked_s += max(0.0, done - b0 - tools)
    # Tool waits that ended before the oldest update still watched started overlap no update to come.
    first = max(self._watches[0][0], self._watch_done) if self._watches else float("inf")
    spans[:] = [(s, e) for s, e in spans if e > first]

  def _unblock_version(self, version: int) -> int:
    """The oldest sampler version under which the next batch to start is admissible (the trainer at `version`)."""
    return version + (self.next_admit - self.consumed) - self.cfg.max_staleness

  def _apply_weights(self, force: bool = False, count: bool = True, upto: int | None = None) -> None:
    """Hands the sampler the newest pending weights that fall due (`force`: all of them, or with `upto` the newest
    of those due and the oldest version >= `upto`, whichever is newer; the newer ones keep counting down)."""
    while self._pending and (force or self._pending[0][2] <= 0):
      version, params, _, deferred = self._pending.popleft()
      if self._pending and (self._pending[0][2] <= 0 or (force and (upto is None or version < upto))):
        continue  # a newer copy falls due now too: take only that one
      if deferred:  # due before the update had finished: the transfer is dispatched now, and waited for
        params = self._placed(params)
      if self.cfg.placement == "disaggregated":  # the sampler waits for the transfer (colocated: for nothing)
        t0 = time.perf_counter()
        jax.block_until_ready(params)
        self.stats.weight_wait_s += time.perf_counter() - t0
      self._sampler_params, self._sampler_version = params, version
      self.stats.weight_syncs += count
      if self.cfg.partial == "recompute" and self.loop.occupied:
        t0 = time.perf_counter()
        self.stats.recomputed_tokens += self.loop.recompute(params)
        self.stats.recompute_s += time.perf_counter() - t0
      if upto is not None and version >= upto:
        return

  # ------------------------------------------------------------------------------------------------ batches
  def _new_loop(self) -> AgentLoop:
    e = self.engine
    # Tool waits recorded: the update's blocked time leaves them out (`poll_update`).
    return AgentLoop(e.sampler, n=self.n, tokenizer=e.tokenizer, executor=e.executor, cfg=e.cfg,
                     key=jax.random.fold_in(self.key, self.restarts), scripts=self.scripts, refill=True,
                     record_tool_waits=True)

  def _draw(self) -> Batch:
    rendered = self.engine.render(next(self.data_iter))
    b = Batch(index=self.next_draw, records=rendered.records, ids=rendered.ids, skipped=len(rendered.skipped))
    self.batches[b.index] = b
    self.next_draw += 1
    return b

  def _admissible(self, j: int, version: int) -> bool:
    """Batch j's groups may start: it is trained at step `version + (j - consumed)` at the latest, and its first
    token would be drawn by the sampler's version."""
    return version + (j - self.consumed) - self._sampler_version <= self.cfg.max_staleness

  def _admit(self, version: int, last: int | None = None) -> None:
    """Adds groups to the loop, in batch order, while its free slots can take them and admission allows (and,
    with `last`, only groups of batches up to it)."""
    loop = self.loop
    free = loop.b - loop.occupied - len(loop.queue) * self.n
    while free >= self.n:
      j = self.next_admit
      if last is not None and j > last:
        return
      if not self._admissible(j, version):
        self.stats.admission_stalls += 1
        return
      b = self.batches.get(j) or self._draw()
      todo = [p for p in range(self._admitted.get(j, 0), len(b.records)) if p not in b.groups]
      take = todo[:free // self.n]
      if take:
        loop.add([b.ids[p] for p in take], groups=[_group_id(j, p, self.stride) for p in take])
        free -= len(take) * self.n
      if len(take) == len(todo):  # every group of batch j is in the loop or finished
        self._admitted.pop(j, None)
        self.next_admit += 1
      else:
        self._admitted[j] = take[-1] + 1

  def _collect(self) -> None:
    for gid, eps in self.loop.pop_finished_groups():
      j, p = divmod(gid, self.stride)
      b = self.batches[j]
      eps = [dataclasses.replace(e, group=0) for e in eps]
      t0 = time.perf_counter()
      scored = self.score(eps, b.records[p])
      self.stats.scoring_s += time.perf_counter() - t0
      b.groups[p] = (eps, scored)

  def next_batch(self, params, version: int, drain: bool = False) -> Batch:
    """Runs the stream until the oldest untrained batch is complete and returns it (consumed).

    Args:
      params: the trainer's current params (version `version`); they reach the sampler per `set_params`'s rule.
      version: the trainer's policy version (its step).
      drain: start no group of a later batch, and return once every group in flight has finished (they wait in
        the buffer): the step before a checkpoint, whose `state_dict` then aborts nothing. In the main job the
        aborts threw away ~5% of the generated tokens (68-81 groups at 14 checkpoints, restarted from their
        prompts); a drained step's tail runs as a synchronous one's does.
    """
    t0 = time.perf_counter()
    if version > self._latest_version:
      self.set_params(params, version)
    target = self.consumed
    while True:
      self.poll_update(t0)
      self._dispatch_transfers()
      self._arrived()
      blocked = self._blocked(target, version)
      # Blocked: the oldest pending version that lets the next batch start, not the newest, so the sampler waits
      # only for the update that produced it; newer weights keep their countdown (undelayed, every pending copy
      # is due and the newest is taken).
      self._apply_weights(force=blocked, upto=self._unblock_version(version) if blocked else None)
      self._admit(version, last=target if drain else None)
      b = self.batches.get(target)
      if b is not None and b.complete and not (drain and self.loop.busy):
        break
      if not self.loop.busy:
        raise AssertionError(f"rollout stream: batch {target} is incomplete and nothing is running")
      ls = self.loop.stats
      calls_before, active_before, tools_before = ls.decode_calls, ls.active_rows, ls.tool_wait_s
      self.loop.step(self._sampler_params, self._sampler_version)
      self.stats.tool_wait_s += ls.tool_wait_s - tools_before
      if ls.decode_calls > calls_before:
        self.stats.occupied_rows += ls.active_rows - active_before
        self.stats.rounds += 1
        for p in self._pending:
          p[2] -= 1
      self._collect()
    self.poll_update(t0)
    self._dispatch_transfers(force=True)
    self.batches.pop(target)
    self._admitted.pop(target, None)
    self.consumed += 1
    stale = [p for p, (eps, _) in b.groups.items() if version - min(e.version_first for e in eps)
             > self.cfg.max_staleness]
    for p in stale:
      del b.groups[p]
    self.stats.stale_dropped += len(stale)
    self.stats.rollout_s += time.perf_counter() - t0
    return b

  def _blocked(self, target: int, version: int) -> bool:
    """The sampler must take pending weights now: nothing else can run (every admissible group finished or
    admission waits for the version), so waiting for more decode segments would never end."""
    if not self._pending:
      return False
    return not self.loop.busy or (self.loop.occupied == 0 and not self.loop.queue
                                  and not self._admissible(self.next_admit, version))

  # ------------------------------------------------------------------------------------------------ stats
  def take_stats(self) -> StreamStats:
    out, self.stats = self.stats, StreamStats()
    out.buffered_groups, out.in_flight = self.buffered_groups, self.in_flight_groups
    out.generated_tokens = self.loop.stats.generated_tokens - self._gen_mark
    self._gen_mark = self.loop.stats.generated_tokens
    if out.rounds:
      out.occupied_rows /= out.rounds
    return out

  @property
  def buffered_groups(self) -> int:
    """Finished groups waiting for training."""
    return sum(len(b.groups) for b in self.batches.values())

  @property
  def in_flight_groups(self) -> int:
    return len(self.loop.in_flight_groups()) + len(self.loop.queue)

  # ------------------------------------------------------------------------------------------------ checkpoint
  def stop(self, params, version: int) -> int:
    """Stops the loop: aborts the groups in flight (they restart from their prompts), frees its KV cache (the
    next decode segment starts a fresh one from the next restart's key) and hands the sampler the trainer's
    params of `version` at once (`weights`). Before a checkpoint (`state_dict`) and before an evaluation, which
    then decodes beside no stream cache: on a slice the stream's cache is most of a sampler chip's memory. The
    trainer drains the step before either (`next_batch(drain=True)`), so nothing is aborted. Call it at the same
    steps in every run, as the trainer does (checkpoints and evaluations are counted in steps): a run stays a
    function of its seed and config. Stopping a stopped loop (nothing in flight, no cache) changes nothing.

    Returns:
      The number of groups aborted.
    """
    dropped = []
    if self.loop.busy or self.loop.state is not None:
      self.restarts += 1
      dropped = self.loop.abort(jax.random.fold_in(self.key, self.restarts))
    self._admitted = {}
    self.next_admit = self.consumed
    if version > self._latest_version:
      self.set_params(params, version)
    self._apply_weights(force=True, count=False)
    return len(dropped)

  @property
  def weights(self):
    """The sampler's current weights (after `stop`: the trainer's params of its version, as the sampler runs
    them, on its devices), for an evaluation to decode with instead of placing a second copy."""
    return self._sampler_params

  def state_dict(self, params, version: int) -> tuple[dict, int]:
    """Stops the loop (`stop`) and returns what a checkpoint keeps: the untrained batches (records, rendered
    prompts, finished groups) and the counters, with the number of groups aborted. Call it at the same steps in
    every run (every checkpoint), so interrupted and uninterrupted runs stay the same function (a resumed stream
    starts from the same state: nothing in flight, the sampler on the checkpoint's weights)."""
    dropped = self.stop(params, version)
    return {"batches": [{"index": b.index, "records": b.records, "ids": b.ids, "skipped": b.skipped,
                         "groups": b.groups} for b in self.batches.values()],
            "next_draw": self.next_draw, "consumed": self.consumed, "restarts": self.restarts}, dropped

  def load_state_dict(self, state: dict) -> None:
    """Restores `state_dict`'s output (a resumed run): the untrained batches and the counters."""
    self.batches = collections.OrderedDict()
    for d in state["batches"]:
      b = Batch(index=d["index"], records=d["records"], ids=d["ids"], skipped=d["skipped"], groups=d["groups"])
      self.batches[b.index] = b
    self.next_draw, self.consumed, self.restarts = state["next_draw"], state["consumed"], state["restarts"]
    self.next_admit = self.consumed
    self._admitted = {}
    self._gen_mark = 0
    self.loop = self._new_loop()
