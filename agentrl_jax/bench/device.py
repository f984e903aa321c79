"""Accelerator benchmark of a Qwen3-4B-shaped random-weight model: the sampler and the RL update step.

    python -m agentrl_jax.bench.device                       # on a GPU / TPU: the recipe's shapes, bf16
    python -m agentrl_jax.bench.device --smoke               # tiny shapes, float32: runs on a CPU (the test suite)

Prints one JSON line per part:
  sampler  B rows x `prompt` random prompt tokens, `new` tokens each at T=1 (no stop token): tokens/s, the
           decode step's time against the HBM roofline (weights + the K/V cache of the context read once per
           step: `roofline_frac` = ideal / measured), MFU against the chip's bf16 peak;
  update   the GRPO-TCR update (`rl.update.make_update_fn`, token-mean clip-higher loss, remat as the recipe)
           on `update_rows` x `update_seq` tokens: tokens/s and MFU (PaLM's 6N + 12LHP/T FLOPs per token, P the
           query-key pairs the attention kernel computes: causal blocks skipped; `flops_formula` states it);
both also against the ceilings measured in the same run (`measured_peaks`: a bf16 matmul's FLOP/s and an
elementwise pass's bytes/s, as `mfu_measured_peak` / `roofline_frac_measured_bw`; datasheet peaks are rarely
reached, e.g. ~790 of 989 TFLOP/s on an H200), all for the mesh's devices together, with the JAX version, the
compile seconds and programs (JAX's compile events during the first call), peak device memory where
the backend reports it, the device kind and the attention implementation (`--attention`, default "auto": the
splash kernel on TPU, XLA's blocked attention elsewhere; "ragged_paged" on a TPU also decodes over a paged
cache through the ragged paged attention kernel, where the others read the cache through the XLA path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import compile_stats
from agentrl_jax.bench import common
from agentrl_jax.models import attention_kernels, loading
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig

# bf16 dense peak FLOP/s and HBM bytes/s per chip, by `device_kind` substring (vendor data sheets).
CHIPS = (("H200", 989e12, 4.8e12), ("H100", 989e12, 3.35e12), ("A100", 312e12, 2.0e12),
         ("TPU v6", 918e12, 1.64e12), ("TPU v5p", 459e12, 2.765e12), ("TPU v5 lite", 197e12, 0.819e12),
         ("TPU v5e", 197e12, 0.819e12), ("TPU v4", 275e12, 1.2e12))


# --smoke: the shapes of a CPU run of both parts in seconds (later flags still override them).
SMOKE = ("--size", "tiny_qwen3", "--dtype", "float32", "--rows", "4", "--prompt", "16", "--new", "8", "--segment", "8",
         "--update-rows", "2", "--update-seq", "32", "--rounds", "1", "--devices", "1", "--peak-n", "256",
         "--copy-mib", "16")


def chip_specs(kind: str) -> tuple[float | None, float | None]:
  """(bf16 peak FLOP/s, HBM bytes/s) of a device kind; (None, None) for an unknown one (e.g. a CPU)."""
  for name, peak, bw in CHIPS:
    if name.lower() in kind.lower():
      return peak, bw
  return None, None


def measured_peaks(n: int, copy_mib: int, dtype) -> dict:
  """The chip's ceilings measured in this run (DESIGN.md's method): the best FLOP/s of an [n, n] x [n, n] matmul in
  `dtype`, and the best bytes/s of an elementwise pass over `copy_mib` MiB (each byte read once and written once)."""
  flops = common.matmul_peak_flops(n, dtype=jnp.dtype(dtype))
  x = jnp.zeros((copy_mib * 2**20 // 4,), jnp.float32)
  bump = jax.jit(lambda x: x + 1.0)
  jax.block_until_ready(bump(x))
  copy_s = min(common.timed(lambda: bump(x)) for _ in range(5))
  return {"measured_matmul_flops": flops, "measured_copy_bytes_s": 2 * x.nbytes / copy_s}


def _chips(mesh) -> tuple[float | None, float | None]:
  """The datasheet FLOP/s and bytes/s of the mesh's chips together (None for an unknown kind)."""
  peak, bw = chip_specs(jax.devices()[0].device_kind)
  return (peak * mesh.size if peak else None), (bw * mesh.size if bw else None)


def _peak_memory() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def decode_bytes(cfg: ModelConfig, rows: int, context: int) -> float:
  """Bytes one decode step must read: every weight that takes part in a matmul plus the K/V cache of `context`
  tokens per row (the embedding lookup reads only `rows` rows of its table)."""
  p = np.dtype(jnp.dtype(cfg.param_dtype)).itemsize
  c = np.dtype(jnp.dtype(cfg.dtype)).itemsize
  kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * c * rows * context
  return common.matmul_params(cfg) * p + kv


def _compiled(first: dict) -> dict:
  return {"compile_s": first["compile"].compile_s, "compiled_programs": first["compile"].programs,
          "compile_cache_hits": first["compile"].cache_hits, "first_call_s": first["wall_s"]}


def bench_sampler(cfg: ModelConfig, mesh, args, peaks: dict) -> dict:
  from flax import nnx

  from agentrl_jax.sampling import generate as generate_lib
  from agentrl_jax.sampling.config import SamplingConfig
  from agentrl_jax.sampling.sampler import make_sampler

  model = loading.init_model(cfg, jax.random.key(0), mesh)
  graphdef, params = nnx.split(model)
  sampler = make_sampler(graphdef, cfg, SamplingConfig(end_token_ids=(), segment_len=args.segment), batch=args.rows,
                         mesh=mesh, params=params)
  prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.rows, args.prompt)).tolist()
  run = lambda seed: generate_lib.generate(sampler, params, prompts, key=jax.random.key(seed),  # noqa: E731
                                           max_new_tokens=args.new)
  with compile_stats.measured() as first:
    run(0)
  times = []
  for r in range(args.rounds):
    t0 = time.perf_counter()
    out = run(r + 1)
    times.append(time.perf_counter() - t0)
  assert all(len(t) == args.new for t in out.tokens)
  sec = statistics.median(times)
  step_s = sec / args.new
  peak, bw = _chips(mesh)
  step_bytes = sum(decode_bytes(cfg, args.rows, args.prompt + i) for i in range(args.new)) / args.new
  ideal = step_bytes / bw if bw else None
  flops = 2.0 * common.matmul_params(cfg) * args.rows * args.new
  return {"part": "sampler", "tok_s": args.rows * args.new / sec, "step_ms": step_s * 1e3,
          "roofline_frac": ideal / step_s if ideal else None, "ideal_step_ms": ideal * 1e3 if ideal else None,
          "roofline_frac_measured_bw": step_bytes / (peaks["measured_copy_bytes_s"] * mesh.size) / step_s,
          "mfu": flops / sec / peak if peak else None,
          "mfu_measured_peak": flops / sec / (peaks["measured_matmul_flops"] * mesh.size),
          **_compiled(first), "rows": args.rows, "prompt": args.prompt, "new": args.new}


def bench_update(cfg: ModelConfig, mesh, args, peaks: dict) -> dict:
  from agentrl_jax.rl import losses
  from agentrl_jax import train_state as train_state_lib
  from agentrl_jax.rl import update as update_lib

  model = loading.init_model(cfg.replace(param_dtype="float32", remat=True), jax.random.key(1), mesh)
  opt_cfg = train_state_lib.OptimizerConfig(learning_rate=1e-6)
  graphdef, state = train_state_lib.init_train_state(model, opt_cfg, mesh)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  loss_cfg = losses.LossConfig(clip_low=0.2, clip_high=0.28)
  update = update_lib.make_update_fn(graphdef, shardings, loss_cfg, opt_cfg, mesh, micro_batch_size=args.micro_rows,
                                     temperature=1.0, logits_chunk_size=min(1024, args.update_seq))
  rng = np.random.default_rng(0)
  b, t = args.update_rows, args.update_seq
  batch = {"tokens": rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32),
           "loss_mask": np.concatenate([np.zeros((b, t // 8)), np.ones((b, t - t // 8))], 1).astype(np.float32),
           "advantages": rng.standard_normal(b).astype(np.float32),
           "old_logp": np.full((b, t), -8.0, np.float32)}
  batch = jax.device_put(batch, update_lib.batch_sharding(mesh))
  with compile_stats.measured() as first:
    state, m = update(state, batch, jax.random.key(0))
    jax.block_until_ready(m)
  times = []
  for r in range(args.rounds):
    t0 = time.perf_counter()
    state, m = update(state, batch, jax.random.key(r))
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  sec = statistics.median(times)
  peak, _ = _chips(mesh)
  flops = common.train_flops_per_token(cfg, t) * b * t
  return {"part": "update", "tok_s": b * t / sec, "step_s": sec, "mfu": flops / sec / peak if peak else None,
          "mfu_measured_peak": flops / sec / (peaks["measured_matmul_flops"] * mesh.size), **_compiled(first),
          "rows": b, "seq": t, "loss": float(m["loss"]), "flops_formula": common.flops_convention(cfg, t)}


def main(argv=None) -> list[dict]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--size", default="qwen3_4b")
  ap.add_argument("--dtype", default="bfloat16")
  ap.add_argument("--rows", type=int, default=64)
  ap.add_argument("--prompt", type=int, default=512)
  ap.add_argument("--new", type=int, default=1024)
  ap.add_argument("--segment", type=int, default=64)
  ap.add_argument("--update-rows", type=int, default=8)
  ap.add_argument("--update-seq", type=int, default=4096)
  ap.add_argument("--micro-rows", type=int, default=1)
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--parts", default="sampler,update")
  ap.add_argument("--devices", type=int, default=0, help="devices of the (fsdp) mesh; 0 = all")
  ap.add_argument("--attention", default="auto", help="attention_impl: auto, xla, splash, cudnn or ragged_paged")
  ap.add_argument("--peak-n", type=int, default=8192, help="matmul size of the in-run FLOP/s peak")
  ap.add_argument("--copy-mib", type=int, default=4096, help="MiB of the in-run memory-bandwidth pass")
  ap.add_argument("--smoke", action="store_true", help="tiny shapes in float32 (any backend; the test suite)")
  args = ap.parse_args(argv)
  if args.smoke:
    args = ap.parse_args([*SMOKE, *(sys.argv[1:] if argv is None else argv)])
  common.start_backend("device")
  impl = attention_kernels.auto_impl() if args.attention == "auto" else args.attention
  cfg = ModelConfig.by_name(args.size, param_dtype=args.dtype, dtype=args.dtype, attention_impl=impl)
  devices = jax.devices()[:args.devices or None]
  mesh = sharding_lib.make_mesh(1, -1, 1, devices=devices)
  device = {"device_kind": devices[0].device_kind, "devices": len(devices), "backend": jax.default_backend(),
            "jax": jax.__version__, "attention": impl, "size": args.size, "dtype": args.dtype,
            "params": cfg.param_count()}
  peaks = measured_peaks(args.peak_n, args.copy_mib, args.dtype)
  out = []
  for part in args.parts.split(","):
    result = {"sampler": bench_sampler, "update": bench_update}[part](cfg, mesh, args, peaks)
    result.update(device, **peaks, peak_memory_bytes=_peak_memory())
    print(json.dumps(result), flush=True)
    out.append(result)
  return out


if __name__ == "__main__":
  main()
