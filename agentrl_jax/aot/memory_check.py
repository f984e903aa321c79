"""The memory plan (`models.memory_plan`) against the TPU compiler's own plan of the same programs.

    python -m agentrl_jax.aot.memory_check [--models qwen3_4b,qwen2p5_7b] [--slices v5e-16,v5p-16,v6e-16] [--json]
        [--context 2] [--lora-rank 64] [--kv-cache-dtype float8_e4m3fn] [--seq 23040]
    python -m agentrl_jax.aot.memory_check --layouts   # the recipe's per-slice layouts (configs/*.py:v5e, :v6e)

For each model and slice, at the recipe's context (prompt 2,560 + response 20,480 = 23,040 tokens), bf16 compute
on float32 master weights, FSDP over every chip (or beside a context axis that splits each row's tokens, LoRA
adapters, a float8 cache, as the flags or a layout say): the RL update step over two micro-batches of packed
23,040-token rows, one row per row shard each, as the recipe's update accumulates them (remat, splash attention),
and a rollout decode segment over the rows the plan says fit (ragged paged attention over a cache of 23,040 slots
per row), compiled for the slice by the real TPU compiler. It
prints the plan's per-device bytes beside the compiler's (`compiled.memory_analysis()`: arguments + outputs -
donated + temporaries + code) and their ratio; the README's memory table comes from this command. The decode
program's bytes include what stays resident beside it (the AdamW moments; with LoRA the whole train state, the
sampler reading a merged copy), as the plan's rollout total does.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys

import jax
import jax.numpy as jnp

from agentrl_jax.aot import programs as programs_lib
from agentrl_jax.aot import report, target as target_lib
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import memory_plan, qwen_tokenizer
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import losses
from agentrl_jax import train_state as train_state_lib
from agentrl_jax.rl import update as update_lib
from agentrl_jax.rollout.config import RolloutConfig

PROMPT = 2560
SEQ = PROMPT + 20480
# Slices by their Cloud TPU names and the topology libtpu describes them by.
SLICES = {"v5e-16": "v5e:4x4", "v5p-16": "v5p:2x2x2", "v6e-16": "v6e:4x4", "v5e-8": "v5e:2x4", "v6e-8": "v6e:2x4",
          "v5p-32": "v5p:2x2x4", "v5e-64": "v5e:8x8", "v6e-64": "v6e:8x8"}
GIB = float(1 << 30)


@dataclasses.dataclass
class Check:
  """Per device, GiB: the plan's numbers and the compiler's, for the update step and a decode segment (with the
  train state resident beside it)."""

  model: str
  slice: str
  chips: int
  plan_train: float
  compiled_train: float
  plan_state: float
  compiled_state: float
  plan_activations: float
  compiled_temp: float
  rows: int
  plan_rollout: float
  compiled_rollout: float
  hbm: float
  update_compile_cpu_s: float
  decode_compile_cpu_s: float
  context: int = 1
  lora_rank: int = 0
  kv_cache_dtype: str = ""
  train_fits: bool = True  # False: the compiler refused the update; compiled_train is what its verdict said it needs
  rollout_fits: bool = True

  @property
  def train_ratio(self) -> float:
    return self.compiled_train / self.plan_train

  @property
  def rollout_ratio(self) -> float:
    return self.compiled_rollout / self.plan_rollout


def check(model: str, slice_name: str, *, context: int = 1, lora_rank: int = 0, kv_cache_dtype: str = "",
          rows: int = 0, seq: int = SEQ) -> Check:
  """Compiles the update and a decode segment of `model` for `slice_name`; the plan's numbers beside them.

  Args:
    context: each training row's tokens split over this many chips (context parallelism; fsdp takes the rest).
    lora_rank: LoRA adapters of this rank (alpha 2 x rank) on every projection; 0: full fine-tuning.
    kv_cache_dtype: the rollout cache's storage ("": bf16).
    rows: rollout rows (0: as many as the plan fits).
    seq: tokens of a training row and of a rollout row (the prompt's 2,560 and the response's rest).
  """
  if seq <= PROMPT + 128:
    raise ValueError(f"memory_check: seq={seq} leaves no response after the {PROMPT}-token prompt")
  t = target_lib.target(SLICES[slice_name])
  chips, hbm = memory_plan.parse_slice(slice_name)
  cfg = ModelConfig.by_name(model, param_dtype="float32", dtype="bfloat16", remat=True,
                            attention_impl=_attention(t, model), kv_cache_dtype=kv_cache_dtype)
  mesh = sharding_lib.make_mesh(1, -1, 1, devices=list(t.devices), context=context)
  batch_devices = mesh.shape["data"] * mesh.shape["fsdp"]  # training rows: one per row shard
  lora = lora_lib.LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank) if lora_rank else None
  plan = functools.partial(memory_plan.plan, cfg, chips=chips, hbm=hbm, seq=seq, micro_rows=1, context=context,
                           lora=lora)
  rows = rows or max(plan(rows=256).rollout_rows_fit, chips)
  p = plan(rows=rows)

  opt = train_state_lib.OptimizerConfig()
  graphdef, state = train_state_lib.abstract_train_state(cfg, opt, mesh, lora)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, losses.LossConfig(), opt, mesh,
                                     micro_batch_size=batch_devices, logits_chunk_size=1024)
  # Two micro-batches of packed rows, as the recipe's update runs them (a gradient accumulator beside each
  # micro-batch's gradients; positions and segment ids).
  rows_b = 2 * batch_devices
  spec = lambda dtype: jax.ShapeDtypeStruct((rows_b, seq), dtype, sharding=update_lib.batch_sharding(mesh))  # noqa
  batch = {"tokens": spec(jnp.int32), "loss_mask": spec(jnp.float32), "advantages": spec(jnp.float32),
           "old_logp": spec(jnp.float32), "positions": spec(jnp.int32), "segment_ids": spec(jnp.int32)}
  fl, hb = programs_lib.train_work(cfg, rows_b, seq, backward=True)
  upd = programs_lib.Program("rl/update", f"B={rows_b} T={seq} packed",
                             programs_lib._lowering(update, mesh, state, batch,  # pylint: disable=protected-access
                                                    jax.ShapeDtypeStruct((), jax.random.key(0).dtype)),
                             fl, hb, mesh.size)
  u, _ = report.compile_program(upd, t)

  # The rollout: the trainer's state resident (its params read in place, or with LoRA a merged compute-dtype copy
  # as the sampler's argument: `train_state.sampler_policy`), the cache of `rows` full rows.
  rcfg = RolloutConfig(batch_size=rows, max_prompt_len=PROMPT, prompt_bucket_min=PROMPT,
                       max_response_len=seq - PROMPT - 65,
                       pad_prefill_groups=True, extend_rows=0)
  tok = qwen_tokenizer.load("qwen2.5" if model.startswith("qwen2") else "qwen3")
  sgraphdef, to_sampler = train_state_lib.sampler_policy(graphdef, state.params, mesh)
  sparams = jax.eval_shape(to_sampler, state.params)
  decode = next(q for q in programs_lib.rollout_programs(sgraphdef, cfg, tok, rcfg, mesh, sparams, n=16,
                                                         kind="rollout", temperature=1.0, top_p=1.0, top_k=0)
                if q.name.endswith("decode"))
  resident = programs_lib.device_bytes(state) - (0 if lora else programs_lib.device_bytes(state.params))
  d, _ = report.compile_program(decode, t, resident)
  return Check(model=model, slice=slice_name, chips=chips, plan_train=p.train_total / GIB, compiled_train=u.hbm_gib,
               plan_state=(p.params + p.optimizer) / GIB, compiled_state=u.argument_gib,
               plan_activations=(p.activations_remat + p.gradients) / GIB, compiled_temp=u.temp_gib, rows=rows,
               plan_rollout=p.rollout_total / GIB, compiled_rollout=d.hbm_gib, hbm=hbm / GIB,
               update_compile_cpu_s=u.compile_cpu_s, decode_compile_cpu_s=d.compile_cpu_s, context=context,
               lora_rank=lora_rank, kv_cache_dtype=kv_cache_dtype, train_fits=u.fits, rollout_fits=d.fits)


def layout_checks() -> list[Check]:
  """`check` of every per-slice layout of the recipe (`rl.recipe.SLICE_LAYOUTS`), at its rollout rows."""
  from agentrl_jax.rl import recipe

  names = {v: k for k, v in SLICES.items()}
  out = []
  for (model, _), s in sorted(recipe.SLICE_LAYOUTS.items()):
    out.append(check(model, names[s["topology"]], context=s["context"], lora_rank=s["lora"], kv_cache_dtype=s["kv"],
                     rows=s["rows"]))
    print(f"  checked {model} on {s['topology']}", file=sys.stderr, flush=True)
  return out


def _attention(t: target_lib.Target, model: str) -> str:
  from agentrl_jax.models import attention_kernels

  return attention_kernels.auto_impl("tpu", device=t.devices[0], head_dim=ModelConfig.by_name(model).head_dim)


def format_checks(checks: list[Check]) -> str:
  lines = ["| model | slice (chips) | layout | train step: plan / compiler (ratio) | of which state: plan / compiler | "
           "activations + grads: plan / compiler temps | rollout rows | rollout: plan / compiler (ratio) | HBM |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|"]
  for c in checks:
    layout = ", ".join([f"context {c.context}"] * (c.context > 1) + [f"LoRA {c.lora_rank}"] * (c.lora_rank > 0)
                       + [f"{c.kv_cache_dtype} cache"] * bool(c.kv_cache_dtype)) or "FSDP"
    # A program the compiler refused: its verdict's bytes (after the compiler's own rematerialisation under
    # pressure), with no breakdown.
    refused = lambda fits: "" if fits else ", the compiler: does not fit"  # noqa: E731
    state = (f"{c.plan_state:.1f} / {c.compiled_state:.1f} | {c.plan_activations:.1f} / {c.compiled_temp:.1f}"
             if c.train_fits else f"{c.plan_state:.1f} / - | {c.plan_activations:.1f} / -")
    lines.append(f"| {c.model} | {c.slice} ({c.chips}) | {layout} | {c.plan_train:.1f} / {c.compiled_train:.1f} "
                 f"({c.train_ratio:.2f}{refused(c.train_fits)}) | {state} | {c.rows} | {c.plan_rollout:.1f} / "
                 f"{c.compiled_rollout:.1f} ({c.rollout_ratio:.2f}{refused(c.rollout_fits)}) | {c.hbm:.0f} |")
  return "\n".join(lines)


def main(argv=None) -> list[Check]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", default="qwen3_4b,qwen2p5_7b")
  ap.add_argument("--slices", default="v5e-16,v5p-16,v6e-16")
  ap.add_argument("--context", type=int, default=1, help="chips each training row's tokens are split over")
  ap.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank (0: full fine-tuning)")
  ap.add_argument("--kv-cache-dtype", default="", help="the rollout cache's storage, e.g. float8_e4m3fn")
  ap.add_argument("--seq", type=int, default=SEQ, help="tokens a row (the recipe's 23,040 by default)")
  ap.add_argument("--layouts", action="store_true",
                  help="check the recipe's per-slice layouts (rl.recipe.SLICE_LAYOUTS) instead")
  ap.add_argument("--json", action="store_true")
  args = ap.parse_args(argv)
  checks = layout_checks() if args.layouts else []
  for model in [] if args.layouts else args.models.split(","):
    for s in args.slices.split(","):
      checks.append(check(model, s, context=args.context, lora_rank=args.lora_rank,
                          kv_cache_dtype=args.kv_cache_dtype, seq=args.seq))
      print(f"  checked {model} on {s}", file=sys.stderr, flush=True)
  out = [dict(dataclasses.asdict(c), train_ratio=c.train_ratio, rollout_ratio=c.rollout_ratio) for c in checks]
  print(json.dumps(out) if args.json else format_checks(checks))
  return checks


if __name__ == "__main__":
  main()
