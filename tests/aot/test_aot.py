"""The ahead-of-time pre-flight (`python -m agentrl_jax.aot`): a tiny model's RL update, prefill and decode
compiled by the real TPU compiler for a v5e slice from this host; the report's memory, code size and estimate;
a config that cannot fit fails the command, naming the program and its bytes."""

import json

import jax
import pytest

from agentrl_jax import aot, testing
from agentrl_jax.aot import programs, target


def _tiny_rl(**overrides):
  """The recipe's RL config at CPU size with one prompt bucket, one cache capacity and padded prefill groups:
  one program of each kind."""
  return testing.load_config("demystify_qwen3_4b", "smoke", **{
      "rollout.pad_prefill_groups": True, "rollout.prompt_bucket_min": 64, "rollout.cache_bucket_min": 160,
      "mesh.num_devices": 0, "rollout.batch_size": 16, **overrides})


def test_tiny_rl_update_prefill_and_decode_compile_for_a_v5e_slice():
  report = aot.compile_all(_tiny_rl(), "v5e:2x2", only=("rl/update", "rollout/prefill", "rollout/decode"))
  assert report["chip"] == "TPU v5 lite" and report["devices"] == 4 and report["hbm_per_device_gib"] == 16.0
  rows = {r["program"]: r for r in report["programs"]}
  assert set(rows) == {"rl/update", "rollout/prefill", "rollout/decode"}
  assert rows["rl/update"]["shape"] == "B=8 T=128 packed"  # the recipe packs episodes into rows (rl.pack_len)
  for r in rows.values():
    assert r["fits"] and r["compile_cpu_s"] > 0 and r["code_mb"] > 0 and 0 < r["hbm_gib"] < 16
    assert r["est_step_s"] > 0 and r["est_flops"] > 0
  # The parameters and both AdamW moments are the update's arguments; their state is donated (aliased).
  assert rows["rl/update"]["alias_gib"] > 0
  assert report["fits"] and json.loads(json.dumps(report)) == report


def test_tiny_rl_with_context_parallelism_and_lora_compiles_for_a_v5e_slice():
  """`mesh.context=2` (each packed row's tokens over 2 chips, fsdp over the other 2), LoRA adapters and a float8
  rollout cache: the update and scoring run the context-parallel splash kernels, the rollout's cache rows lie over
  all 4 chips, and every program compiles and fits."""
  config = _tiny_rl(**{"mesh.context": 2, "rl.micro_batch_size": 2, "rl.pack_len": 256, "lora.rank": 4,
                       "model.kv_cache_dtype": "float8_e4m3fn"})  # 128 tokens a chip: whole splash blocks
  report = aot.compile_all(config, "v5e:2x2", only=("rl/", "rollout/prefill", "rollout/decode"))
  rows = {r["program"]: r for r in report["programs"]}
  assert set(rows) == {"rl/update", "rl/logprobs", "rollout/prefill", "rollout/decode"}
  assert report["model"]["attention_impl"] == "splash" and report["fits"]  # head_dim 16: no ragged paged kernel
  assert rows["rl/update"]["shape"] == "B=8 T=256 packed"
  for r in rows.values():
    assert r["fits"] and r["compile_cpu_s"] > 0 and 0 < r["hbm_gib"] < 16


def test_programs_follow_the_rollout_and_update_shapes():
  """Without packing, one update program per length bucket; the non-paged cache grows through every
  capacity bucket, and each one is a decode program."""
  t = target.target("v5e:2x2")
  plan = programs.for_config(_tiny_rl(**{"rl.pack_len": 0, "rollout.cache_bucket_min": 32, "model.dtype": "auto"}), t)
  names = [p.name for p in plan.programs]
  assert names.count("rl/update") == 3  # prompt bucket 64 + response buckets 32, 48 and 64
  assert names.count("rollout/decode") == 6 and names.count("rollout/grow") > 0  # 32, 48, 64, 96, 128, 145
  assert plan.model_cfg.dtype == "bfloat16"  # "auto" compute dtype on a TPU


def test_a_config_that_cannot_fit_fails_naming_the_program_and_bytes(capsys):
  config = _tiny_rl(**{"rollout.batch_size": 65536, "rollout.max_response_len": 4000,
                       "rollout.cache_bucket_min": 4096})
  assert aot.main(config, "v5e:2x2", only=("rollout/decode",)) == 1
  captured = capsys.readouterr()
  assert "rollout/decode" in captured.out and "NO" in captured.out
  assert "aot: rollout/decode (B=65536 S=4081" in captured.err and "does not fit: needs" in captured.err
  assert "GiB per device of 16.0 GiB" in captured.err and "largest rollout rows that fit: about" in captured.err


def test_unknown_topology_and_job_are_refused():
  with pytest.raises(ValueError, match="unknown topology 'v9:2x2'"):
    target.target("v9:2x2")
  with pytest.raises(ValueError, match="config.job='pipeline' has no programs"):
    programs.for_config(testing.load_config("default"), target.target("v5e:2x2"))



@pytest.mark.parametrize("prompts", [1, 2])
def test_prefilled_rows_are_written_where_they_live(prompts):
  """Prefilled prompts' rows written into a row-sharded paged cache: one scatter per shard, for one prompt too
  (a one-index write becomes a dynamic-update-slice, which the partitioner applies by gathering the whole cache
  onto every device: 4x the cache's per-chip share here, 165 GiB a chip for the recipe's eval on a v5e-16)."""
  import jax.numpy as jnp

  from agentrl_jax import compile_stats
  from agentrl_jax.models import kv_cache, sharding as sharding_lib
  from agentrl_jax.models.config import ModelConfig

  mesh = sharding_lib.make_mesh(-1, 1, 1, devices=list(target.target("v5e:2x2").devices))
  cfg = ModelConfig.tiny_qwen3(head_dim=128, attention_impl="ragged_paged", dtype="bfloat16")
  big = jax.eval_shape(lambda: kv_cache.PagedKVCache.init(cfg, 16, 4096))
  big = big.replace(kv=jax.ShapeDtypeStruct(big.kv.shape, big.kv.dtype, sharding=sharding_lib.named_sharding(
      mesh, kv_cache.PAGED_AXES, big.kv.shape)))

  def put(big, rows, x):
    small = kv_cache.PagedKVCache.init(cfg, prompts, 256)
    return big.put_rows(rows, small.replace(kv=small.kv + x))

  with jax.set_mesh(mesh), compile_stats.persistent_cache_off():
    traced = jax.jit(put, donate_argnums=0).trace(big, jax.ShapeDtypeStruct((prompts,), jnp.int32),
                                                  jax.ShapeDtypeStruct((), jnp.bfloat16))
    mem = traced.lower().compile().memory_analysis()
  share = big.kv.size * big.kv.dtype.itemsize / 4
  assert mem.temp_size_in_bytes < 0.05 * share, (mem.temp_size_in_bytes, share)


def test_profile_lists_the_compilers_phases():
  report = aot.compile_all(_tiny_rl(), "v5e:2x2", only=("rollout/decode",), profile=True)
  phases = dict(report["programs"][0]["compile_phases"])
  assert "TpuCompiler::Compile" in phases and phases["TpuCompiler::Compile"] > 0
  assert any(k.startswith("XLA::TPU") for k in phases), phases


def test_disaggregated_programs_compile_each_on_their_own_devices_with_the_transfer():
  """Asynchronous RL with the sampler on half of a v5e-8: the update on one half, the rollout on the other, and
  the weight transfer over both, each compiled by the TPU compiler; per-side HBM and the transfer's estimate."""
  config = _tiny_rl(**{"rl.max_staleness": 1, "rl.async_placement": "disaggregated", "rl.async_sampler_devices": 4,
                       "sampler_mesh.tensor": -1})
  t = target.target("v5e:2x4")
  plan = programs.for_config(config, t)
  by_name = {p.name: p for p in plan.programs}
  assert by_name["rl/update"].devices == 4 and by_name["rollout/decode"].devices == 4
  assert by_name["rl/weight_transfer"].devices == 8
  assert any("weight transfer:" in n and "ms over one ICI link a chip across the cut (50 GB/s" in n for n in plan.notes)
  report = aot.compile_all(config, "v5e:2x4", only=("rl/update", "rollout/decode", "rl/weight_transfer"))
  rows = {r["program"]: r for r in report["programs"]}
  assert set(rows) == {"rl/update", "rollout/decode", "rl/weight_transfer"}
  assert all(r["fits"] and r["compile_cpu_s"] > 0 for r in rows.values())
  # The transfer holds one copy of the parameters on each side: its bytes, not a training state's.
  assert 0 < rows["rl/weight_transfer"]["hbm_gib"] < rows["rl/update"]["hbm_gib"]


def test_asynchronous_plans_count_the_streams_cache_and_weight_copies_beside_each_program():
  """The rollout stream lives across updates: its KV cache (and any copy of the weights it holds) stays in HBM
  while the update and the scoring pass run (colocated), or beside the weight transfer on the sampler's devices
  (disaggregated); delayed weights keep the next copy beside the one decoding. An evaluation stops the stream
  (`RolloutStream.stop`: its cache freed) and decodes on its weights: it needs what a synchronous run's does."""
  t = target.target("v5e:2x4")

  def plan(**kw):
    by = {}
    for p in programs.for_config(_tiny_rl(**kw), t).programs:
      by.setdefault(p.name, p)
    return by

  sync = plan()
  cache = next(p.scale_bytes for n, p in sync.items() if n == "rollout/init")
  copy = sync["rollout/decode"].fixed_bytes
  assert cache > 0 and copy > 0
  colo = plan(**{"rl.max_staleness": 1})
  assert colo["rl/update"].resident == sync["rl/update"].resident + cache
  assert colo["rollout/decode"].resident == sync["rollout/decode"].resident  # the params read in place
  assert colo["eval/decode"].resident == sync["eval/decode"].resident
  delayed = plan(**{"rl.max_staleness": 1, "rl.async_weight_sync_segments": 2})
  assert delayed["rl/update"].resident == sync["rl/update"].resident + cache + 2 * copy  # decoding and next copies
  state = sync["rollout/decode"].resident + copy  # the whole train state: the sampler no longer reads it in place
  assert delayed["rollout/decode"].resident == state + copy
  assert delayed["eval/decode"].resident == state  # the stream's one copy is its argument
  arrival = plan(**{"rl.max_staleness": 1, "rl.async_weight_sync": "arrival"})  # delayed too: the same copies
  assert {n: p.resident for n, p in arrival.items()} == {n: p.resident for n, p in delayed.items()}
  dis = dict(**{"rl.max_staleness": 1, "rl.async_placement": "disaggregated", "rl.async_sampler_devices": 4,
                "sampler_mesh.tensor": -1})
  split = plan(**dis)
  cache4 = next(p.scale_bytes for n, p in split.items() if n == "rollout/init")  # over the sampler's 4 devices
  copy4 = split["rollout/decode"].fixed_bytes
  assert split["rollout/decode"].resident == 0 and split["rl/update"].resident == 0
  assert split["eval/decode"].resident == 0  # the stream's weights are its argument
  assert split["rl/weight_transfer"].resident >= copy4 + cache4
  later = plan(**dis, **{"rl.async_weight_sync_segments": 2})
  assert later["rollout/decode"].resident == copy4 and later["eval/decode"].resident == 0


def test_an_invalid_asynchronous_setting_is_a_clear_error_not_a_traceback():
  t = target.target("v5e:2x4")
  for kw, msg in [({"rl.async_sampler_devices": 0}, "needs >= 1 sampler device"),
                  ({"rl.max_staleness": 0, "rl.async_sampler_devices": 4}, "set max_staleness >= 1")]:
    config = _tiny_rl(**{"rl.max_staleness": 1, "rl.async_placement": "disaggregated", **kw})
    with pytest.raises(ValueError, match=msg):
      programs.for_config(config, t)


def test_an_asynchronous_plan_holds_the_streams_one_group_prefills():
  """An asynchronous run's rollout stream starts freed slots' groups one per prefill call (`shapes.prefill_groups`'
  refill rule): the pre-flight lists those programs beside the padded full calls the synchronous loop makes."""
  t = target.target("v5e:2x2")
  prefills = lambda config: {p.shape.split()[0] for p in programs.for_config(config, t).programs  # noqa: E731
                             if p.name == "rollout/prefill"}
  sync, stream = prefills(_tiny_rl()), prefills(_tiny_rl(**{"rl.max_staleness": 1}))
  assert len(sync) == 1 and not any(s.startswith("P=1x") for s in sync)
  assert stream == sync | {s for s in stream if s.startswith("P=1x")} and stream != sync


def test_v4_lists_two_devices_per_chip():
  """libtpu describes a v4 chip as two devices (one per TensorCore), a v5p chip as one: per-device HBM and peak
  follow the description, not an assumption."""
  v4, v5p = target.target("v4:2x2x1"), target.target("v5p:2x2x1")
  assert (len(v4.devices), v4.devices_per_chip, v4.hbm_per_device) == (8, 2, 16 << 30)
  assert (len(v5p.devices), v5p.devices_per_chip, v5p.hbm_per_device) == (4, 1, 95 << 30)


def test_init_programs_and_reference_parameters_are_counted():
  """A fresh run compiles its parameter and optimizer inits; a KL term keeps a reference copy of the parameters
  in HBM beside every later program, and scoring runs beside the AdamW moments."""
  t = target.target("v5e:2x2")
  plain = programs.for_config(_tiny_rl(), t)
  kl = programs.for_config(_tiny_rl(**{"rl.loss.kl_coeff": 0.1}), t)
  names = [p.name for p in kl.programs]
  assert names[:3] == ["init/params", "init/reference", "init/optimizer"]
  assert [p.name for p in plain.programs][:2] == ["init/params", "init/optimizer"]
  graphdef, state = update_abstract(kl, t)
  params = programs.device_bytes(state.params)
  moments = programs.device_bytes(state) - params
  by_name = {p.name: p for p in kl.programs}
  assert by_name["init/params"].resident == 0 and by_name["init/reference"].resident == params + moments
  assert by_name["rl/update"].resident == params and by_name["rl/logprobs"].resident == moments + params
  assert by_name["rollout/decode"].resident == kl.resident == plain.resident + params
  assert {p.name: p.resident for p in plain.programs}["rl/update"] == 0 and by_name["init/optimizer"].resident == params
  # Compiled: the reference's init is the same module as the policy's, compiled again, and its cost counts.
  report = aot.compile_all(_tiny_rl(**{"rl.loss.kl_coeff": 0.1}), "v5e:2x2", only=("init/",))
  rows = {r["program"]: r for r in report["programs"]}
  assert rows["init/reference"]["same_as"] == "init/params params" and rows["init/reference"]["compile_cpu_s"] > 0
  assert report["total_compile_cpu_s"] == round(sum(r["compile_cpu_s"] for r in report["programs"]), 2)


def update_abstract(plan, t):
  """The abstract train state the plan was built on (the same constructor, the same mesh)."""
  from agentrl_jax.rl import update as update_lib

  cfg = _tiny_rl()
  mesh = target.mesh(cfg.mesh, t)
  return update_lib.abstract_train_state(plan.model_cfg, update_lib.OptimizerConfig(**cfg.optimizer), mesh)
