"""The recipe's real programs through the TPU compiler (slow: minutes of CPU each): every program of the
Qwen3-4B RL and SFT configs compiles for a v5p-16 slice (v5p:2x2x2), fits its HBM, and stays within the
compile budget (the RL update <= 100 CPU s, the SFT step <= 120, each rollout and scoring program <= 60 CPU s,
a config's programs together <= 10 minutes); every per-slice layout (`configs/demystify_*.py:v5e` / `:v6e`)
compiles and fits its slice, and the memory plan stays within 10% of the compiler there too.

    python -m pytest -m slow tests/aot/test_aot_recipe_slow.py
"""

import pytest

from agentrl_jax import aot, testing

pytestmark = pytest.mark.slow
TOPOLOGY = "v5p:2x2x2"
# The budget holds on an idle host (2026-12-05: the RL update 63 CPU s, the SFT step 53, no other program above
# 21, the RL config 168 s); CPU seconds grow with the host's load (cache and core sharing): the same update
# measured 113-174 s at loads of 5-25, and 174 s beside another slow test on a CI host. So the two budget tests
# are timing checks (`bench`: .ci/run runs them alone, on one worker) and the check allows half again for a
# slower host, so a program that breaks the budget on an idle host still fails.
LOAD_MARGIN = 1.5
LIMITS = {"rl/update": 100, "sft/step": 120}  # CPU s on an idle host; every other program: 60


def _cost(r):
  """CPU seconds of this process to lower and compile one program (`time.process_time`: all its threads)."""
  return r["compile_cpu_s"] + r.get("lower_cpu_s", 0.0)


def _check_budget(report):
  for r in report["programs"]:
    assert r["fits"], r
    limit = LIMITS.get(r["program"], 60)
    assert _cost(r) <= limit * LOAD_MARGIN, r
  assert sum(_cost(r) for r in report["programs"]) <= 600 * LOAD_MARGIN


@pytest.mark.bench
def test_demystify_qwen3_4b_compiles_fits_and_meets_the_budget():
  # The recipe's 128 rollout rows of the full context fit a v5p-16 next to the training state (256 do not:
  # `python -m agentrl_jax.aot` says so and names the rows that fit).
  report = aot.compile_all(testing.load_config("demystify_qwen3_4b"), TOPOLOGY)
  names = [r["program"] for r in report["programs"]]
  assert names == ["init/optimizer", "rl/update", "rl/logprobs", "rollout/init", "rollout/prefill", "rollout/extend", "rollout/decode",
                   "eval/init", "eval/prefill", "eval/extend", "eval/decode"]
  assert report["model"]["attention_impl"] == "ragged_paged" and report["model"]["scan_layers"]
  _check_budget(report)


@pytest.mark.bench
def test_sft_qwen3_4b_compiles_fits_and_meets_the_budget():
  report = aot.compile_all(testing.load_config("sft_qwen3_4b"), TOPOLOGY)
  assert {r["program"] for r in report["programs"]} == {"init/optimizer", "sft/step"}
  _check_budget(report)


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
