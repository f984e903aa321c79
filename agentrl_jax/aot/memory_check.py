"""The memory plan (`models.memory_plan`) against the TPU compiler's own plan of the same programs.

    python -m agentrl_jax.aot.memory_check [--models qwen3_4b,qwen2p5_7b] [--slices v5e-16,v5p-16,v6e-16] [--json]

For each model and slice, at the recipe's context (prompt 2,560 + response 20,480 = 23,040 tokens), bf16 compute
on float32 master weights, FSDP over every chip: the RL update step with one 23,040-token row per device and
micro-batch (remat, splash attention) and a rollout decode segment over the rows the plan says fit (ragged
paged attention over a cache of 23,040 slots per row), compiled for the slice by the real TPU compiler. It
prints the plan's per-device bytes beside the compiler's (`compiled.memory_analysis()`: arguments + outputs -
donated + temporaries + code) and their ratio; the README's memory table comes from this command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp

from agentrl_jax.aot import programs as programs_lib
from agentrl_jax.aot import report, target as target_lib
from agentrl_jax.models import memory_plan, qwen_tokenizer
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import losses
from agentrl_jax import train_state as train_state_lib
from agentrl_jax.rl import update as update_lib
from agentrl_jax.rollout.config import RolloutConfig

SEQ = 2560 + 20480
# Slices by their Cloud TPU names and the topology libtpu describes them by.
SLICES = {"v5e-16": "v5e:4x4", "v5p-16": "v5p:2x2x2", "v6e-16": "v6e:4x4", "v5e-8": "v5e:2x4", "v6e-8": "v6e:2x4",
          "v5p-32": "v5p:2x2x4", "v5e-64": "v5e:8x8", "v6e-64": "v6e:8x8"}
GIB = float(1 << 30)


@dataclasses.dataclass
class Check:
  """Per device, GiB: the plan's numbers and the compiler's, for the update step and a decode segment."""

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

  @property
  def train_ratio(self) -> float:
    return self.compiled_train / self.plan_train

  @property
  def rollout_ratio(self) -> float:
    return self.compiled_rollout / self.plan_rollout


def check(model: str, slice_name: str) -> Check:
  """Compiles the update and a decode segment of `model` for `slice_name`; the plan's numbers beside them."""
  t = target_lib.target(SLICES[slice_name])
  chips, hbm = memory_plan.parse_slice(slice_name)
  cfg = ModelConfig.by_name(model, param_dtype="float32", dtype="bfloat16", remat=True,
                            attention_impl=_attention(t, model))
  mesh = sharding_lib.make_mesh(1, -1, 1, devices=list(t.devices))
  batch_devices = mesh.shape["data"] * mesh.shape["fsdp"]
  p = memory_plan.plan(cfg, chips=chips, hbm=hbm, seq=SEQ, rows=256, micro_rows=1)
  rows = max(p.rollout_rows_fit, batch_devices)
  p = memory_plan.plan(cfg, chips=chips, hbm=hbm, seq=SEQ, rows=rows, micro_rows=1)

  opt = train_state_lib.OptimizerConfig()
  graphdef, state = train_state_lib.abstract_train_state(cfg, opt, mesh)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, losses.LossConfig(), opt, mesh,
                                     micro_batch_size=batch_devices, logits_chunk_size=1024)
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=update_lib.batch_sharding(mesh))  # noqa
  batch = {"tokens": spec((batch_devices, SEQ), jnp.int32), "loss_mask": spec((batch_devices, SEQ), jnp.float32),
           "advantages": spec((batch_devices,), jnp.float32), "old_logp": spec((batch_devices, SEQ), jnp.float32)}
  fl, hb = programs_lib.train_work(cfg, batch_devices, SEQ, backward=True)
  upd = programs_lib.Program("rl/update", f"B={batch_devices} T={SEQ}",
                             programs_lib._lowering(update, mesh, state, batch,  # pylint: disable=protected-access
                                                    jax.ShapeDtypeStruct((), jax.random.key(0).dtype)),
                             fl, hb, mesh.size)
  u, _ = report.compile_program(upd, t)

  # The rollout: the trainer's params (read in place) and moments resident, the cache of `rows` full rows.
  rcfg = RolloutConfig(batch_size=rows, max_prompt_len=2560, prompt_bucket_min=2560, max_response_len=20480 - 65,
                       pad_prefill_groups=True, extend_rows=0)
  tok = qwen_tokenizer.load("qwen2.5" if model.startswith("qwen2") else "qwen3")
  decode = next(q for q in programs_lib.rollout_programs(graphdef, cfg, tok, rcfg, mesh, state.params, n=16,
                                                         kind="rollout", temperature=1.0, top_p=1.0, top_k=0)
                if q.name.endswith("decode"))
  resident = programs_lib.device_bytes(state) - programs_lib.device_bytes(state.params)
  d, _ = report.compile_program(decode, t, resident)
  return Check(model=model, slice=slice_name, chips=chips, plan_train=p.train_total / GIB, compiled_train=u.hbm_gib,
               plan_state=(p.params + p.optimizer) / GIB, compiled_state=u.argument_gib,
               plan_activations=(p.activations_remat + p.gradients) / GIB, compiled_temp=u.temp_gib, rows=rows,
               plan_rollout=p.rollout_total / GIB, compiled_rollout=d.hbm_gib, hbm=hbm / GIB,
               update_compile_cpu_s=u.compile_cpu_s, decode_compile_cpu_s=d.compile_cpu_s)


def _attention(t: target_lib.Target, model: str) -> str:
  from agentrl_jax.models import attention_kernels

  return attention_kernels.auto_impl("tpu", device=t.devices[0], head_dim=ModelConfig.by_name(model).head_dim)


def format_checks(checks: list[Check]) -> str:
  lines = ["| model | slice (chips) | train step: plan / compiler (ratio) | of which state: plan / compiler | "
           "activations + grads: plan / compiler temps | rollout rows | rollout: plan / compiler (ratio) | HBM |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
  for c in checks:
    lines.append(f"| {c.model} | {c.slice} ({c.chips}) | {c.plan_train:.1f} / {c.compiled_train:.1f} "
                 f"({c.train_ratio:.2f}) | {c.plan_state:.1f} / {c.compiled_state:.1f} | {c.plan_activations:.1f} / "
                 f"{c.compiled_temp:.1f} | {c.rows} | {c.plan_rollout:.1f} / {c.compiled_rollout:.1f} "
                 f"({c.rollout_ratio:.2f}) | {c.hbm:.0f} |")
  return "\n".join(lines)


def main(argv=None) -> list[Check]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", default="qwen3_4b,qwen2p5_7b")
  ap.add_argument("--slices", default="v5e-16,v5p-16,v6e-16")
  ap.add_argument("--json", action="store_true")
  args = ap.parse_args(argv)
  checks = []
  for model in args.models.split(","):
    for s in args.slices.split(","):
      checks.append(check(model, s))
      print(f"  checked {model} on {s}", file=sys.stderr, flush=True)
  out = [dict(dataclasses.asdict(c), train_ratio=c.train_ratio, rollout_ratio=c.rollout_ratio) for c in checks]
  print(json.dumps(out) if args.json else format_checks(checks))
  return checks


if __name__ == "__main__":
  main()
