"""LoRA benchmark: does the sampler run the adapters unmerged or merged weights, and what LoRA does to an update.

    python -m agentrl_jax.bench.lora                          # demo_1m (the main job's model) and bench_5m
    python -m agentrl_jax.bench.lora --sizes tiny_qwen3 --new-tokens 16 --rounds 1   # smoke

One random-weight Qwen3 per size, adapters of rank `--rank` on all seven projections (B drawn at random, as after
training). Per round, interleaved so that every variant sees the same machine load:
  unmerged   `sampling.generate` with the adapted model (each projection adds x A B beside x W);
  merged     one jitted `lora.merge_params` (W + alpha / r A B, what a sampler would do once per weight update),
             then `generate` with the plain model on the merged weights (the same program as a model without
             adapters);
  update     one GRPO update (`rl.update.make_update_fn`) of the full model and of the adapters alone, on the same
             batch.
Same prompts (B x prompt_len random ids), new_tokens draws per row at T=1, no stop token, float32.

Fields: *_s medians over rounds (_min the best); unmerged_over_merged = median of per-round
generate(unmerged) / (merge + generate(merged)); merge_s is one merge; lora_update_over_full the same for
the update step; token_agreement the fraction of tokens both samplers drew alike from one key. One JSON line
per size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import zlib

from flax import nnx
import jax
import numpy as np

from agentrl_jax import train_state
from agentrl_jax.bench import common
from agentrl_jax.models import lora, sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.qwen import Qwen
from agentrl_jax.rl import losses
from agentrl_jax.rl import update as update_lib
from agentrl_jax.sampling import generate as generate_lib
from agentrl_jax.sampling.config import SamplingConfig
from agentrl_jax.sampling.sampler import make_sampler


def _random_b(params: nnx.State, key: jax.Array) -> nnx.State:
  def one(path, v):
    name = jax.tree_util.keystr(path)
    if isinstance(v, nnx.LoRAParam) and "_lora_b_" in name:
      return v.replace(0.02 * jax.random.normal(jax.random.fold_in(key, zlib.crc32(name.encode()) % 997),
                                                v.get_value().shape))
    return v

  return jax.tree_util.tree_map_with_path(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _update_timer(model, batch, mesh):
  """A timer of one update step of `model`'s train state (every param, or the adapters alone)."""
  opt = train_state.OptimizerConfig(learning_rate=1e-6)
  graphdef, state = train_state.init_train_state(model, opt, mesh)
  shardings = train_state.train_state_shardings(state, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, losses.LossConfig(), opt, mesh,
                                     micro_batch_size=batch["tokens"].shape[0], logits_chunk_size=None)
  holder = {"state": state}

  def step():
    holder["state"], m = update(holder["state"], batch, jax.random.key(0))
    return m

  common.timed(step)  # compile
  return step


def run_size(size: str, args) -> dict:
  cfg = ModelConfig.by_name(size)
  b, plen, new = args.batch, args.prompt_len, args.new_tokens
  lora_cfg = lora.LoraConfig(rank=args.rank, alpha=2.0 * args.rank)

  def fresh(adapters: bool):  # a new model with the same random base (and adapters) each time
    model = Qwen(cfg, rngs=nnx.Rngs(args.seed))
    return lora.apply(model, lora_cfg, jax.random.key(1)) if adapters else model

  base_def, base_params = nnx.split(fresh(False))
  adapted = fresh(True)
  lora_def, lora_params = nnx.split(adapted)
  lora_params = _random_b(lora_params, jax.random.key(2))
  merge = jax.jit(lambda p: lora.merge_params(lora_def, p)[1])
  sampling = SamplingConfig(segment_len=args.segment_len)
  plain_sampler = make_sampler(base_def, cfg, sampling, batch=b)
  lora_sampler = make_sampler(lora_def, cfg, sampling, batch=b)
  prompts = np.random.default_rng(args.seed).integers(1, cfg.vocab_size, (b, plen)).astype(np.int32).tolist()

  def gen(sampler, params):
    return generate_lib.generate(sampler, params, prompts, key=jax.random.key(0), max_new_tokens=new).tokens

  def merged_gen():
    return gen(plain_sampler, merge(lora_params))

  mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  rng = np.random.default_rng(args.seed)
  t = args.update_len
  batch = {"tokens": rng.integers(0, cfg.vocab_size, (args.update_rows, t)).astype(np.int32),
           "loss_mask": np.ones((args.update_rows, t), np.float32),
           "advantages": rng.standard_normal(args.update_rows).astype(np.float32),
           "old_logp": np.full((args.update_rows, t), -3.0, np.float32)}
  full_update = _update_timer(fresh(False), batch, mesh)
  lora_update = _update_timer(fresh(True), batch, mesh)

  common.log(f"[bench.lora] {size}: compiling")
  for fn in (lambda: gen(lora_sampler, lora_params), merged_gen, lambda: merge(lora_params)):
    common.timed(fn)
  rows = []
  for r in range(args.rounds):
    row = {"unmerged": common.timed(lambda: gen(lora_sampler, lora_params)),
           "merge": common.timed(lambda: merge(lora_params))}
    merged_params = merge(lora_params)
    jax.block_until_ready(merged_params)
    row["merged"] = common.timed(lambda: gen(plain_sampler, merged_params))
    row["full_update"] = common.timed(full_update)
    row["lora_update"] = common.timed(lora_update)
    rows.append(row)
    common.log(f"[bench.lora] {size} round {r}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in row.items()))
  med = lambda k: statistics.median(x[k] for x in rows)  # noqa: E731
  out = {"bench": "lora", "device": common.backend_info(), "size": size, "params": cfg.param_count(),
         "adapter_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(lora.split(lora_params)[0]))),
         "rank": args.rank, "batch": b, "prompt_len": plen, "new_tokens": new, "rounds": args.rounds,
         "update_rows": args.update_rows, "update_len": t}
  for k in ("unmerged", "merged", "merge", "full_update", "lora_update"):
    out[f"{k}_s"] = med(k)
    out[f"{k}_s_min"] = min(x[k] for x in rows)
  out["unmerged_over_merged"] = statistics.median(x["unmerged"] / (x["merge"] + x["merged"]) for x in rows)
  out["unmerged_decode_over_merged_decode"] = statistics.median(x["unmerged"] / x["merged"] for x in rows)
  out["lora_update_over_full"] = statistics.median(x["lora_update"] / x["full_update"] for x in rows)
  # From the same key both draw the same tokens until float rounding tips one draw (then the rows diverge).
  a, m = np.asarray(gen(lora_sampler, lora_params)), np.asarray(merged_gen())
  out["token_agreement"] = float(np.mean(a == m))
  return out


def main(argv=None) -> list[dict]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--sizes", nargs="+", default=["demo_1m", "bench_5m"])
  ap.add_argument("--rank", type=int, default=16)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--prompt-len", type=int, default=32)
  ap.add_argument("--new-tokens", type=int, default=128)
  ap.add_argument("--segment-len", type=int, default=32)
  ap.add_argument("--update-rows", type=int, default=8)
  ap.add_argument("--update-len", type=int, default=224)
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  common.start_backend("lora")
  outs = []
  for size in args.sizes:
    out = run_size(size, args)
    print(json.dumps(out), flush=True)
    outs.append(out)
  return outs


if __name__ == "__main__":
  main()
