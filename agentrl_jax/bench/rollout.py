"""Rollout benchmark: our agent loop (extend the cache) vs a loop that re-renders and re-prefills the whole chat
every turn (how Tunix's agentic rollout works); prints ONE JSON line.

    python -m agentrl_jax.bench.rollout                                 # bench_5m, 16 prompts x 4 = 64 episodes
    python -m agentrl_jax.bench.rollout --smoke                         # 16 episodes (the guard's test)
    python -m agentrl_jax.bench.rollout --size tiny_qwen3 --groups 2 --n 2 --rounds 1 --no-check   # a quick look

Workload: 64 episodes (16 prompts x n=4 samples, a GRPO group each) of 4 tool turns and a final answer turn,
on a random-weight model with the tiny tokenizer. The model is teacher-forced through scripted turns (every
step still runs the full model forward and draw; only the emitted token is replaced), so both loops produce the
SAME transcripts (checked: transcripts_match). Scripted turns: 16-112 tokens of reasoning text, then a
code_interpreter call; tool outputs: 1-6 lines from an in-process stand-in executor with a fixed 50 ms latency
per call (concurrent calls overlap, as sandboxed processes would).

  pause         `rollout.run_rollout` (default settings): each prompt prefilled once (shared by its n samples),
                tool responses appended to the same KV cache; the batch decodes until every row stopped, then
                all tools run at once (overlap_tools=False).
  overlap       the same loop with overlap_tools=True: rows decode while others wait on their tools.
  reprefill     per turn: render every episode's chat so far, prefill it into a fresh cache, decode the turn,
                run the tools, repeat; built from the same compiled sampler functions (prefill/decode).

Fields: *_episodes_s = episodes / seconds (median over rounds, interleaved); ours = the default mode (the
faster of the two measured here: pause); speedup = median per-round ratio reprefill / ours seconds;
prefilled_tokens = non-model tokens our loop ran through the model (stats.prefilled_tokens)
and expected_prefill_tokens = distinct prompt tokens + tool-response tokens; reprefill_prefilled_tokens for
comparison; *_padded_* count the tokens computed including bucket padding. compile_s / compiled_programs: what
the default loop's warm-up round spent tracing, lowering and compiling (JAX's compile events) and the programs it
built (overlap_* / reprefill_*: the same for the others, after the default loop's programs exist);
compile_frac_of_round = compile_s / the median timed round of the default loop; warmup_s: each warm-up round's
wall seconds (compile + run); warm_cache_*: the default loop's warm-up again after `jax.clear_caches()`, its
programs loaded from the persistent compilation cache the first warm-up filled (what a rerun or a restarted job
pays; tracing and lowering still run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import statistics
import tempfile
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import compile_stats
from agentrl_jax.bench import common, guard
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.qwen import Qwen
from agentrl_jax.rollout import agent_loop
from agentrl_jax.rollout.chat import ToolResponseRenderer, stop_token_ids
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.parser import parse_tool_calls
from agentrl_jax.rollout.stub_executor import stub_executor
from agentrl_jax.sampling.config import SamplingConfig, StopReason, bucket
from agentrl_jax.sampling.sampler import TRACE_COUNTS, make_sampler
from agentrl_jax.tools import TOOL_SCHEMA, ExecResult, format_result, prepare_code

# --smoke (the guard's slow test): 16 episodes of 2 tool turns on bench_5m, 2 rounds (later flags override).
SMOKE = ("--groups", "4", "--n", "4", "--tool-turns", "2", "--rounds", "2", "--no-compile-cache")

_WORDS = ("let", "me", "compute", "the", "sum", "of", "digits", "first", "then", "check", "result", "with", "python",
          "so", "answer", "is", "number", "value", "list", "we", "need", "to", "verify", "this", "step")


def make_workload(tokenizer, groups: int, n: int, tool_turns: int, seed: int):
  """Prompts (chat-rendered token ids) and per-episode scripted turns (token ids)."""
  rng = np.random.default_rng(seed)
  prompts, scripts = [], []
  for g in range(groups):
    q = f"Question {g}: what is {rng.integers(10, 99)} times {rng.integers(10, 99)}? Use the code tool."
    text = tokenizer_lib.render_chat(tokenizer, [{"role": "user", "content": q}], tools=[TOOL_SCHEMA],
                                     add_generation_prompt=True)
    prompts.append(tokenizer.encode(text, add_special_tokens=False))
    for _ in range(n):
      turns = []
      for t in range(tool_turns + 1):
        words = " ".join(rng.choice(_WORDS, size=int(rng.integers(8, 57))))  # ~16-112 tokens
        if t < tool_turns:
          code = f"print({rng.integers(100, 999)} * {rng.integers(100, 999)})"
          call = json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
          turns.append(f"{words}\n<tool_call>\n{call}\n</tool_call>")
        else:
          turns.append(f"{words}. The answer is \\boxed{{{rng.integers(1000, 9999)}}}.<|im_end|>")
      scripts.append([tokenizer.encode(t, add_special_tokens=False) for t in turns])
  return prompts, scripts


def tool_output(code: str) -> ExecResult:
  """Deterministic stand-in output: the product, then 0-5 more lines (so tool responses vary in length)."""
  nums = [int(x) for x in re.findall(r"\d+", code)] or [0]
  value = int(np.prod(nums))
  lines = [str(value)] + [f"check {i}: {value + i}" for i in range(value % 6)]
  return ExecResult("ok", stdout="\n".join(lines) + "\n")


@dataclasses.dataclass
class ReprefillStats:
  prefilled_tokens: int = 0
  padded_prefill_tokens: int = 0


def run_reprefill(sampler, params, prompts, scripts, n, tokenizer, executor, cfg: RolloutConfig, key):
  """The re-prefill loop: every turn, prefill each episode's whole chat so far into a fresh cache.

  Synchronous per turn (all episodes decode their turn, then all their tools run), as an agentic rollout that
  calls a stateless generate() per turn does. Returns (response token lists, stats).
  """
  stats = ReprefillStats()
  renderer = ToolResponseRenderer(tokenizer)
  episodes = [(g, s) for g in range(len(prompts)) for s in range(n)]
  resp = [[] for _ in episodes]
  live = list(range(len(episodes)))
  turn = 0
  b = sampler.batch
  while live:
    for lo in range(0, len(live), b):
      chunk = live[lo:lo + b]
      ctx = [list(prompts[episodes[e][0]]) + resp[e] for e in chunk]
      t = bucket(max(len(c) for c in ctx), cfg.prompt_bucket_min)
      rows = len(chunk)
      tokens = np.zeros((b, t), np.int32)
      lengths = np.zeros((b,), np.int32)
      forced = np.full((b, sampler.n_forced), -1, np.int32)
      for i, (e, c) in enumerate(zip(chunk, ctx)):
        tokens[i, :len(c)] = c
        lengths[i] = len(c)
        script = scripts[e][turn] if turn < len(scripts[e]) else []
        forced[i, :len(script)] = script
        stats.prefilled_tokens += len(c)
      stats.padded_prefill_tokens += b * t
      slots = np.full((b,), b, np.int32)
      slots[:rows] = np.arange(rows)
      budgets = np.full((b,), cfg.max_response_len, np.int32)
      state = sampler.init(bucket(t + cfg.segment_len, cfg.cache_bucket_min), jax.random.fold_in(key, turn))
      state, draw = sampler.prefill_groups(1, params, state, tokens, lengths, slots, budgets, forced)
      draw = jax.device_get(draw)
      new = [[int(draw.token[i])] for i in range(rows)]
      running = [draw.stop_reason[i] == StopReason.RUNNING for i in range(rows)]
      drawn = 1
      while any(running):
        need = t + drawn + cfg.segment_len
        if need > state.capacity:
          state = sampler.grow(state, bucket(need, cfg.cache_bucket_min))
        state, seg = sampler.decode(params, state, jnp.int32(cfg.segment_len), jnp.int32(2**31 - 1))
        seg = jax.device_get(seg)
        drawn += cfg.segment_len
        for i in range(rows):
          new[i].extend(seg.tokens[i, :int(seg.num[i])].tolist())
          running[i] = bool(seg.active[i])
      del state
      for i, e in enumerate(chunk):
        resp[e].extend(new[i])
    # tools for every episode that paused at a call, all at once
    futures, nxt = {}, []
    for e in live:
      text = tokenizer.decode(resp[e][-_turn_len(resp[e], tokenizer):], skip_special_tokens=False)
      calls = parse_tool_calls(text, cfg.tool_names) if resp[e][-1] in sampler.sampling.tool_end_token_ids else []
      if calls and calls[0].ok:
        futures[e] = executor.submit(prepare_code(calls[0].code))
        nxt.append(e)
    for e in nxt:
      out = format_result(futures[e].result(), cfg.max_tool_output_chars)
      resp[e].extend(renderer.chunk(resp[e][-1], [out])[1:])
    live = nxt
    turn += 1
  return resp, stats


def _turn_len(resp, tokenizer) -> int:
  """Tokens of the last assistant turn (after the last '<|im_start|>assistant\\n')."""
  start = tokenizer.convert_tokens_to_ids(tokenizer_lib.IM_START)
  for i in range(len(resp) - 1, -1, -1):
    if resp[i] == start:
      return len(resp) - i
  return len(resp)


def run(args) -> dict:
  cfg_model = ModelConfig.by_name(args.size)
  tok = tokenizer_lib.tiny_tokenizer()
  if cfg_model.vocab_size < len(tok):
    raise SystemExit(f"{args.size}: vocab {cfg_model.vocab_size} < tokenizer {len(tok)}")
  model = Qwen(cfg_model, rngs=nnx.Rngs(args.seed))
  graphdef, params = nnx.split(model)
  prompts, scripts = make_workload(tok, args.groups, args.n, args.tool_turns, args.seed)
  episodes = args.groups * args.n
  n_forced = max(len(t) for s in scripts for t in s)
  end_ids, tool_end_ids = stop_token_ids(tok)
  sampling = SamplingConfig(end_token_ids=end_ids, tool_end_token_ids=tool_end_ids, segment_len=args.segment_len)
  batch = episodes if args.batch is None else args.batch
  sampler = make_sampler(graphdef, cfg_model, sampling, batch=batch, n_forced=n_forced)
  executor = stub_executor(tool_output, latency_s=args.tool_latency, max_concurrency=episodes)
  base = RolloutConfig(batch_size=batch, segment_len=args.segment_len, max_prompt_len=1024, max_response_len=4096,
                       min_tool_stops=args.min_tool_stops, groups_per_prefill=args.groups_per_prefill,
                       cache_bucket_min=args.cache_bucket_min)
  variants = {"pause": base.replace(overlap_tools=False), "overlap": base.replace(overlap_tools=True)}
  default = "overlap" if base.overlap_tools else "pause"

  def ours(name, r):
    eps, st = agent_loop.run_rollout(sampler, params, prompts, n=args.n, tokenizer=tok, executor=executor,
                                     cfg=variants[name], key=jax.random.key(r), scripts=scripts)
    return eps, st

  def reprefill(r):
    return run_reprefill(sampler, params, prompts, scripts, args.n, tok, executor, base, jax.random.key(r))

  out = {"bench": "rollout", "device": common.backend_info(),
         "size": args.size, "episodes": episodes, "groups": args.groups, "n": args.n,
         "tool_turns": args.tool_turns, "tool_latency_s": args.tool_latency, "batch": batch,
         "cache_bucket_min": args.cache_bucket_min,
         "segment_len": args.segment_len, "min_tool_stops": args.min_tool_stops}
  common.log(f"[bench.rollout] warm-up (compiles) on {args.size}, {episodes} episodes")
  # Warm-up: one round of each loop; JAX's compile events say what of it was compiling (tracing, lowering and
  # XLA compilation) and how many programs each loop built. A fresh persistent compilation cache records the
  # programs, as a job's does, for the warm-cache measurement at the end.
  # (A cache configured already, e.g. JAX_COMPILATION_CACHE_DIR, is used as it is: then `cache_hits` says how
  # much of the first warm-up it served.)
  cache_dir = None
  if args.compile_cache and not jax.config.jax_compilation_cache_dir:
    cache_dir = tempfile.mkdtemp(prefix="bench_rollout_jax_cache_")
    compile_stats.enable_compilation_cache(cache_dir)
  # The process may hold programs compiled before (an earlier benchmark or test, perhaps before any persistent
  # cache was set): dropping the in-memory caches makes the warm-up compile (or load) every program it runs, so
  # its counts are a fresh process's and each of its programs is in the persistent cache for the rerun.
  jax.clear_caches()
  warm = {}
  with compile_stats.measured() as warm[default]:
    eps, st = ours(default, 0)
  other = "overlap" if default == "pause" else "pause"
  with compile_stats.measured() as warm[other]:
    ours(other, 0)
  with compile_stats.measured() as warm["reprefill"]:
    ref, rst = reprefill(0)
  out["compile_s"] = warm[default]["compile"].compile_s
  out["compiled_programs"] = warm[default]["compile"].programs
  out["cache_hits"] = warm[default]["compile"].cache_hits
  for name in (other, "reprefill"):
    out[f"{name}_compile_s"] = warm[name]["compile"].compile_s
    out[f"{name}_compiled_programs"] = warm[name]["compile"].programs
  out["warmup_s"] = {k: round(v["wall_s"], 3) for k, v in warm.items()}
  ours_resp = [e.response_ids.tolist() for e in eps]
  out["transcripts_match"] = ours_resp == ref
  out["num_tool_calls"] = int(sum(e.num_tool_calls for e in eps))
  out["stop_reasons"] = sorted({e.stop_reason for e in eps})
  out["prefilled_tokens"] = st.prefilled_tokens
  out["expected_prefill_tokens"] = (sum(len(p) for p in prompts)
                                    + sum(int((1 - e.loss_mask).sum()) for e in eps))
  out["generated_tokens"] = st.generated_tokens
  out["reprefill_prefilled_tokens"] = rst.prefilled_tokens
  out["ours_padded_prefill_tokens"] = st.padded_prefill_tokens
  out["reprefill_padded_prefill_tokens"] = rst.padded_prefill_tokens

  times = {"pause": [], "overlap": [], "reprefill": []}
  extra = {"pause": [], "overlap": []}
  # Compiles during the timed rounds, per variant. Pause and re-prefill run the same calls every round; with
  # overlap, which rows resume together follows tool timing, and so (through the batch's draws) do the lengths
  # and cache capacities, so a round may meet a capacity the warm-up did not.
  traces = {"pause": 0, "overlap": 0, "reprefill": 0}
  for r in range(args.rounds):
    for name in ("pause", "overlap"):
      t0, n0 = time.perf_counter(), sum(TRACE_COUNTS.values())
      _, st = ours(name, r + 1)
      times[name].append(time.perf_counter() - t0)
      traces[name] += sum(TRACE_COUNTS.values()) - n0
      extra[name].append(st)
    n0 = sum(TRACE_COUNTS.values())
    t0 = time.perf_counter()
    reprefill(r + 1)
    times["reprefill"].append(time.perf_counter() - t0)
    traces["reprefill"] += sum(TRACE_COUNTS.values()) - n0
    common.log(f"[bench.rollout] round {r}: pause {times['pause'][-1]:.2f} s, overlap {times['overlap'][-1]:.2f} s,"
               f" reprefill {times['reprefill'][-1]:.2f} s")
  if args.compile_cache:  # what a rerun or a restarted job pays: the same round with the in-memory caches dropped
    jax.clear_caches()
    with compile_stats.measured() as rerun:
      ours(default, 0)
    c = rerun["compile"]
    out.update(warm_cache_compile_s=c.compile_s, warm_cache_programs=c.programs, warm_cache_hits=c.cache_hits)
    if cache_dir:
      shutil.rmtree(cache_dir, ignore_errors=True)
  out["traces_in_rounds"] = traces["pause"] + traces["reprefill"]
  out["traces_in_rounds_overlap"] = traces["overlap"]
  executor.close()
  med = statistics.median
  eps_s = lambda xs: [episodes / x for x in xs]  # noqa: E731
  out["default_mode"] = default
  out["ours_episodes_s"] = med(eps_s(times[default]))
  out["reprefill_episodes_s"] = med(eps_s(times["reprefill"]))
  out["pause_episodes_s"] = med(eps_s(times["pause"]))
  out["overlap_episodes_s"] = med(eps_s(times["overlap"]))
  ratios = [p / o for p, o in zip(times["reprefill"], times[default])]
  out["speedup"] = med(ratios)
  out["compile_frac_of_round"] = out["compile_s"] / med(times[default])
  if args.compile_cache:
    out["warm_cache_compile_frac_of_round"] = out["warm_cache_compile_s"] / med(times[default])
  out["speedup_min"], out["speedup_max"] = min(ratios), max(ratios)
  out["overlap_vs_pause"] = med([p / o for p, o in zip(times["pause"], times["overlap"])])
  for name in ("pause", "overlap"):
    s = extra[name][-1]
    out[f"{name}_decode_steps"] = s.decode_steps
    out[f"{name}_extend_calls"] = s.extend_calls
    out[f"{name}_decode_calls"] = s.decode_calls
    out[f"{name}_tool_wait_s"] = s.tool_wait_s
  out["seconds"] = {k: [round(x, 3) for x in v] for k, v in times.items()}
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="bench_5m")
  p.add_argument("--groups", type=int, default=16)
  p.add_argument("--n", type=int, default=4)
  p.add_argument("--batch", type=int, default=None, help="row slots; default: all episodes at once")
  p.add_argument("--tool-turns", type=int, default=4)
  p.add_argument("--tool-latency", type=float, default=0.05)
  p.add_argument("--segment-len", type=int, default=64)
  p.add_argument("--min-tool-stops", type=int, default=1)
  p.add_argument("--groups-per-prefill", type=int, default=16)
  p.add_argument("--cache-bucket-min", type=int, default=RolloutConfig.cache_bucket_min,
                 help="smallest KV cache capacity of both loops (RolloutConfig.cache_bucket_min)")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--no-compile-cache", dest="compile_cache", action="store_false",
                 help="skip the persistent-cache (rerun) measurement")
  args, scale = guard.parse_args(p, argv, SMOKE)
  common.start_backend("rollout")
  line = run(args)
  failures = guard.judge("rollout", line, scale, args.check)
  print(json.dumps(line), flush=True)
  guard.exit_on(failures)


if __name__ == "__main__":
  main()
