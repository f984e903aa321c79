"""The compiled sampler: transformers parity, log-probs, stop rules, shared prefill, bounded compiles, sharding."""

import dataclasses

import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import attention_kernels
from agentrl_jax.models import hf_io
from agentrl_jax.models import sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import KVCache
from agentrl_jax.sampling import logits as logits_lib
from agentrl_jax.sampling import sampler as sampler_lib
from agentrl_jax.sampling.config import SamplingConfig, StopReason, bucket, pow2_bucket
from agentrl_jax.sampling.generate import generate
from agentrl_jax.sampling.sampler import make_sampler

PROMPTS = [list(range(5, 15)), list(range(40, 47)), [3, 9, 200, 11], [7] * 13]


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
  cfg = ModelConfig.tiny_qwen3()
  path = str(tmp_path_factory.mktemp("hf_sampler"))
  testing.save_random_hf_checkpoint(cfg, path, seed=3)
  model = hf_io.load_hf_checkpoint(path)
  graphdef, params = nnx.split(model)
  return model.cfg, graphdef, params, path


def _full_logp(cfg, graphdef, params, ids):
  """log_softmax of a full forward over `ids` [T] -> [T, V]."""
  logits, _ = testing.jit_forward(nnx.merge(graphdef, params))(jnp.asarray([ids], jnp.int32))
  return np.asarray(jax.nn.log_softmax(logits[0], axis=-1))


def test_greedy_matches_transformers_generate(hf_model):
  import torch

  cfg, graphdef, params, path = hf_model
  sampler = make_sampler(graphdef, cfg, SamplingConfig(greedy=True, segment_len=8), batch=4)
  out = generate(sampler, params, PROMPTS, key=jax.random.key(0), max_new_tokens=24)
  hf = testing.load_hf_torch(path)
  for prompt, toks, reason in zip(PROMPTS, out.tokens, out.stop_reason):
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                      pad_token_id=0)[0, len(prompt):].tolist()
    assert toks.tolist() == ref
    assert reason == StopReason.LENGTH


def test_logprobs_match_full_forward(hf_model):
  """Both log-probs of every drawn token equal those of a fresh full forward over prompt + drawn tokens."""
  cfg, graphdef, params, _ = hf_model
  sc = SamplingConfig(temperature=0.7, top_k=40, top_p=0.9, segment_len=8)
  sampler = make_sampler(graphdef, cfg, sc, batch=8)
  out = generate(sampler, params, PROMPTS[:2], key=jax.random.key(1), max_new_tokens=20, n=3)
  for row, (toks, lr, ls) in enumerate(zip(out.tokens, out.logp_raw, out.logp_sample)):
    prompt = PROMPTS[row // 3]
    ids = prompt + toks.tolist()
    full = _full_logp(cfg, graphdef, params, ids)
    pos = np.arange(len(prompt) - 1, len(ids) - 1)
    np.testing.assert_allclose(lr, full[pos, toks], atol=1e-4)
    logits = jnp.asarray(np.asarray(full[pos]))  # log_softmax is a valid logits vector
    filt = np.asarray(jax.nn.log_softmax(logits_lib.sampling_logits(logits, sc), axis=-1))
    np.testing.assert_allclose(ls, filt[np.arange(len(toks)), toks], atol=1e-4)
    assert np.all(np.isfinite(ls))


def test_cache_grown_to_exactly_what_each_segment_writes(hf_model):
  """64-token prompts, 64-step segments: the cache is filled to its last slot (128, then 192, then 256) before it
  grows. A write past the end would be dropped silently, so every log-prob is checked against a full forward."""
  cfg, graphdef, params, _ = hf_model
  sampler = make_sampler(graphdef, cfg, SamplingConfig(segment_len=64), batch=2)
  grows = sampler_lib.TRACE_COUNTS["grow"]
  prompts = [list(range(3, 67)), list(range(100, 164))]
  out = generate(sampler, params, prompts, key=jax.random.key(4), max_new_tokens=130)
  for prompt, toks, lr in zip(prompts, out.tokens, out.logp_raw):
    assert len(toks) == 130
    ids = prompt + toks.tolist()
    full = _full_logp(cfg, graphdef, params, ids)
    np.testing.assert_allclose(lr, full[np.arange(63, len(ids) - 1), toks], atol=1e-4)
  assert sampler_lib.TRACE_COUNTS["grow"] - grows <= 2  # 128 -> 192 -> 256 (traced once per new capacity)


def test_stop_reasons_and_budget():
  model = testing.tiny_model(seed=2)
  graphdef, params = nnx.split(model)
  # With a fixed key the draws are the same whatever the stop tokens, so a probe run tells us which tokens
  # come: make one of them an end token, an earlier one a tool end.
  probe = make_sampler(graphdef, model.cfg, SamplingConfig(segment_len=4), batch=2)
  run = lambda s: generate(s, params, PROMPTS[:1], key=jax.random.key(0), max_new_tokens=16)
  toks = run(probe).tokens[0].tolist()
  first_at = [i for i in range(1, 16) if toks[i] not in toks[:i]]
  i_tool, i_end = first_at[2], first_at[5]
  for sc, want_len, want in [
      (SamplingConfig(segment_len=4, end_token_ids=(toks[i_end],)), i_end + 1, StopReason.END),
      (SamplingConfig(segment_len=4, tool_end_token_ids=(toks[i_tool],)), i_tool + 1, StopReason.TOOL),
      (SamplingConfig(segment_len=4), 16, StopReason.LENGTH),
  ]:
    out = run(make_sampler(graphdef, model.cfg, sc, batch=2))
    assert out.tokens[0].tolist() == toks[:want_len]
    assert out.stop_reason[0] == want


def test_n_samples_share_one_prefill():
  """prefill_groups runs each prompt once; its n rows hold identical caches equal to a single-row prefill."""
  model = testing.tiny_model(seed=5)
  graphdef, params = nnx.split(model)
  cfg = model.cfg
  state = sampler_lib.init_state(cfg, 6, 32, jax.random.key(0))
  tokens = np.zeros((2, 16), np.int32)
  tokens[0, :10], tokens[1, :7] = PROMPTS[0], PROMPTS[1]
  lengths = np.array([10, 7], np.int32)
  slots = np.array([5, 0, 3, 1, 2, 4], np.int32)
  state, draw = sampler_lib.prefill_groups(graphdef, SamplingConfig(), 3, params, state, tokens, lengths, slots,
                                           np.full((6,), 10, np.int32))
  assert sampler_lib.TRACE_COUNTS["prefill_groups"] >= 1
  np.testing.assert_array_equal(np.asarray(state.cache.lengths)[slots], [10, 10, 10, 7, 7, 7])
  single = KVCache.init(cfg, 1, 16)
  _, single = testing.jit_forward(model)(jnp.asarray(tokens[:1]), cache=single, chunk_lengths=jnp.asarray([10]))
  for layer in range(cfg.num_layers):
    for got, want in zip(state.cache.token_major(layer), single.token_major(layer)):
      for slot in (5, 0, 3):
        np.testing.assert_allclose(np.asarray(got)[slot, :10], np.asarray(want)[0, :10], atol=1e-5)
  assert np.all(np.asarray(state.active)[slots])
  assert np.all(np.asarray(state.budget)[slots] == 9)


def test_compiles_are_bounded_whatever_the_prompt_lengths():
  model = testing.tiny_model(seed=6)
  graphdef, params = nnx.split(model)
  sampler = make_sampler(graphdef, model.cfg, SamplingConfig(segment_len=4), batch=2)
  before = dict(sampler_lib.TRACE_COUNTS)
  rng = np.random.default_rng(0)
  lengths = list(range(1, 41, 3))
  for n in lengths:
    generate(sampler, params, [rng.integers(1, 500, n).tolist()], key=jax.random.key(n), max_new_tokens=4)
  delta = {k: v - before.get(k, 0) for k, v in sampler_lib.TRACE_COUNTS.items()}
  prompt_buckets = {bucket(n, 16) for n in lengths}  # {16, 24, 32, 48}
  assert delta["prefill_groups"] <= len(prompt_buckets) < len(lengths)
  assert delta["decode"] <= len(prompt_buckets)  # one cache capacity per prompt bucket here
  # The same again compiles nothing.
  before = dict(sampler_lib.TRACE_COUNTS)
  for n in lengths:
    generate(sampler, params, [rng.integers(1, 500, n).tolist()], key=jax.random.key(n), max_new_tokens=4)
  assert dict(sampler_lib.TRACE_COUNTS) == before


def test_chex_max_traces_on_prefill():
  """The same bound with chex: prefill traced once per prompt bucket (16, 24, 32) over six prompt lengths."""
  model = testing.tiny_model(seed=6)
  graphdef, params = nnx.split(model)
  cfg = model.cfg
  fn = chex.assert_max_traces(n=3)(lambda params, state, tokens, lengths, slots, budgets: sampler_lib.prefill_groups(
      graphdef, SamplingConfig(), 1, params, state, tokens, lengths, slots, budgets))
  jitted = jax.jit(fn)
  for n in (3, 9, 15, 17, 20, 30):
    t = bucket(n, 16)
    tokens = np.zeros((1, t), np.int32)
    tokens[0, :n] = 1
    state = sampler_lib.init_state(cfg, 2, 32, jax.random.key(0))
    jitted(params, state, tokens, np.array([n], np.int32), np.array([0], np.int32), np.array([4], np.int32))


def test_donated_state_is_consumed():
  model = testing.tiny_model(seed=1)
  graphdef, params = nnx.split(model)
  sampler = make_sampler(graphdef, model.cfg, SamplingConfig(segment_len=4), batch=2)
  state = sampler.init(32, jax.random.key(0))
  old_k = jax.tree.leaves(state.cache.k)  # one array per layer on XLA:CPU (`sampling.state.cache_per_layer`)
  assert len(old_k) == (model.cfg.num_layers if sampler_lib.cache_per_layer(model.cfg) else 1)
  state, _ = sampler.decode(params, state, jnp.int32(4), jnp.int32(1))
  assert all(k.is_deleted() for k in old_k)  # the cache was updated in place, not copied


@pytest.mark.parametrize("sharded", [False, True])
def test_cached_steps_compile_with_the_cpu_sampler_options(monkeypatch, sharded):
  """Decode and extend, not prefill, are compiled with `attention_kernels.CPU_SAMPLER_COMPILER_OPTIONS` on CPU
  (one device and under a mesh): an option XLA rejects reaches those two compiles and no other."""
  model = testing.tiny_model(seed=1)
  graphdef, params = nnx.split(model)
  monkeypatch.setattr(attention_kernels, "CPU_SAMPLER_COMPILER_OPTIONS",
                      {"xla_cpu_experimental_ynn_fusion_type": "NOT_A_FUSION_TYPE"})
  mesh = sharding.make_mesh(data=1, fsdp=2, tensor=1, devices=jax.devices()[:2]) if sharded else None
  sampler = make_sampler(graphdef, model.cfg, SamplingConfig(segment_len=4), batch=2, mesh=mesh, params=params)
  params = sampler.place_params(params)
  state = sampler.init(32, jax.random.key(0))
  tokens, lengths = np.ones((2, 16), np.int32), np.array([5, 7], np.int32)
  rows, budgets = np.arange(2, dtype=np.int32), np.array([4, 4], np.int32)
  state, _ = sampler.prefill_groups(1, params, state, tokens, lengths, rows, budgets, None)
  with pytest.raises(Exception, match="NOT_A_FUSION_TYPE"):
    sampler.decode(params, state, jnp.int32(4), jnp.int32(1))
  state = sampler.init(32, jax.random.key(0))  # the failed call consumed the donated state
  with pytest.raises(Exception, match="NOT_A_FUSION_TYPE"):
    sampler.extend(params, state, rows, tokens, lengths, np.ones(2, bool), budgets, None)


def test_cpu_sampler_options_are_chosen_by_the_models_layer_matrices(monkeypatch):
  """Decode and extend keep YNNPACK for reductions only while a layer matrix (hidden x intermediate) is under
  `YNN_DOTS_MIN_MATRIX` elements; from there they compile with XLA's defaults (YNNPACK's dots too): an option
  XLA rejects in `CPU_SAMPLER_COMPILER_OPTIONS` reaches none of that model's compiles."""
  options = attention_kernels.sampler_compiler_options
  assert options("cpu", ModelConfig.demo_1m()) == attention_kernels.CPU_SAMPLER_COMPILER_OPTIONS
  assert options("cpu", ModelConfig.bench_5m()) == attention_kernels.CPU_SAMPLER_COMPILER_OPTIONS
  assert options("cpu", ModelConfig.bench_58m()) is None
  assert options("cpu", None) == attention_kernels.CPU_SAMPLER_COMPILER_OPTIONS
  assert options("tpu", ModelConfig.demo_1m()) is None
  cfg = dataclasses.replace(ModelConfig.tiny_qwen3(), hidden_size=256, intermediate_size=1024, num_layers=1)
  assert cfg.hidden_size * cfg.intermediate_size == attention_kernels.YNN_DOTS_MIN_MATRIX
  graphdef, params = nnx.split(testing.tiny_model(cfg, seed=2))
  sc = SamplingConfig(segment_len=4)
  ref = generate(make_sampler(graphdef, cfg, sc, batch=2), params, PROMPTS[:2], key=jax.random.key(0),
                 max_new_tokens=6)
  monkeypatch.setattr(attention_kernels, "CPU_SAMPLER_COMPILER_OPTIONS",
                      {"xla_cpu_experimental_ynn_fusion_type": "NOT_A_FUSION_TYPE"})
  out = generate(make_sampler(graphdef, cfg, sc, batch=2), params, PROMPTS[:2], key=jax.random.key(0),
                 max_new_tokens=6)
  for a, b in zip(out.tokens, ref.tokens, strict=True):  # the same program: the same draws
    np.testing.assert_array_equal(a, b)


def test_sharded_sampler_matches_single_device():
  """fsdp x tensor mesh on the 8 fake CPU devices: same draws as one device; state laid out by the rules."""
  model = testing.tiny_model(seed=7)
  graphdef, params = nnx.split(model)
  sc = SamplingConfig(temperature=0.8, top_k=50, segment_len=8)  # one cache capacity: one decode compile
  ref = generate(make_sampler(graphdef, model.cfg, sc, batch=8), params, PROMPTS, key=jax.random.key(3),
                 max_new_tokens=8, n=2)
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  sampler = make_sampler(graphdef, model.cfg, sc, batch=8, mesh=mesh, params=params)
  placed = sampler.place_params(params)
  assert placed["layers"]["attn"]["q_dnh"].get_value().sharding.spec == jax.P(None, "fsdp", "tensor", None)
  out = generate(sampler, placed, PROMPTS, key=jax.random.key(3), max_new_tokens=8, n=2)
  for a, b in zip(ref.tokens, out.tokens):
    assert a.tolist() == b.tolist()
  np.testing.assert_allclose(np.concatenate(ref.logp_raw), np.concatenate(out.logp_raw), atol=1e-5)
  state = sampler.init(32, jax.random.key(0))
  for k in jax.tree.leaves(state.cache.k):  # keys [B, L, K, H, S] (L = 1 per array on XLA:CPU)
    assert k.sharding.spec == jax.P("fsdp", None, "tensor", None, None)
  for v in jax.tree.leaves(state.cache.v):  # values [B, L, K, S, H]
    assert v.sharding.spec == jax.P("fsdp", None, "tensor", None, None)
  assert state.last_token.sharding.spec == jax.P("fsdp")


def test_categorical_matches_softmax_and_respects_filters():
  logits = jnp.asarray([[2.0, 1.0, 0.0, -1.0, -jnp.inf, 0.5] * 30])  # V = 180: one full 128-block and a bit
  draws = np.asarray(logits_lib.categorical(jax.random.key(0), jnp.tile(logits, (20000, 1))))
  p = np.asarray(jax.nn.softmax(logits[0]))
  counts = np.bincount(draws, minlength=180)
  assert np.all(counts[p == 0] == 0)
  # Per pattern position (30 tokens each): probabilities 0.56, 0.21, 0.08, 0.03, 0, 0.13.
  np.testing.assert_allclose(counts.reshape(30, 6).sum(0) / draws.size, p.reshape(30, 6).sum(0), atol=0.012)
  np.testing.assert_allclose(counts[:128].sum() / draws.size, p[:128].sum(), atol=0.012)  # both blocks drawn
  sc = SamplingConfig(top_k=3)
  tok, _, ls = logits_lib.sample(jnp.tile(logits, (500, 1)), jax.random.key(1), sc)
  # Ties at the k-th value are kept (as transformers does): all 30 tokens with logit 2.0 (index % 6 == 0).
  assert np.all(np.asarray(tok) % 6 == 0)
  np.testing.assert_allclose(np.asarray(ls), np.log(1 / 30), atol=1e-5)


def test_top_p_keeps_the_smallest_set_reaching_p():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  kept = lambda p: np.isfinite(np.asarray(logits_lib.sampling_logits(logits, SamplingConfig(top_p=p))))[0]
  assert kept(0.5).tolist() == [True, False, False, False]
  assert kept(0.6).tolist() == [True, True, False, False]
  assert kept(0.95).tolist() == [True, True, True, False]
  assert kept(1.0).tolist() == [True] * 4
  assert logits_lib.argmax(jnp.asarray([[1.0, 3.0, 3.0, 0.0]])).tolist() == [1]


@pytest.mark.parametrize("field,value", [("temperature", 0.0), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
                                         ("segment_len", 0), ("end_token_ids", [1]), ("tool_end_token_ids", (-1,))])
def test_sampling_config_validation_names_the_field(field, value):
  with pytest.raises(ValueError, match=f"SamplingConfig.{field}"):
    SamplingConfig(**{field: value})
  with pytest.raises(ValueError, match="tool_end_token_ids"):
    SamplingConfig(end_token_ids=(2,), tool_end_token_ids=(2,))


def test_buckets():
  assert [bucket(n, 16) for n in (1, 16, 17, 24, 25, 33, 49, 100)] == [16, 16, 24, 24, 32, 48, 64, 128]
  assert pow2_bucket(5) == 8 and pow2_bucket(1) == 1
  with pytest.raises(ValueError):
    bucket(100, 16, maximum=64)
  assert dataclasses.is_dataclass(SamplingConfig())


def test_top_p_threshold_matches_sorting_the_vocabulary():
  """The bisection finds the sorted vocabulary's threshold: random logits (ties included, top-k filtered rows
  with -inf) over many top_p values."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(64, 500)).astype(np.float32) * rng.uniform(0.1, 8.0, size=(64, 1)).astype(np.float32)
  x[:8, ::7] = x[:8, :1]  # ties
  x[8:16, 100:] = -np.inf  # filtered tokens
  for top_p in (0.05, 0.3, 0.6, 0.9, 0.999):
    got = np.asarray(logits_lib.top_p_threshold(jnp.asarray(x), top_p))[:, 0]
    order = -np.sort(-x, axis=-1)
    probs = np.exp(order - order[:, :1])
    probs /= probs.sum(-1, keepdims=True)
    before = np.cumsum(probs, -1) - probs
    n_keep = np.maximum((before < top_p).sum(-1), 1)
    want = order[np.arange(64), n_keep - 1]
    assert (got == want).mean() >= 0.99, top_p  # float32 sums may differ at a knife's edge
    assert np.all(np.isfinite(got))
