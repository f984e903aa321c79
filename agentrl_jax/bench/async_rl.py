"""Asynchronous vs synchronous RL against a remote tool service: trained tokens per second; prints ONE JSON line.

    python -m agentrl_jax.bench.async_rl                                   # bench_5m, 8 steps of 8 x 4 episodes
    python -m agentrl_jax.bench.async_rl --smoke       # tiny_qwen3, 3 steps of 4 x 2 episodes (bench/guard.py)

A SandboxFusion service over the network answers each tool call after a wall-clock latency that costs this
host no CPU: lognormal, median 200 ms, p99 2 s (sigma = ln 10 / 2.326), drawn from the call's code so both loops
see the same latency for the same call. Every step: P prompts x n samples, each episode teacher-forced through
`--tool-turns` scripted tool calls and a final answer (bench/rollout.py's workload: every token still runs the
model's forward and draw), then one real GRPO update (forward, backward, AdamW) on the step's episodes.

  sync    the trainer's synchronous loop: roll the step's batch out to completion (`run_rollout`), then update,
          with one step's episodes as its row slots (`--sync-rows`, default prompts x n: the trainer's
          rollout.batch_size; more would decode idle rows).
  async   the rollout stream of `rl/stream.py` at max_staleness 1 (colocated) over `--rows` slots (default two
          steps' episodes, so the next batch can fill what the current one frees): slots refill from the next
          batch while the current one finishes, the update is dispatched without waiting, and the sampler takes
          the new weights at its next decode segment (partial rollouts), or `--weight-sync-segments` k segments
          later (decoding those on the stream's copy of the old weights), or once they have arrived
          (`--weight-sync arrival`). `--placement disaggregated` puts its sampler on a second device (on a CPU
          host the process gets two, which share its cores): its segments run beside the update instead of
          after it, as a device runs its programs in dispatch order.

The clock holds the same work in both: the timed steps' rollouts and updates. The stream's last warm-up step and
its last timed step are drained (`next_batch(drain=True)`: no later batch starts), so no timed batch decodes before
the clock starts and no untimed one decodes on it; the first timed batch starts from empty slots, as the
synchronous loop's does (a few timed steps understate the pipelined steady state, never overstate it). Programs
compile in the warm-up, not on the clock (`*_traces` says what still did): the stream's warm-up also restarts
drained on updated weights, and both loops' caches are allocated at the longest episode's length (no capacity
ladder whose programs a timed step could meet first). What compiling costs each loop is in the main job's table
(README, Asynchronous RL).

`--rounds` R runs the four (mode, schedule) runs R times, in the reverse order every other round, and takes each
ratio per round: speedup is the median of the rounds' ratios (speedup_rounds: all of them), with each mode on the
schedule of its higher median tokens/s; per-run fields are medians over the rounds.

Each mode runs with the agent loop's two tool schedules (pause: the batch waits for all of a turn's calls;
overlap: rows decode while others wait) and keeps its faster one. Fields: *_tok_s = trained tokens (loss-mask
tokens of the updated episodes) per second over the timed steps (after `--warmup` steps that compile
everything); speedup = async / sync tok/s, each at its faster schedule (speedup_same_schedule_*: per schedule);
*_staleness_max, async_partial_frac: what the async run trained on; async_batches_ready: timed steps whose batch
was complete before the trainer asked for it (it finished beside the one before, so their two updates run back to
back); tool_latency_p50_s / p99_s: of the calls made; tool_chain_s: the sum over the timed steps of the step's
slowest episode's own tool waits (its calls' latencies, one after another), sync_tool_chain_frac: that over the
synchronous wall time (the synchronous loop cannot wait less); schedule_model_speedup: bench.async_schedule's
staleness-1 model replayed on those chains with the synchronous run's measured decode and update time a step
(decode and update never sharing a device or a core: the ceiling of speedup on this workload), async_over_model:
speedup over it; schedule_one_device_speedup: the same model on one device that runs its programs one at a time in
dispatch order (`async_schedule.one_device`: a decode turn waits behind every update it meets, each episode's own
calls replayed; the colocated stream's ceiling), async_over_one_device: speedup over that; per mode and schedule,
*_wall_s (timed steps), *_rollout_s (the trainer waiting for its batch: the whole rollout when synchronous),
*_tool_wait_s (the loop blocked on tools with nothing to decode), *_decode_calls, *_rows_per_call (rows decoding per
call, of `--rows`), *_cpu_s (CPU seconds of the process over the timed steps) and *_traces (programs compiled during
the timed steps, by JAX's compile events: the sampler's, the update's, eager ops'; 0 when the warm-up compiled
everything). sync_cpu_busy_frac / async_cpu_busy_frac: the fraction of the host's cores those CPU seconds filled
(`metrics_writer.cpu_busy_frac`); speedup_at_full_cores = 1 / sync_cpu_busy_frac, the synchronous loop's CPU work
done with every core busy throughout: where decode and update already fill the cores, overlapping them (the remote
tools cost no CPU) gains about no more than that. It is an estimate, not a hard ceiling: a schedule beats it by
doing less work (fewer, fuller decode calls, or less spinning of XLA:CPU's thread pools, which count as CPU
seconds); on an accelerator host, whose work is on the device, it says nothing.
Both modes train the same prompts and draw the same scripted tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import time

from flax import nnx
import jax
import numpy as np

from agentrl_jax import compile_stats, metrics_writer
from agentrl_jax.bench import async_schedule, common, guard
from agentrl_jax.bench.rollout import make_workload, tool_output
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.models import sharding
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.qwen import Qwen
from agentrl_jax.rl import async_config
from agentrl_jax.rl import batch as batch_lib
from agentrl_jax.rl import losses
from agentrl_jax.rl import stream as stream_lib
from agentrl_jax.rl import transfer as transfer_lib
from agentrl_jax.rl import update as update_lib
from agentrl_jax.rollout import agent_loop, shapes
from agentrl_jax.rollout.chat import stop_token_ids
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.engine import RenderedPrompts
from agentrl_jax.rollout.episode import collate
from agentrl_jax.rollout.parser import parse_tool_calls
from agentrl_jax.rollout.stub_executor import stub_executor
from agentrl_jax.sampling.sampler import make_sampler

# `--smoke` (held to bench/guard.py's smoke bounds): 4 x 2 episodes a step, 3 timed steps, at tiny size.
SMOKE = ("--size", "tiny_qwen3", "--prompts", "4", "--n", "2", "--rows", "16", "--steps", "3")
PACK_LEN = 512 + 1024  # the longest episode: max prompt + max response
MICRO = 2  # rows per micro-batch of the update
SIGMA = async_schedule.SIGMA  # lognormal with median m has p99 = m * exp(2.326 sigma) = 10 m


def remote_latency(code: str, median_s: float) -> float:
  """A call's service latency: lognormal, drawn from the code (the same call waits the same in both modes)."""
  seed = int.from_bytes(hashlib.sha256(code.encode()).digest()[:8], "little")
  return float(median_s * math.exp(SIGMA * np.random.default_rng(seed).standard_normal()))


def tool_latencies(tokenizer, scripts, median_s: float) -> list[list[float]]:
  """Each episode of `scripts`: its calls' latencies, in the order it makes them. Their sum is the episode's own
  tool chain: no loop returns its batch sooner than the longest, whatever it overlaps."""
  def episode(turns):
    calls = [c for t in turns for c in parse_tool_calls(tokenizer.decode(t))]
    return [remote_latency(c.arguments["code"], median_s) for c in calls]
  return [episode(s) for s in scripts]


def remote_executor(median_s: float, latencies: list[float]):
  """The stand-in service: answers after its latency (a sleep: no CPU), records every latency."""
  def answer(code):
    wait = remote_latency(code, median_s)
    latencies.append(wait)
    time.sleep(wait)
    return tool_output(code)
  return stub_executor(answer, max_concurrency=1024)


def schedule_model(calls, sync_rollout_s: float, sync_wall_s: float) -> tuple[float, float]:
  """The speedups bench.async_schedule's model of the staleness-1 stream gives for the timed steps' own tool calls
  (`calls`: [steps, episodes, calls] latencies), with the synchronous run's measured time a step outside them: its
  rollout's decode and bookkeeping (`sync_rollout_s` less the steps' slowest chains, spread evenly over the steps
  and over each episode's turns) and its update (`sync_wall_s - sync_rollout_s`). The synchronous side of the
  model is then the measured synchronous wall time; the stream's is `batch_order`'s (decode never waits for an
  update nor shares a core with one) and `one_device`'s (a decode turn waits behind every update it meets, as on
  one device that runs its programs in dispatch order). The measured speedup over these is what the host's
  shared cores (and the stream's bookkeeping) left of each."""
  calls = np.asarray(calls, np.float64)
  steps, turns = calls.shape[0], calls.shape[-1]
  chains = calls.sum(-1).max(-1)
  decode = max(0.0, sync_rollout_s - chains.sum()) / steps
  update = max(0.0, sync_wall_s - sync_rollout_s) / steps
  times = chains[:, None] + decode
  sync = async_schedule.synchronous(times, update)[-1]
  return (float(sync / async_schedule.batch_order(times, update, 1)[-1]),
          float(sync / async_schedule.one_device(calls, decode / (turns + 1), update, 1)[-1]))


@dataclasses.dataclass
class _Engine:
  """What `RolloutStream` reads of a `RolloutEngine`, over pre-rendered prompts (records carry the index)."""

  sampler: object
  tokenizer: object
  executor: object
  cfg: RolloutConfig
  prompts: list

  def render(self, records):
    return RenderedPrompts(ids=[self.prompts[r.index] for r in records], records=list(records), skipped=[])


def _records(p: int, step: int) -> list[PromptRecord]:
  return [PromptRecord(prompt=[], data_source="bench", ground_truth="", extra_info={}, index=step * p + i)
          for i in range(p)]


def run(args) -> dict:
  cfg_m = getattr(ModelConfig, args.size)()
  sync_rows = args.sync_rows or args.prompts * args.n
  tok = tokenizer_lib.tiny_tokenizer()
  steps_total = args.warmup + args.steps
  groups = args.prompts * (steps_total + 2)  # the stream admits up to max_staleness batches ahead
  prompts, scripts = make_workload(tok, groups, args.n, args.tool_turns, seed=0)
  # pad_prefill_groups: one prefill program. The stream starts as many groups as slots have freed, a count that
  # follows tool timing, so with a program per power-of-two count a timed step could compile one the warm-up did
  # not meet. Both loops mostly start all 8 groups of a step at once, so the padding costs them little.
  cfg = RolloutConfig(batch_size=args.rows, segment_len=32, max_prompt_len=512, max_response_len=1024,
                      prompt_bucket_min=256, chunk_len=64, cache_bucket_min=args.cache_min,
                      max_turns=args.tool_turns + 1, groups_per_prefill=8, pad_prefill_groups=True)
  end, tool_end = stop_token_ids(tok)
  model = Qwen(cfg_m, rngs=nnx.Rngs(0))
  mesh = sharding.make_mesh(1, -1, 1, devices=jax.devices()[:1])
  opt_cfg = update_lib.OptimizerConfig(learning_rate=1e-5)
  loss_cfg = losses.LossConfig()
  mini = args.prompts * args.n
  longest = max(len(t) for s in scripts for t in s)

  def fresh_state():
    graphdef, state = update_lib.init_train_state(Qwen(cfg_m, rngs=nnx.Rngs(0)), opt_cfg, mesh)
    return graphdef, state

  graphdef, _ = nnx.split(model)
  _, state0 = fresh_state()
  shardings = update_lib.train_state_shardings(state0, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, loss_cfg, opt_cfg, mesh, micro_batch_size=MICRO,
                                     logits_chunk_size=None)
  bsh = update_lib.batch_sharding(mesh)

  def update_batch(episodes):
    # Episodes packed into rows of the longest possible episode, as the trainer does (rl.pack_len): the update
    # computes their tokens, not a padded square, and skips its empty micro-batches.
    collated = collate(episodes, prompt_bucket_min=512, response_bucket_min=1024, batch_multiple=mini)
    adv = np.where(np.arange(len(episodes)) % 2, 1.0, -1.0).astype(np.float32)  # a real gradient, both signs
    full = batch_lib.update_batch(collated, adv)
    packed = batch_lib.pack_minibatch(full, collated["prompt_lens"] + collated["response_lens"], pack_len=PACK_LEN,
                                      micro_batch_size=MICRO)
    arrays = jax.device_put(packed, bsh)
    arrays["old_logp"] = arrays.pop("sampler_logp")
    return arrays, int(collated["loss_mask"].sum())

  def one_mode(mode: str, overlap: bool) -> dict:
    latencies: list[float] = []
    executor = remote_executor(args.tool_median_s, latencies)
    rows = args.rows if mode == "async" else sync_rows
    rcfg = cfg.replace(overlap_tools=overlap, batch_size=rows)
    sampling = shapes.sampling_config(tok, rcfg, temperature=1.0)
    apart = mode == "async" and args.placement == "disaggregated"
    if apart:  # the sampler on the second device, the trainer on the first; weights moved after each update
      smesh = sharding.make_mesh(1, -1, 1, devices=jax.devices()[1:2])
      sampler = make_sampler(graphdef, cfg_m, sampling, batch=rows, n_forced=longest, mesh=smesh,
                             params=nnx.state(model))
      move = transfer_lib.WeightTransfer(shardings.params, sampler.param_shardings)
    else:
      sampler = make_sampler(graphdef, cfg_m, sampling, batch=rows, n_forced=longest)
    _, state = fresh_state()
    script_fn = lambda ep: scripts[ep]  # noqa: E731  # episode group * n + sample of the global prompt list
    key = jax.random.key(1)
    trained, t_start, stale, partial, ready = 0, None, [], [], 0
    decode_calls = tool_wait = rollout_s = active_rows = 0.0
    try:
      if mode == "async":
        engine = _Engine(sampler, tok, executor, rcfg, prompts)
        data = iter(_records(args.prompts, s) for s in range(10 ** 6))
        acfg = async_config.AsyncConfig(max_staleness=1, weight_sync_segments=args.weight_sync_segments,
                                        placement=args.placement, sampler_devices=int(apart),
                                        weight_sync=args.weight_sync)
        place = (lambda params: sampler.place_params(move(params))) if apart else None  # noqa: E731
        stream = stream_lib.RolloutStream(engine, data, acfg, n=args.n, prompts_per_step=args.prompts, key=key,
                                          score=lambda eps, rec: None, scripts=script_fn, place=place)
      for step in range(steps_total):
        if step == args.warmup:
          jax.block_until_ready(state)
          t_start, cpu_start = time.perf_counter(), metrics_writer.cpu_seconds()
          compiled0 = compile_stats.compile_totals()
        t0 = time.perf_counter()
        if mode == "sync":
          ids = prompts[step * args.prompts:(step + 1) * args.prompts]
          eps, rs = agent_loop.run_rollout(sampler, state.params, ids, n=args.n, tokenizer=tok, executor=executor,
                                          cfg=rcfg, key=jax.random.fold_in(key, step),
                                          scripts=[scripts[step * args.prompts * args.n + i]
                                                   for i in range(args.prompts * args.n)])
          if step >= args.warmup:
            decode_calls += rs.decode_calls
            active_rows += rs.active_rows
            tool_wait += rs.tool_wait_s
        else:
          calls0, rows0 = stream.loop.stats.decode_calls, stream.loop.stats.active_rows
          waiting = stream.batches.get(stream.consumed)  # complete already: it finished beside the one before
          ready += step >= args.warmup and waiting is not None and waiting.complete
          # Drained: the last warm-up step (no timed batch starts before the clock) and the last timed one (no
          # untimed batch decodes on it); and the fourth-last warm-up step, so that the warm-up meets what the
          # timed steps run on updated weights (an update's outputs are laid out otherwise than the initial
          # params: new programs): a start from empty slots, then refills one group at a time.
          drain = step in (args.warmup - 4, args.warmup - 1, steps_total - 1)
          b = stream.next_batch(state.params, version=step, drain=drain)
          eps = [e for p in sorted(b.groups) for e in b.groups[p][0]]
          st = stream.take_stats()
          if step >= args.warmup:
            decode_calls += stream.loop.stats.decode_calls - calls0
            active_rows += stream.loop.stats.active_rows - rows0
            tool_wait += st.tool_wait_s
            stale += [step - e.version_first for e in eps]
            partial += [e.version_last > e.version_first for e in eps]
        if step >= args.warmup:
          rollout_s += time.perf_counter() - t0
        arrays, tokens = update_batch(eps)
        state, metrics = update(state, arrays, jax.random.key(step))
        if mode == "sync":
          jax.block_until_ready(metrics)  # the synchronous trainer reads its step's metrics before rolling out
        if step >= args.warmup:
          trained += tokens
      jax.block_until_ready(state)
      wall = time.perf_counter() - t_start
      cpu_s = metrics_writer.cpu_seconds() - cpu_start
      traces = compile_stats.compile_totals().minus(compiled0).programs
    finally:
      executor.close()
    out = {"tok_s": trained / wall, "wall_s": wall, "trained_tokens": trained, "rollout_s": rollout_s,
           "cpu_s": cpu_s, "cpu_busy_frac": metrics_writer.cpu_busy_frac(cpu_s, wall),
           "tool_wait_s": tool_wait, "traces": traces, "decode_calls": decode_calls,
           "rows_per_call": active_rows / max(decode_calls, 1),
           "latency_p50_s": float(np.percentile(latencies, 50)), "latency_p99_s": float(np.percentile(latencies, 99))}
    if mode == "async":
      out.update(staleness_max=float(max(stale)), staleness_mean=float(np.mean(stale)),
                 partial_frac=float(np.mean(partial)), batches_ready=ready)
    return out

  arms = [(mode, overlap) for overlap in (False, True) for mode in ("sync", "async")]
  rounds = []
  for r in range(args.rounds):
    done = {}
    for mode, overlap in (arms if r % 2 == 0 else arms[::-1]):  # neither mode always runs first
      common.log(f"round {r + 1}/{args.rounds}: {mode} {'overlap' if overlap else 'pause'}")
      done[(mode, overlap)] = one_mode(mode, overlap)
    rounds.append(done)
  # Per run, the median over the rounds of each field (the largest staleness and compile count of any round); each
  # mode on its schedule of higher median tokens/s.
  agg = lambda k, xs: float(max(xs)) if k in ("staleness_max", "traces") else float(np.median(xs))  # noqa: E731
  res = {arm: {k: agg(k, [rd[arm][k] for rd in rounds]) for k in rounds[0][arm]} for arm in arms}
  best = {m: max((res[(m, o)]["tok_s"], o) for o in (False, True)) for m in ("sync", "async")}

  def ratio(async_overlap: bool, sync_overlap: bool) -> list[float]:
    return [rd[("async", async_overlap)]["tok_s"] / rd[("sync", sync_overlap)]["tok_s"] for rd in rounds]

  speedups = ratio(best["async"][1], best["sync"][1])
  per_step = args.prompts * args.n
  calls = [tool_latencies(tok, scripts[s * per_step:(s + 1) * per_step], args.tool_median_s)
           for s in range(args.warmup, steps_total)]
  chain_s = sum(max(sum(e) for e in step) for step in calls)
  a, s = res[("async", best["async"][1])], res[("sync", best["sync"][1])]
  model, one_device = schedule_model(calls, s["rollout_s"], s["wall_s"])
  out = {
      "bench": "async_rl", "size": args.size, "prompts": args.prompts, "n": args.n, "rows": args.rows,
      "sync_rows": sync_rows, "tool_turns": args.tool_turns, "steps": args.steps, "warmup": args.warmup,
      "rounds": args.rounds, "tool_median_s": args.tool_median_s, "weight_sync_segments": args.weight_sync_segments,
      "placement": args.placement, "weight_sync": args.weight_sync,
      "sync_tok_s": best["sync"][0], "async_tok_s": best["async"][0],
      "sync_schedule": "overlap" if best["sync"][1] else "pause",
      "async_schedule": "overlap" if best["async"][1] else "pause",
      "speedup": float(np.median(speedups)), "speedup_rounds": speedups,
      "speedup_same_schedule_pause": float(np.median(ratio(False, False))),
      "speedup_same_schedule_overlap": float(np.median(ratio(True, True))),
      "async_staleness_max": a["staleness_max"], "async_staleness_mean": a["staleness_mean"],
      "async_partial_frac": a["partial_frac"], "async_batches_ready": a["batches_ready"],
      # The timed steps' slowest episodes' own tool waits: the synchronous loop waits at least that long.
      "tool_chain_s": chain_s, "sync_tool_chain_frac": chain_s / s["wall_s"],
      # What the staleness-1 schedule allows on these very draws (decode and update never sharing a core):
      # the measured speedup's ceiling on an accelerator, and how much of it this host reached.
      "schedule_model_speedup": model, "async_over_model": float(np.median(speedups)) / model,
      # The same on one device that runs update and decode one after another (the colocated stream's ceiling).
      "schedule_one_device_speedup": one_device, "async_over_one_device": float(np.median(speedups)) / one_device,
      # How full the cores were over the timed steps; 1 / the synchronous one: the speedup of the synchronous
      # loop's CPU work done with every core busy throughout (overlap gains no more unless it saves work).
      "sync_cpu_busy_frac": s["cpu_busy_frac"],
      "async_cpu_busy_frac": a["cpu_busy_frac"],
      "speedup_at_full_cores": 1.0 / s["cpu_busy_frac"],
      # every run of every round trained the same tokens
      "trained_tokens_equal": len({rd[arm]["trained_tokens"] for rd in rounds for arm in arms}) == 1,
      "tool_latency_p50_s": res[("sync", False)]["latency_p50_s"],
      "tool_latency_p99_s": res[("sync", False)]["latency_p99_s"],
      **{f"{m}_{'overlap' if o else 'pause'}_{k}": r[k] for (m, o), r in res.items()
         for k in ("tok_s", "wall_s", "rollout_s", "tool_wait_s", "decode_calls", "rows_per_call", "cpu_s",
                   "traces")},
      **common.backend_info(),
  }
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", default="bench_5m")
  p.add_argument("--prompts", type=int, default=8)
  p.add_argument("--n", type=int, default=4)
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--tool-turns", type=int, default=3)
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--warmup", type=int, default=4,
                 help=">= 4: the stream's fourth-last and last warm-up steps are drained (see `drain` in run)")
  p.add_argument("--rounds", type=int, default=1, help="runs of each (mode, schedule), alternating their order")
  p.add_argument("--sync-rows", type=int, default=None,
                 help="the synchronous loop's row slots (default prompts x n, one step's episodes)")
  p.add_argument("--tool-median-s", type=float, default=0.2)
  p.add_argument("--cache-min", type=int, default=PACK_LEN,
                 help="the KV cache's first capacity (default the longest episode: one capacity, no grow programs)")
  p.add_argument("--weight-sync-segments", type=int, default=0,
                 help="async: decode segments on the old weights (the stream's copy) after an update's dispatch")
  p.add_argument("--placement", choices=async_config.PLACEMENTS, default="colocated",
                 help="async: the sampler on the trainer's device, or on a second one (disaggregated; on a CPU host "
                      "the process gets two devices, which share its cores)")
  p.add_argument("--weight-sync", choices=async_config.WEIGHT_SYNCS, default="segments",
                 help="async: new weights reach the sampler after --weight-sync-segments segments (deterministic), "
                      "or once they have arrived (arrival)")
  args, scale = guard.parse_args(p, argv, SMOKE)
  if args.warmup < 4 or args.steps < 1 or args.rounds < 1:
    p.error("--warmup must be >= 4 (a drained stream restarted on updated weights, its refills and the drained "
            "last step: the programs the timed steps run), --steps and --rounds >= 1")
  if args.rows < args.prompts * args.n or (args.sync_rows or args.prompts * args.n) < args.n:
    p.error("--rows must hold one step's episodes (prompts x n), --sync-rows at least one group (n)")
  if args.placement == "disaggregated":
    common.host_devices(2)  # a CPU host's second device: before the backend starts
  common.start_backend("async_rl")
  if args.placement == "disaggregated" and len(jax.devices()) < 2:
    p.error(f"--placement disaggregated needs two devices, {jax.default_backend()} has {len(jax.devices())}")
  line = run(args)
  failures = guard.judge("async_rl", line, scale, args.check)
  print(json.dumps(line), flush=True)
  guard.exit_on(failures)


if __name__ == "__main__":
  main()
