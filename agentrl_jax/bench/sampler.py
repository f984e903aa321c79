"""Sampler benchmark: ours vs `transformers` generate (torch CPU) vs Tunix's sampler; one JSON line per size.

    python -m agentrl_jax.bench.sampler                                   # bench_5m and bench_58m
    python -m agentrl_jax.bench.sampler --smoke                           # bench_5m, 64 tokens (the guard's test)
    python -m agentrl_jax.bench.sampler --sizes tiny_qwen3 --new-tokens 16 --rounds 1 --no-check   # a quick look

One random-weight Qwen3 per size is saved once as a HF directory (by transformers) and loaded by all three:
ours (`hf_io.load_hf_checkpoint` -> `sampling.generate`), transformers (`generate`, sdpa attention, torch CPU)
and Tunix (`tunix.generate.sampler.Sampler` on its own Qwen3 from the same safetensors, in .venv-tunix, as a
subprocess: see sampler_tunix.py). Same prompts (B=16 x 64 random ids), 256 new tokens per row, sampling at
temperature 1 with no top-k/top-p, no stop token (every row draws all 256), float32. Ours and Tunix also
return per-token log-probs; HF does not (less work for HF).

Each round, interleaved so all sides see the same machine load: matmul peak, memory bandwidth, ours, HF,
Tunix. Compilation/warm-up happens before the rounds; so does, on XLA:CPU, the one split of the layers' weights
our decode makes per weight version (`sampling.sampler._LayerParts`: a rollout pays it once per update, as the
rounds' generate calls all use one version). torch runs with whichever of 1 thread or its default
thread count is faster on a short calibration (on a shared 2-core machine, torch's 2 OpenMP threads spin
against other processes: 15x slower here), reported as hf_threads.

Fields: *_tok_s = B * new_tokens / seconds (median over rounds; *_min/_max spread); speedup_* = median of
per-round ratios. roofline_frac = ideal / ours, ideal = prefill + sum over the 256 steps of
max(FLOPs / matmul peak, bytes read / memory bandwidth), where FLOPs = 2 * matmul params * B (+ attention over
the context so far) and bytes = the weights a step reads (f32: all but an untied input embedding table, of which
only B rows are read) + the K/V cache of the context so far; peak and bandwidth are measured in the same round.
xla_step_floor_ms = a decode step reduced to its matrix products (`make_step_floor`), timed in the same
round: no XLA:CPU decode step can be faster, so speedup_hf_at_step_floor, speedup_tunix_at_step_floor and
roofline_frac_at_step_floor bound what any XLA:CPU sampler reaches here.

Guard (`bench.guard`): the decode step over the floor and the speedups over Tunix and HF, each measured within the
run, are held to thresholds; a figure that falls short exits with status 1 (`--no-check` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import compile_stats
from agentrl_jax.bench import common, guard
from agentrl_jax.models import attention_kernels, hf_io
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.sampling import generate as generate_lib
from agentrl_jax.sampling.config import SamplingConfig
from agentrl_jax.sampling.sampler import TRACE_COUNTS, make_sampler


# --smoke (the guard's slow test): bench_5m at a quarter of the tokens, Tunix as usual, HF left out (later flags
# still override these).
SMOKE = ("--sizes", "bench_5m", "--new-tokens", "64", "--rounds", "3", "--repeats", "2", "--matmul-n", "1024",
         "--mem-mb", "64", "--no-hf")


def memory_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
  """Best bytes/s of a jitted full read (sum) of an f32 array of `nbytes` (well beyond the L3 cache)."""
  x = jnp.ones((nbytes // 4,), jnp.float32)
  f = jax.jit(jnp.sum)
  jax.block_until_ready(f(x))
  return nbytes / min(common.timed(lambda: f(x)) for _ in range(repeats))


def ideal_seconds(cfg: ModelConfig, batch: int, prompt_len: int, new_tokens: int, peak: float, bw: float) -> float:
  """Roofline time of prefill + `new_tokens` decode steps (see the module docstring)."""
  n_mm = common.matmul_params(cfg)
  # Weights read per step: everything but an untied input embedding table, of which a step reads B rows.
  table = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size
  weights = 4.0 * (cfg.param_count() - table + batch * cfg.hidden_size)
  kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4.0  # bytes per cached token (f32)
  attn_per_ctx = 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim  # QK + PV FLOPs per query per key
  prefill_flops = batch * (2.0 * n_mm * prompt_len + attn_per_ctx * prompt_len * (prompt_len + 1) / 2)
  total = max(prefill_flops / peak, weights / bw)
  for step in range(1, new_tokens):  # the first token comes from the prefill
    ctx = prompt_len + step
    flops = batch * (2.0 * n_mm + attn_per_ctx * ctx)
    read = weights + batch * ctx * kv_per_token
    total += max(flops / peak, read / bw)
  return total


def make_step_floor(cfg: ModelConfig, batch: int, ctx: int, steps: int = 16, repeats: int = 3
                    ) -> Callable[[], float]:
  """A timer of one decode step reduced to its matrix products, as XLA:CPU runs them: compiled once, each call
  returns the best of `repeats` runs, in seconds per step.

  Per layer, in dependency order: x -> q, k, v projections -> scores (q @ keys) -> probs @ values -> output
  projection -> gate, up -> down; then the LM head; `steps` such steps in one compiled loop. Fresh weights
  of the model's shapes and a `[B, K, H, ctx]` / `[B, K, ctx, H]` cache per layer, so they come from memory
  as in a real step. Nothing else: no norms, rotary, softmax, sampling or cache writes. No decode step built
  on XLA:CPU's matmul kernels can be faster (compiled with XLA:CPU's default options and with the decode
  program's, the faster counts); `ideal / this` bounds the roofline fraction such a sampler
  reaches, and `hf / this` its speedup over transformers.
  """
  d, f, h, nk, g = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_kv_heads, cfg.num_groups
  n_q, n_kv = cfg.num_heads * h, nk * h
  keys = iter(jax.random.split(jax.random.key(0), 16 * cfg.num_layers + 4))
  rand = lambda *shape: 0.02 * jax.random.normal(next(keys), shape, jnp.float32)  # noqa: E731
  layers = [dict(q=rand(d, n_q), k=rand(d, n_kv), v=rand(d, n_kv), o=rand(n_q, d), gate=rand(d, f), up=rand(d, f),
                 down=rand(f, d), keys=rand(batch, nk, h, ctx), values=rand(batch, nk, ctx, h))
            for _ in range(cfg.num_layers)]
  head = rand(d, cfg.vocab_size)
  dims = (((3,), (2,)), ((0, 1), (0, 1)))

  def step(_, x):
    for w in layers:
      q = (x @ w["q"]).reshape(batch, nk, g, h)
      new_kv = jnp.sum(x @ w["k"], -1, keepdims=True) + jnp.sum(x @ w["v"], -1, keepdims=True)
      scores = jax.lax.dot_general(q, w["keys"], dims)
      out = jax.lax.dot_general(scores, w["values"], dims).reshape(batch, n_q)
      x = out @ w["o"] + 1e-30 * new_kv
      x = ((x @ w["gate"]) * (x @ w["up"])) @ w["down"]
    return x + 1e-30 * (x @ head)[:, :d]

  x0 = rand(batch, d)
  lowered = jax.jit(lambda x: jax.lax.fori_loop(0, steps, step, x)).lower(x0)
  # Compiled as XLA:CPU does by default and as a small model's decode program is (YNNPACK for reductions only): the
  # faster of the two is the floor.
  runs = [lowered.compile()]
  if (options := attention_kernels.sampler_compiler_options()) is not None:  # no model: a small model's
    runs.append(lowered.compile(compiler_options=options))
  for run in runs:
    jax.block_until_ready(run(x0))
  return lambda: min(common.timed(lambda: run(x0)) for _ in range(repeats) for run in runs) / steps


class TunixWorker(common.SideProcess):
  """The sampler_tunix.py subprocess (protocol in its docstring)."""

  def __init__(self, python: str, hf_dir: str, prompts_path: str, new_tokens: int):
    super().__init__(python, "sampler_tunix.py",
                     ["--hf-dir", hf_dir, "--prompts", prompts_path, "--new-tokens", str(new_tokens)])

  def run(self, n: int) -> list[float]:
    return super().run(n)["times"]


def _hf_generate(model, prompts: np.ndarray, new_tokens: int, seed: int):
  import torch  # pylint: disable=import-outside-toplevel
  torch.manual_seed(seed)
  ids = torch.as_tensor(prompts, dtype=torch.long)
  with torch.no_grad():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=True,
                         temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0)
  assert out.shape == (prompts.shape[0], prompts.shape[1] + new_tokens), out.shape
  return out


def _hf_threads(model, prompts: np.ndarray) -> int:
  """1 or torch's default thread count, whichever runs a short generate faster."""
  import torch  # pylint: disable=import-outside-toplevel
  default = torch.get_num_threads()
  best = None
  for threads in sorted({1, default}):
    torch.set_num_threads(threads)
    _hf_generate(model, prompts, 4, 0)
    t = min(common.timed(lambda: _hf_generate(model, prompts, 8, 0)) for _ in range(2))
    if best is None or t < best[0]:
      best = (t, threads)
  torch.set_num_threads(best[1])
  return best[1]


def run_size(size: str, args) -> dict:
  cfg = ModelConfig.by_name(size)
  b, plen, new = args.batch, args.prompt_len, args.new_tokens
  workdir = tempfile.mkdtemp(prefix=f"bench_sampler_{size}_")
  hf_dir = hf_io.save_random_checkpoint(cfg, os.path.join(workdir, "hf"), seed=args.seed)
  prompts = np.random.default_rng(args.seed).integers(1, cfg.vocab_size, (b, plen)).astype(np.int32)
  prompts_path = os.path.join(workdir, "prompts.npy")
  np.save(prompts_path, prompts)
  out = {"bench": "sampler", "device": common.backend_info(),
         "size": size, "params": cfg.param_count(), "batch": b, "prompt_len": plen,
         "new_tokens": new, "dtype": "float32"}

  # ---------------------------------------------------------------- ours
  model = hf_io.load_hf_checkpoint(hf_dir)
  graphdef, params = nnx.split(model)
  sampler = make_sampler(graphdef, model.cfg, SamplingConfig(segment_len=args.segment_len), batch=b)
  prompt_list = prompts.tolist()
  ours_call = lambda seed: generate_lib.generate(sampler, params, prompt_list, key=jax.random.key(seed),
                                                 max_new_tokens=new)
  common.log(f"[bench.sampler] {size}: compiling ours")
  traces0 = sum(TRACE_COUNTS.values())
  with compile_stats.measured() as first:
    res = ours_call(0)
  out["compile_s"] = first["wall_s"]  # compile + first call, as the Tunix side measures its own
  out["compile_events_s"], out["compiled_programs"] = first["compile"].compile_s, first["compile"].programs
  out["traces"] = sum(TRACE_COUNTS.values()) - traces0
  assert all(len(t) == new for t in res.tokens), [len(t) for t in res.tokens]

  # ---------------------------------------------------------------- peers
  hf = None
  if not args.no_hf:
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    out["hf_attn"] = hf.config._attn_implementation  # pylint: disable=protected-access
    out["hf_threads"] = _hf_threads(hf, prompts)
  worker = None
  if not args.no_tunix:
    python = common.tunix_python()
    if python is None:
      raise SystemExit(f"{common.TUNIX_VENV} is missing: create it with `python3.11 -m venv .venv-tunix && "
                       f".venv-tunix/bin/pip install -r {common.TUNIX_REQUIREMENTS}` (or pass --no-tunix)")
    common.log(f"[bench.sampler] {size}: starting Tunix (load + compile)")
    worker = TunixWorker(python, hf_dir, prompts_path, new)
    out["tunix_compile_s"] = worker.first["compile_s"]
    out["tunix_device"] = {k: worker.first.get(k) for k in ("backend", "device_kind", "device_count")}
    assert all(n == new for n in worker.first["new_tokens_per_row"]), worker.first

  # ---------------------------------------------------------------- rounds
  tokens = b * new
  rows = {k: [] for k in ("ours", "hf", "tunix", "peak", "bw", "ideal", "floor")}
  step_floor = make_step_floor(cfg, b, plen + new // 2)
  try:
    for r in range(args.rounds):
      rows["peak"].append(common.matmul_peak_flops(args.matmul_n, repeats=args.matmul_repeats))
      rows["bw"].append(memory_bandwidth(args.mem_mb << 20))
      rows["ideal"].append(ideal_seconds(cfg, b, plen, new, rows["peak"][-1], rows["bw"][-1]))
      rows["floor"].append(step_floor())
      rows["ours"].append(min(common.timed(lambda: ours_call(1 + r * args.repeats + i).tokens)
                              for i in range(args.repeats)))
      msg = (f"round {r}: peak {rows['peak'][-1] / 1e9:.0f} GFLOP/s, bw {rows['bw'][-1] / 1e9:.1f} GB/s, "
             f"ideal {rows['ideal'][-1]:.3f} s, ours {rows['ours'][-1]:.3f} s")
      if hf is not None:
        rows["hf"].append(min(common.timed(lambda: _hf_generate(hf, prompts, new, r * args.repeats + i))
                              for i in range(args.repeats)))
        msg += f", hf {rows['hf'][-1]:.3f} s"
      if worker is not None:
        rows["tunix"].append(min(worker.run(args.repeats)))
        msg += f", tunix {rows['tunix'][-1]:.3f} s"
      common.log(f"[bench.sampler] {size} " + msg)
  finally:
    if worker is not None:
      worker.close()

  med = statistics.median
  tok_s = lambda xs: [tokens / x for x in xs]  # noqa: E731
  out["ours_tok_s"] = med(tok_s(rows["ours"]))
  out["ours_tok_s_min"], out["ours_tok_s_max"] = min(tok_s(rows["ours"])), max(tok_s(rows["ours"]))
  for peer in ("hf", "tunix"):
    if rows[peer]:
      ratios = [p / o for p, o in zip(rows[peer], rows["ours"])]
      out[f"{peer}_tok_s"] = med(tok_s(rows[peer]))
      out[f"speedup_{peer}"] = med(ratios)
      out[f"speedup_{peer}_min"], out[f"speedup_{peer}_max"] = min(ratios), max(ratios)
    else:
      out[f"{peer}_tok_s"] = None
  fracs = [i / o for i, o in zip(rows["ideal"], rows["ours"])]
  out["roofline_frac"] = med(fracs)
  out["roofline_frac_min"], out["roofline_frac_max"] = min(fracs), max(fracs)
  out["peak_gflops"] = med(rows["peak"]) / 1e9
  out["mem_gbs"] = med(rows["bw"]) / 1e9
  out["ideal_step_ms"] = med(rows["ideal"]) / new * 1e3
  out["ours_step_ms"] = med(rows["ours"]) / new * 1e3
  # Evidence for what XLA:CPU allows: a step of nothing but its matrix products (at the mean context), and the
  # speedup over HF and the roofline fraction a sampler whose step cost only that would reach.
  out["xla_step_floor_ms"] = med(rows["floor"]) * 1e3
  if rows["hf"]:
    out["speedup_hf_at_step_floor"] = med(rows["hf"]) / new / med(rows["floor"])
  if rows["tunix"]:
    out["speedup_tunix_at_step_floor"] = med(rows["tunix"]) / new / med(rows["floor"])
  out["roofline_frac_at_step_floor"] = out["ideal_step_ms"] / out["xla_step_floor_ms"]
  out["rounds"] = args.rounds
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sizes", default="bench_5m,bench_58m")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--new-tokens", type=int, default=256)
  p.add_argument("--segment-len", type=int, default=64, help="decode steps per compiled call")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--repeats", type=int, default=2, help="timed calls per round for ours and Tunix (best kept)")
  p.add_argument("--matmul-n", type=int, default=2048)
  p.add_argument("--matmul-repeats", type=int, default=5)
  p.add_argument("--mem-mb", type=int, default=256, help="array read to measure memory bandwidth (> L3 cache)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--no-hf", action="store_true")
  p.add_argument("--no-tunix", action="store_true")
  args, scale = guard.parse_args(p, argv, SMOKE)
  common.start_backend("sampler")
  failures = []
  for size in args.sizes.split(","):
    line = run_size(size, args)
    failures += guard.judge("sampler", line, scale, args.check)
    print(json.dumps(line), flush=True)
  guard.exit_on(failures)


if __name__ == "__main__":
  main()
