"""`attention_impl="ragged_paged"`: the paged KV cache and the ragged paged attention kernel's contract.

JAX's Pallas TPU interpreter cannot run the ragged paged attention kernel (it reshapes refs), so on CPU the
contract is checked in three parts: our XLA statement of it (`paged_attention_reference`) against JAX's own
`ref_ragged_paged_attention`; the sampler and agent loop over a `PagedKVCache` through that statement against
the `xla` path (same transcripts, same log-probs; one device and 8 fake devices); and the real kernel inside
the sampler's compiled decode step lowered for a TPU (`jax.export` with an abstract TPU device).
"""

import json

from flax import nnx
import jax
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import attention_kernels
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import PagedKVCache
from agentrl_jax.models.qwen import Qwen
from agentrl_jax.rollout import agent_loop
from agentrl_jax.rollout.chat import stop_token_ids
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.stub_executor import stub_executor
from agentrl_jax.sampling import sampler as sampler_lib
from agentrl_jax.sampling.config import SamplingConfig
from agentrl_jax.sampling.generate import generate
from agentrl_jax.sampling.sampler import make_sampler
from agentrl_jax.tools import ExecResult

PAGED = dict(attention_impl="ragged_paged", attention_interpret=True, kv_page_size=16)


def test_reference_matches_jax_reference():
  """Ragged queries (0, 1 and several per sequence), pages in shuffled order, a sequence past num_seqs."""
  rng = np.random.default_rng(0)
  k, g, h, page, pages_per_seq = 2, 3, 32, 8, 4
  q_lens, kv_lens = [1, 0, 5, 3], [1, 9, 32, 20]
  kv_pages = jnp.asarray(rng.standard_normal((20, page, 2 * k, h)), jnp.float32)
  page_indices = jnp.asarray(rng.permutation(20)[:16].reshape(4, pages_per_seq), jnp.int32)
  cu = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
  q = jnp.asarray(rng.standard_normal((12, k * g, h)), jnp.float32)  # 9 real query rows, 3 of padding
  kv_lens_a = jnp.asarray(kv_lens, jnp.int32)
  for num_seqs in (4, 3):
    ns = jnp.asarray([num_seqs], jnp.int32)
    want = rpa.ref_ragged_paged_attention(q, kv_pages, kv_lens_a, page_indices, cu, ns, sm_scale=0.2)
    got = jax.jit(lambda *a: attention_kernels.paged_attention_reference(*a, sm_scale=0.2))(
        q, kv_pages, kv_lens_a, page_indices, cu, ns)
    n = int(cu[num_seqs])
    np.testing.assert_allclose(np.asarray(got)[:n], np.asarray(want), atol=2e-6, rtol=0)
    assert not np.asarray(got)[n:].any()  # query rows of no sequence are zero


def test_paged_cache_layout_and_growth():
  cfg = ModelConfig.tiny_qwen3(**PAGED)
  cache = PagedKVCache.init(cfg, 3, 40)
  assert cache.max_len == 48 and cache.kv.shape == (3, cfg.num_layers, 48, 2 * cfg.num_kv_heads, cfg.head_dim)
  # Row b's layer l: pages (b * L + l) * 3 + [0, 1, 2] of the pool, which is the array itself, reshaped.
  np.testing.assert_array_equal(cache.page_indices(), [[0, 1, 2], [6, 7, 8], [12, 13, 14]])
  np.testing.assert_array_equal(cache.page_indices(1), [[3, 4, 5], [9, 10, 11], [15, 16, 17]])
  assert cache.grow(49).max_len == 64  # whole pages
  with pytest.raises(ValueError, match="below the current"):
    cache.grow(16)


@pytest.fixture(scope="module")
def models():
  xla = testing.tiny_model(seed=21)
  graphdef, params = nnx.split(xla)
  paged_model = nnx.merge(nnx.split(Qwen(ModelConfig.tiny_qwen3(**PAGED), rngs=nnx.Rngs(0)))[0], params)
  return (graphdef, xla.cfg), (nnx.split(paged_model)[0], paged_model.cfg), params


def test_generate_matches_the_xla_path(models):
  (g_x, c_x), (g_p, c_p), params = models
  sc = SamplingConfig(temperature=0.9, segment_len=8)
  prompts = [list(range(5, 15)), list(range(40, 47)), [3, 9, 200, 11]]
  outs = [generate(make_sampler(g, c, sc, batch=8), params, prompts, key=jax.random.key(4), max_new_tokens=20, n=2)
          for g, c in ((g_x, c_x), (g_p, c_p))]
  for a, b in zip(outs[0].tokens, outs[1].tokens):
    assert a.tolist() == b.tolist()
  np.testing.assert_allclose(np.concatenate(outs[1].logp_raw), np.concatenate(outs[0].logp_raw), atol=2e-5)


def test_agent_loop_extends_the_paged_cache_as_the_xla_path(models):
  """Prefill, decode and tool-response extends of several rows at once: same transcripts and log-probs. The
  xla path grows its cache in buckets (a decode and an extend program per capacity); the paged cache is
  allocated once at its largest capacity, so the rollout compiles one decode and one extend program."""
  (g_x, c_x), (g_p, c_p), params = models
  tok = testing.tiny_tokenizer()
  end, tool_end = stop_token_ids(tok)
  sc = SamplingConfig(end_token_ids=end, tool_end_token_ids=tool_end, segment_len=16)
  cfg = RolloutConfig(batch_size=4, segment_len=16, max_prompt_len=64, max_response_len=300, prompt_bucket_min=64,
                      chunk_len=32, cache_bucket_min=32)
  call = lambda code: "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) \
      + "\n</tool_call>"  # noqa: E731
  turns = [["Let me compute. " + call("print(1+2)"), "The tool says 3, so \\boxed{3}.<|im_end|>"],
           ["First " + call("print(2*3)"), "Then " + call("print(6*7)"), "It is 42.<|im_end|>"]]
  prompts = [tok.encode(tokenizer_lib.render_chat(tok, [{"role": "user", "content": q}], add_generation_prompt=True),
                        add_special_tokens=False) for q in ("What is 1+2?", "What is 2*3*7?")]
  scripts = [[tok.encode(t, add_special_tokens=False) for t in s] for s in turns]
  episodes, stats = [], []
  for g, c in ((g_x, c_x), (g_p, c_p)):
    ex = stub_executor(lambda code: ExecResult("ok", stdout=f"{eval(code[6:-1])}\n"))  # print(a*b) -> a*b
    sampler = make_sampler(g, c, sc, batch=4, n_forced=64)
    eps, st = agent_loop.run_rollout(sampler, params, prompts, n=2, tokenizer=tok, executor=ex, cfg=cfg,
                                     key=jax.random.key(0), scripts=[s for s in scripts for _ in range(2)])
    ex.close()
    episodes.append(eps)
    stats.append(st)
  assert stats[0].grow_calls >= 2 and stats[0].traces["decode"] >= 3  # xla: buckets
  assert stats[1].grow_calls == 0 and stats[1].traces["decode"] == 1 and stats[1].traces["extend"] == 1
  for a, b in zip(*episodes):
    assert a.transcript == b.transcript and a.num_tool_calls == b.num_tool_calls >= 1
    np.testing.assert_allclose(b.logp_raw, a.logp_raw, atol=2e-5)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
def test_sharded_paged_sampler_matches_single_device(models):
  _, (g_p, c_p), params = models
  sc = SamplingConfig(temperature=0.8, segment_len=8)
  prompts = [list(range(5, 15)), [3, 9, 200, 11]]
  ref = generate(make_sampler(g_p, c_p, sc, batch=8), params, prompts, key=jax.random.key(3), max_new_tokens=12,
                 n=4)
  mesh = sharding_lib.make_mesh(data=1, fsdp=4, tensor=2)
  sampler = make_sampler(g_p, c_p, sc, batch=8, mesh=mesh, params=params)
  out = generate(sampler, sampler.place_params(params), prompts, key=jax.random.key(3), max_new_tokens=12, n=4)
  for a, b in zip(ref.tokens, out.tokens):
    assert a.tolist() == b.tolist()
  np.testing.assert_allclose(np.concatenate(out.logp_raw), np.concatenate(ref.logp_raw), atol=1e-5)
  state = sampler.init(32, jax.random.key(0))
  assert state.cache.kv.sharding.spec == jax.P("fsdp", None, None, "tensor", None)  # kv [B, L, S, 2K, H]


def _tpu_decode_module(cfg):
  """The sampler's decode step for B=8 rows over 64 cache slots, lowered for a TPU v5e (StableHLO text)."""
  model = nnx.eval_shape(lambda: Qwen(cfg, rngs=nnx.Rngs(0)))
  graphdef, params = nnx.split(model)
  state = jax.eval_shape(lambda: sampler_lib.init_state(cfg, 8, 64, jax.random.key(0)))
  fn = jax.jit(lambda p, s: sampler_lib.decode(graphdef, SamplingConfig(segment_len=4), p, s, jnp.int32(4),
                                               jnp.int32(1)))
  with jax.sharding.use_abstract_mesh(testing.tpu_mesh()):
    return jax.export.export(fn, platforms=["tpu"])(params, state).mlir_module()


def test_decode_step_lowers_for_tpu_through_the_kernel():
  cfg = ModelConfig.tiny_qwen3(head_dim=128, dtype="bfloat16", attention_impl="ragged_paged", kv_page_size=16)
  text = _tpu_decode_module(cfg)
  assert "tpu_custom_call" in text and "ragged_paged_attention_kernel" in text
  with pytest.raises(ValueError, match="multiple of 128"):
    _tpu_decode_module(ModelConfig.tiny_qwen3(attention_impl="ragged_paged", kv_page_size=16))


def test_wrong_backend_and_wrong_cache_fail_clearly():
  cfg = ModelConfig.tiny_qwen3(attention_impl="ragged_paged", kv_page_size=16)
  model = testing.tiny_model(cfg, seed=0)
  cache = PagedKVCache.init(cfg, 1, 16)
  with pytest.raises(ValueError, match="runs on tpu"):
    model(jnp.ones((1, 4), jnp.int32), cache=cache)
  xla = testing.tiny_model(seed=0)
  with pytest.raises(ValueError, match="PagedKVCache is read by attention_impl='ragged_paged' only"):
    xla(jnp.ones((1, 4), jnp.int32), cache=cache)
  with pytest.raises(ValueError, match="kv_page_size"):
    ModelConfig.tiny_qwen3(kv_page_size=0)
