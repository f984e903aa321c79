"""The recipe's per-slice layouts (`configs/demystify_*.py:v5e` / `:v6e`, `rl.recipe.SLICE_LAYOUTS`): each config
argument sets its layout, whose rows split evenly over the slice, and the memory plan (`models.memory_plan`, held
to the TPU compiler's numbers by `aot.memory_check`) fits its update and its rollout in the usable HBM of a chip.
The compiler's own verdicts are the README's table (`python -m agentrl_jax.aot`, too slow for the default suite)."""

import dataclasses

import pytest

from agentrl_jax import testing
from agentrl_jax.aot.memory_check import Check, format_checks
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import memory_plan
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import recipe

SLICES = {"v5e:4x4": "v5e-16", "v6e:4x4": "v6e-16"}


@pytest.mark.parametrize("size,family", sorted(recipe.SLICE_LAYOUTS))
def test_each_slice_layout_fits_the_memory_plan(size, family):
  layout = recipe.SLICE_LAYOUTS[(size, family)]
  config = testing.load_config(f"demystify_{size}", family)
  assert config.mesh.context == layout["context"] and config.rl.micro_batch_size == layout["micro"]
  assert config.lora.rank == layout["lora"] and config.model.kv_cache_dtype == layout["kv"]
  chips, hbm = memory_plan.parse_slice(SLICES[layout["topology"]])
  row_shards = chips // layout["context"]  # training rows split over data x fsdp; each row over context
  assert config.rl.micro_batch_size == row_shards  # one row per row shard and micro-batch
  assert config.rollout.batch_size % chips == 0  # the cache's rows over every chip
  assert config.rollout.batch_size % (config.rollout.groups_per_prefill * config.rl.n) == 0  # whole prefill waves
  cfg = ModelConfig.by_name(size, dtype="bfloat16", remat=True, kv_cache_dtype=layout["kv"])
  seq = config.rollout.max_prompt_len + config.rollout.max_response_len
  lora = lora_lib.LoraConfig.from_block(config.lora)
  p = memory_plan.plan(cfg, chips=chips, hbm=hbm, seq=seq, rows=config.rollout.batch_size,
                       context=layout["context"], micro_rows=1, lora=lora)
  usable = memory_plan.USABLE_HBM * hbm
  # The update within the usable HBM, where the compiler plans what the plan counts (within 10%: the compiler's
  # verdict is tests/aot/test_aot_recipe_slow.py's); a layout closer to the chip's HBM gets its backward pass
  # squeezed by the compiler, as Qwen2.5-7B's v5e update was with each row over 2 chips.
  assert p.train_total <= usable, (p.train_total / 2**30, usable / 2**30)
  assert p.rollout_total <= usable, (p.rollout_total / 2**30, usable / 2**30)
  assert p.rollout_rows_fit >= config.rollout.batch_size


def test_an_unknown_argument_names_the_known_ones():
  with pytest.raises(ValueError, match="'v5e' or 'v6e'"):
    testing.load_config("demystify_qwen3_4b", "v4")
  with pytest.raises(ValueError, match="no layout"):
    recipe.for_slice(recipe.rl_config(), "qwen3_8b", "v5e")


def test_memory_check_names_a_program_the_compiler_refused():
  """A refused update (the compiler's out-of-memory verdict) is said to be one in the table, with no breakdown of
  arguments and temporaries the compiler never gave."""
  refused = Check(model="qwen2p5_7b", slice="v5e-16", chips=16, plan_train=29.8, compiled_train=18.9, plan_state=5.3,
                  compiled_state=0.0, plan_activations=24.4, compiled_temp=0.0, rows=80, plan_rollout=13.4,
                  compiled_rollout=13.4, hbm=16.0, update_compile_cpu_s=1.0, decode_compile_cpu_s=1.0,
                  train_fits=False)
  fits = dataclasses.replace(refused, compiled_train=29.0, compiled_state=5.3, compiled_temp=23.0, train_fits=True)
  table = format_checks([refused, fits]).splitlines()
  assert "29.8 / 18.9 (0.63, the compiler: does not fit) | 5.3 / - | 24.4 / - |" in table[2]
  assert "29.8 / 29.0 (0.97) | 5.3 / 5.3 | 24.4 / 23.0 |" in table[3]
  assert "does not fit" not in table[3]
