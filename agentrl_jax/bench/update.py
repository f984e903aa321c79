"""Benchmark of the compiled GRPO update step vs Tunix's GRPO loss-and-gradient step; prints ONE JSON line.

    python -m agentrl_jax.bench.update                     # bench_58m, B=2 x T=1024, fp32, CPU
    python -m agentrl_jax.bench.update --smoke             # bench_5m, 2 x 256 tokens (the guard's test)
    python -m agentrl_jax.bench.update --model tiny_qwen3 --batch 2 --seq 64 --rounds 1 --no-check   # a quick look

Same weights (a random `ModelConfig.bench_58m()` exported once with `hf_io.export_hf` and loaded by Tunix from
that directory), same tokens, loss mask (prompt 0, a tool-output span 0, the rest 1), advantages and old
log-probs (ours recomputed, then perturbed so every clip branch is active). Both steps: forward -> token
log-probs and entropy -> GRPO clip-higher token-mean loss -> gradients -> global-norm clip 1.0 -> AdamW.
Tunix runs in its own venv (.venv-tunix: it pins safetensors<0.8, which our pinned transformers cannot use)
as a subprocess; the two are timed in alternating rounds, each round also measuring the matmul peak, so all
three see the same machine load.

Fields: mfu = model FLOPs/s of our best step / the best matmul FLOP/s of the run (model FLOPs per
common.train_flops_per_token: 6 N + 12 L n_heads head_dim P / T per token, PaLM's convention with attention
counted as each side's kernel computes it: P query-key pairs per head, T (T + 256) / 2 for our blocked causal
attention, the whole T x T square for Tunix's dense one on a CPU; `flops_formula` states it); tok_s /
tunix_tok_s = B*T / best step seconds; speedup = their ratio. Best-of-run because on a shared machine every
slower sample measured someone else's load; *_median fields (median of per-round bests) and the per-round
ratios speedup_round_* show the spread. loss_rel_diff compares the two first-step losses (same math check).
cpu_share_median = process CPU seconds / (wall seconds x cores) during the timed steps: below 1, other
processes had part of the cores (the step's MFU is then capped at about that share of the matmul peak).
xla_step_floor_s = the step reduced to its matrix products, forward and backward (`make_step_floor`), timed
each round: no XLA:CPU update is faster, so mfu_at_step_floor and speedup_at_step_floor bound what any update on
XLA:CPU's matmul kernels reaches here.
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
from agentrl_jax.models import hf_io
from agentrl_jax.models import sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.qwen import Qwen
from agentrl_jax.rl import losses
from agentrl_jax import train_state as train_state_lib
from agentrl_jax.rl import update as update_lib

PAD_ID = 0
# --smoke (the guard's slow test): bench_5m at 2 x 256 tokens, 3 rounds (later flags override).
SMOKE = ("--model", "bench_5m", "--seq", "256", "--chunk", "128", "--rounds", "3", "--matmul-n", "1024")


def make_batch(cfg: ModelConfig, batch: int, seq: int, prompt_len: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Tokens (never the pad id: Tunix derives its attention mask from it), loss mask with a tool span,
  per-sequence advantages."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, cfg.vocab_size, (batch, seq)).astype(np.int32)
  mask = np.zeros((batch, seq), np.float32)
  mask[:, prompt_len:] = 1
  tool = slice(prompt_len + (seq - prompt_len) // 3, prompt_len + (seq - prompt_len) // 3 + (seq - prompt_len) // 8)
  mask[:, tool] = 0
  adv = rng.standard_normal(batch).astype(np.float32)
  return {"tokens": tokens, "loss_mask": mask, "advantages": adv}


def make_step_floor(cfg: ModelConfig, batch: int, seq: int, chunk: int, repeats: int = 2
                    ) -> Callable[[], float]:
  """A timer of the update's matrix products alone, forward and backward, as XLA:CPU runs them: compiled once,
  each call returns the best of `repeats` runs in seconds.

  Per layer: the q, k, v projections, causal attention by query blocks of `cfg.attention_block` (scores and
  values over the keys up to the block's end, as the model computes them), the output projection, gate, up and
  down; then the LM head over T-chunks of `chunk` tokens; `jax.grad` of their sum with respect to every weight
  builds the backward products (two per forward product). Fresh weights of the model's shapes; nothing else:
  no norms, rotary, softmax, log-probs, loss, clipping or optimizer. No update step built on XLA:CPU's matmul
  kernels can be faster, so `flops / this / peak` bounds its MFU and `tunix / this` its speedup over Tunix.
  """
  d, f, h, nk, g, n = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_kv_heads, cfg.num_groups,
                       cfg.num_heads)
  keys = iter(jax.random.split(jax.random.key(0), 8 * cfg.num_layers + 2))
  rand = lambda *shape: 0.02 * jax.random.normal(next(keys), shape, jnp.float32)  # noqa: E731
  weights = {"layers": [dict(q=rand(d, n * h), k=rand(d, nk * h), v=rand(d, nk * h), o=rand(n * h, d),
                             gate=rand(d, f), up=rand(d, f), down=rand(f, d)) for _ in range(cfg.num_layers)],
             "head": rand(d, cfg.vocab_size)}
  block = cfg.attention_block or seq

  def products(weights, x):  # x [B, T, D]
    for w in weights["layers"]:
      q = (x @ w["q"]).reshape(batch, seq, nk, g, h)
      k, v = (x @ w["k"]).reshape(batch, seq, nk, h), (x @ w["v"]).reshape(batch, seq, nk, h)
      outs = []
      for start in range(0, seq, block):
        end = min(start + block, seq)
        scores = jnp.einsum("BTKGH,BSKH->BKGTS", q[:, start:end], k[:, :end])
        outs.append(jnp.einsum("BKGTS,BSKH->BTKGH", scores, v[:, :end]))
      x = jnp.concatenate(outs, axis=1).reshape(batch, seq, n * h) @ w["o"]
      x = ((x @ w["gate"]) * (x @ w["up"])) @ w["down"]
    return sum(jnp.sum(x[:, i:i + chunk] @ weights["head"]) for i in range(0, seq, chunk))

  run = jax.jit(jax.grad(products))
  x0 = rand(batch, seq, d)
  jax.block_until_ready(run(weights, x0))
  return lambda: min(common.timed(lambda: run(weights, x0)) for _ in range(repeats))


class TunixWorker(common.SideProcess):
  """The update_tunix.py subprocess (line protocol in its docstring)."""

  def __init__(self, python: str, hf_dir: str, batch_path: str):
    super().__init__(python, "update_tunix.py", ["--hf-dir", hf_dir, "--batch", batch_path])

  def run(self, n: int) -> tuple[list[float], list[float]]:
    """(wall seconds, process CPU seconds) of n steps."""
    out = super().run(n)
    return out["times"], out["cpu"]


def run(args) -> dict:
  cfg = ModelConfig.by_name(args.model, param_dtype="float32", dtype="float32", remat=args.remat)
  b, t = args.batch, args.seq
  prompt_len = args.prompt_len if args.prompt_len is not None else t // 4
  tokens_per_step = b * t
  flops_per_step = common.train_flops_per_token(cfg, t) * tokens_per_step
  tunix_flops_per_step = common.train_flops_per_token(cfg, t, impl="dense") * tokens_per_step

  model = Qwen(cfg, rngs=nnx.Rngs(args.seed))
  workdir = tempfile.mkdtemp(prefix="bench_update_")
  hf_dir = hf_io.export_hf(model, os.path.join(workdir, "hf"))

  mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  opt_cfg = train_state_lib.OptimizerConfig(learning_rate=1e-6, grad_clip=1.0)
  loss_cfg = losses.LossConfig()  # GRPO-TCR: token-mean, clip 0.2 / 0.28, dual clip 10, no KL
  graphdef, state = train_state_lib.init_train_state(model, opt_cfg, mesh)
  del model
  shardings = train_state_lib.train_state_shardings(state, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, loss_cfg, opt_cfg, mesh,
                                     micro_batch_size=args.micro_batch or b, logits_chunk_size=args.chunk)
  logprobs = update_lib.make_logprobs_fn(graphdef, shardings.params, mesh, micro_batch_size=args.micro_batch or b,
                                         logits_chunk_size=args.chunk)

  batch = make_batch(cfg, b, t, prompt_len, args.seed)
  logp = np.asarray(logprobs(state.params, {"tokens": batch["tokens"]}))
  noise = np.random.default_rng(args.seed + 1).standard_normal(logp.shape).astype(np.float32)
  batch["old_logp"] = logp + 0.3 * noise
  batch_path = os.path.join(workdir, "batch.npz")
  np.savez(batch_path, **batch, prompt_len=prompt_len, pad_id=PAD_ID)
  batch = jax.device_put(batch, update_lib.batch_sharding(mesh))  # on device once, like Tunix's example

  out = {"bench": "update", "device": common.backend_info(),
         "model": args.model, "params": cfg.param_count(), "batch": b, "seq": t,
         "micro_batch": args.micro_batch or b, "logits_chunk": args.chunk, "dtype": "float32",
         "flops_per_token": common.train_flops_per_token(cfg, t),
         "flops_formula": common.flops_convention(cfg, t),
         "tunix_flops_per_token": common.train_flops_per_token(cfg, t, impl="dense"),
         "tunix_flops_formula": common.flops_convention(cfg, t, impl="dense")}

  common.log(f"[bench.update] compiling ours ({args.model}, B={b}, T={t})")
  with compile_stats.measured() as compiled:
    state, metrics = update(state, batch, jax.random.key(0))
    first = {k: float(v) for k, v in metrics.items()}
  out["compile_s"] = compiled["wall_s"]  # compile + first step, as the Tunix side measures its own
  out["compile_events_s"], out["compiled_programs"] = compiled["compile"].compile_s, compiled["compile"].programs

  worker = None
  python = common.tunix_python()
  if not args.no_tunix:
    if python is None:
      raise SystemExit(f"{common.TUNIX_VENV} is missing: create it from {common.TUNIX_REQUIREMENTS} "
                       "(or pass --no-tunix)")
    common.log("[bench.update] starting Tunix (load + compile)")
    worker = TunixWorker(python, hf_dir, batch_path)
    tf = worker.first
    out["tunix_compile_s"] = tf["compile_s"]
    out["tunix_device"] = {k: tf.get(k) for k in ("backend", "device_kind", "device_count")}
    out["loss"], out["tunix_loss"] = first["loss"], tf["loss"]
    out["loss_rel_diff"] = abs(first["loss"] - tf["loss"]) / max(abs(tf["loss"]), 1e-12)
    out["entropy"], out["tunix_entropy"] = first["entropy"], tf["entropy"]
    if out["loss_rel_diff"] > 1e-3:
      common.log(f"[bench.update] WARNING: first-step losses differ (ours {first['loss']}, Tunix {tf['loss']}):"
                 " the two steps do not compute the same thing (Tunix ignores rope_theta: use 1e6)")

  cores = len(os.sched_getaffinity(0))
  ours_best, tunix_best, peaks, speedups, ours_cpu, tunix_cpu, floors = [], [], [], [], [], [], []
  step_floor = make_step_floor(cfg, b, t, args.chunk)
  try:
    for r in range(args.rounds):
      peaks.append(common.matmul_peak_flops(args.matmul_n, repeats=args.matmul_repeats))
      floors.append(step_floor())
      times = []
      for i in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        state, metrics = update(state, batch, jax.random.key(i))  # the old state is donated
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)
        ours_cpu.append((time.process_time() - c0) / times[-1] / cores)
      ours_best.append(min(times))
      msg = f"round {r}: matmul {peaks[-1] / 1e9:.1f} GFLOP/s, ours {ours_best[-1]:.3f} s"
      if worker is not None:
        wall, cpu = worker.run(args.steps)
        tunix_best.append(min(wall))
        tunix_cpu += [c / w / cores for c, w in zip(cpu, wall)]
        speedups.append(tunix_best[-1] / ours_best[-1])
        msg += f", tunix {tunix_best[-1]:.3f} s (ours {speedups[-1]:.2f}x)"
      common.log("[bench.update] " + msg)
  finally:
    if worker is not None:
      worker.close()

  # The machine's peak is the best matmul seen in the whole run: a slow matmul measured someone else's load.
  peak = max(peaks)
  med = statistics.median
  out.update(mfu=flops_per_step / min(ours_best) / peak, mfu_median=flops_per_step / med(ours_best) / peak,
             tok_s=tokens_per_step / min(ours_best), tok_s_median=tokens_per_step / med(ours_best),
             peak_gflops=peak / 1e9, peak_gflops_median=med(peaks) / 1e9,
             achieved_gflops=flops_per_step / min(ours_best) / 1e9,
             cpu_share_median=med(ours_cpu), cores=cores,
             # what XLA:CPU allows: an update of nothing but its matrix products, and the MFU it would reach
             xla_step_floor_s=min(floors), mfu_at_step_floor=flops_per_step / min(floors) / peak)
  if worker is not None:
    out.update(tunix_tok_s=tokens_per_step / min(tunix_best), tunix_tok_s_median=tokens_per_step / med(tunix_best),
               tunix_mfu=tunix_flops_per_step / min(tunix_best) / peak, tunix_cpu_share_median=med(tunix_cpu),
               speedup=tokens_per_step / min(ours_best) / (tokens_per_step / min(tunix_best)),
               speedup_round_median=med(speedups), speedup_round_min=min(speedups),
               speedup_round_max=max(speedups), speedup_at_step_floor=min(tunix_best) / min(floors))
  else:
    out["tunix_tok_s"] = None
  out["rounds"], out["steps_per_round"] = args.rounds, args.steps
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="bench_58m")
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--seq", type=int, default=1024)
  p.add_argument("--prompt-len", type=int, default=None, help="default seq // 4")
  p.add_argument("--micro-batch", type=int, default=None, help="default: the whole batch")
  p.add_argument("--chunk", type=int, default=512, help="T-chunk of the fused LM head + log-softmax")
  p.add_argument("--remat", action="store_true")
  p.add_argument("--rounds", type=int, default=4)
  p.add_argument("--steps", type=int, default=2, help="timed steps per round (per side)")
  p.add_argument("--matmul-n", type=int, default=2048)
  p.add_argument("--matmul-repeats", type=int, default=8)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--no-tunix", action="store_true")
  args, scale = guard.parse_args(p, argv, SMOKE)
  common.start_backend("update")
  line = run(args)
  failures = guard.judge("update", line, scale, args.check)
  print(json.dumps(line), flush=True)
  guard.exit_on(failures)


if __name__ == "__main__":
  main()
