"""The recipe's real programs through the TPU compiler (slow: minutes of CPU each): every program of the
Qwen3-4B RL and SFT configs compiles for a v5p-16 slice (v5p:2x2x2), fits its HBM, and stays within the
compile budget, counted in compiles of a fixed reference program measured in the same process (the RL update
and the SFT step <= 40 each, every other program <= 16, a config's programs together <= 120) and in generated
code (at most a third above today's); every per-slice layout (`configs/demystify_*.py:v5e` / `:v6e`) compiles
and fits its slice, and the memory plan stays within 10% of the compiler there too.

    python -m pytest -m slow tests/aot/test_aot_recipe_slow.py
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import aot, testing
from agentrl_jax.aot import programs as programs_lib
from agentrl_jax.aot import report as report_lib
from agentrl_jax.aot import target as target_lib

pytestmark = pytest.mark.slow
TOPOLOGY = "v5p:2x2x2"
# The budget in CPU seconds of one host means nothing on another: the same RL update measured 63 CPU s on
# 2026-12-05's host, 112-179 on 2026-12-07's (idle), 146 on a CI host. So the budget is a ratio, as every
# benchmark of the project is: each program's CPU seconds over those of a reference compile in the same process
# just before, a fixed transformer training step that nothing in the package changes (`_reference_step`; the
# lower of two compiles, 4.4-6.3 CPU s on 2026-12-07). Measured that day: the RL update 23-28 references (six
# runs), the SFT step 18-24 (four), no other program above 10, the RL config 51-85. The bounds allow about
# 1.4x the highest, so host noise passes and a compile that grows like an unrolled stack (3x the update's CPU s)
# fails.
UNIT_LIMITS = {"rl/update": 40, "sft/step": 40}  # reference compiles
OTHER_UNIT_LIMIT = 16
TOTAL_UNIT_LIMIT = 120
# Generated code, deterministic for a compiler version, follows a compile's size without the host's noise
# (MB on 2026-12-07; unrolled layers give 2-25x): each program may grow by a third (and half a MB) at most.
CODE_MB = {"init/optimizer": 0.3, "rl/update": 57.6, "rl/logprobs": 13.2, "rollout/init": 0.1,
           "rollout/prefill": 16.3, "rollout/extend": 14.4, "rollout/decode": 5.0, "eval/init": 0.1,
           "eval/prefill": 20.6, "eval/extend": 14.8, "eval/decode": 5.5, "sft/step": 48.0}


def _cost(r):
  """CPU seconds of this process to lower and compile one program (`time.process_time`: all its threads)."""
  return r["compile_cpu_s"] + r.get("lower_cpu_s", 0.0)


def _reference_step(t: target_lib.Target) -> programs_lib.Program:
  """A fixed 4-layer transformer training step (scanned, rematerialised, FSDP over the slice's devices): the
  kind of program the update is, small enough to compile in a few CPU seconds."""
  layers, d, f, heads, seq, batch = 4, 512, 2048, 8, 256, 8
  mesh = jax.sharding.Mesh(np.array(t.devices).reshape(-1), ("fsdp",))

  def block(x, w):
    wq, wk, wv, wo, w1, w2 = w
    h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True) + 1e-6).astype(x.dtype)
    b, s, _ = h.shape
    q, k, v = ((h @ w_).reshape(b, s, heads, -1) for w_ in (wq, wk, wv))
    a = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
    a = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((s, s), bool)), a, -1e9), -1).astype(x.dtype)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, s, -1) @ wo
    return x + jax.nn.silu(x @ w1) @ w2, None

  def loss(ws, x):
    y, _ = jax.lax.scan(jax.checkpoint(block), x, ws)
    return jnp.mean(jnp.square(y.astype(jnp.float32)))

  def step(ws, x):
    value, grads = jax.value_and_grad(loss)(ws, x)
    return value, jax.tree.map(lambda w, g: w - 1e-3 * g, ws, grads)

  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "fsdp"))
  ws = tuple(jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=spec)
             for s in [(layers, d, d)] * 4 + [(layers, d, f), (layers, f, d)])
  x = jax.ShapeDtypeStruct((batch, seq, d), jnp.bfloat16,
                           sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp")))
  # lowered under the slice's abstract mesh, as the config's programs are
  lower = programs_lib._lowering(jax.jit(step, donate_argnums=0), mesh, ws, x)  # pylint: disable=protected-access
  return programs_lib.Program(name="reference", shape=f"L={layers} d={d} B={batch} T={seq}", lower=lower,
                              flops=0.0, hbm_bytes=0.0, devices=len(t.devices))


def _reference_cpu_s(t: target_lib.Target) -> float:
  """CPU seconds of this process to lower and compile the reference step for the slice, timed as the config's
  programs are (`report.compile_program`: never cached)."""
  row, _ = report_lib.compile_program(_reference_step(t), t)
  return _cost(row.row())


def _compile_within_budget(config_name: str) -> dict:
  """`aot.compile_all` of the config for the slice; checks every program fits and the compile budget."""
  t = target_lib.target(TOPOLOGY)
  reference = min(_reference_cpu_s(t), _reference_cpu_s(t))  # the first may pay for the process's first compile
  report = aot.compile_all(testing.load_config(config_name), TOPOLOGY)
  units = {r["program"]: round(_cost(r) / reference, 2) for r in report["programs"]}
  print(f"{config_name}: reference compile {reference:.1f} CPU s; programs in references {units}; code MB "
        f"{ {r['program']: r['code_mb'] for r in report['programs']} }")
  for r in report["programs"]:
    assert r["fits"], r
    assert units[r["program"]] <= UNIT_LIMITS.get(r["program"], OTHER_UNIT_LIMIT), (reference, units, r)
    assert r["code_mb"] <= CODE_MB[r["program"]] * 4 / 3 + 0.5, r  # + 0.5: the small programs
  assert sum(units.values()) <= TOTAL_UNIT_LIMIT, (reference, units)
  return report


@pytest.mark.bench
def test_demystify_qwen3_4b_compiles_fits_and_meets_the_budget():
  # The recipe's 128 rollout rows of the full context fit a v5p-16 next to the training state (256 do not:
  # `python -m agentrl_jax.aot` says so and names the rows that fit).
  report = _compile_within_budget("demystify_qwen3_4b")
  names = [r["program"] for r in report["programs"]]
  assert names == ["init/optimizer", "rl/update", "rl/logprobs", "rollout/init", "rollout/prefill", "rollout/extend", "rollout/decode",
                   "eval/init", "eval/prefill", "eval/extend", "eval/decode"]
  assert report["model"]["attention_impl"] == "ragged_paged" and report["model"]["scan_layers"]


@pytest.mark.bench
def test_sft_qwen3_4b_compiles_fits_and_meets_the_budget():
  report = _compile_within_budget("sft_qwen3_4b")
  assert {r["program"] for r in report["programs"]} == {"init/optimizer", "sft/step"}


@pytest.mark.parametrize("model", ["qwen3_4b", "qwen2p5_7b"])
def test_the_memory_plan_agrees_with_the_compiler(model):
  """`models.memory_plan` against the compiler's plan of the same programs at the recipe's 23,040 tokens:
  within 10% for the update step and for the decode program (the train state resident beside it) at the rows
  the plan says fit, which fit."""
  from agentrl_jax.aot import memory_check

  c = memory_check.check(model, "v5p-16")
  assert 0.9 <= c.train_ratio <= 1.1, c
  assert 0.9 <= c.rollout_ratio <= 1.1, c
  assert c.compiled_rollout <= c.hbm and c.compiled_train <= c.hbm


@pytest.mark.parametrize("size,family", [("qwen3_4b", "v5e"), ("qwen3_4b", "v6e"), ("qwen2p5_7b", "v5e"),
                                         ("qwen2p5_7b", "v6e")])
def test_each_slice_layout_compiles_and_fits_its_slice(size, family):
  from agentrl_jax.rl import recipe

  layout = recipe.SLICE_LAYOUTS[(size, family)]
  report = aot.compile_all(testing.load_config(f"demystify_{size}", family), layout["topology"])
  assert report["fits"], [(r["program"], r["hbm_gib"]) for r in report["programs"] if not r["fits"]]


def test_the_memory_plan_agrees_with_the_compiler_on_the_slice_layouts():
  """Context parallelism, LoRA (its merged bf16 sampler copy) and the float8 cache, as the layouts use them:
  within 10% for the update and the decode program of every layout.

  The layouts keep the update clear of the chip's HBM, where the compiler plans what autodiff's residuals and the
  backward working set add up to. Near the HBM it squeezes that working set instead (Qwen2.5-7B on a v5e-16 with
  each row over 2 chips: 14.7 GiB planned, 12.1 compiled, 13.8 for the same layout on a v6e-16), which is why that
  layout splits each row over 4."""
  from agentrl_jax.aot import memory_check

  for c in memory_check.layout_checks():
    assert 0.9 <= c.train_ratio <= 1.1, c
    assert 0.9 <= c.rollout_ratio <= 1.1, c
