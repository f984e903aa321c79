"""The length-aware decode attention on XLA:CPU (`models.cpu_kernels`, `cpu_attention.cc`).

It must give the sums of the XLA form (`attention_kernels.single_query_attention`) under the mask `slot < valid[b]`,
read nothing at or past `valid[b]`, run inside compiled loops on XLA's thread pool, and be what the sampler's
decode program calls on one CPU device (the XLA form elsewhere). A machine that runs the tests has a C++ compiler
(`launch/setup.sh` installs one), so the kernel must build here: no skip."""

import ctypes

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import attention_kernels, cpu_kernels
from agentrl_jax.sampling import generate as generate_lib, sampler as sampler_lib
from agentrl_jax.sampling.config import SamplingConfig


def _inputs(b, nk, g, h, s, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(keys[0], (b, nk, g, h)), jax.random.normal(keys[1], (b, nk, h, s)),
          jax.random.normal(keys[2], (b, nk, s, h)))


def _reference(q, k_t, v, valid, scale):
  mask = jnp.arange(k_t.shape[-1])[None] < valid[:, None]
  return attention_kernels.single_query_attention(q, k_t, v, mask, scale)


def test_the_kernel_builds_here(tmp_path, monkeypatch):
  """A fresh build (an empty cache), loadable, then found in the cache instead of rebuilt."""
  cxx = cpu_kernels.compiler()
  assert cxx is not None, "no C++ compiler: launch/setup.sh installs g++ (as root)"
  monkeypatch.setenv("AGENTRL_KERNEL_CACHE", str(tmp_path))
  lib = cpu_kernels.build(cxx)
  assert lib.parent == tmp_path and lib.stat().st_size > 0
  assert ctypes.cdll.LoadLibrary(str(lib)).AgentrlSingleQueryAttention
  built = lib.stat().st_mtime_ns
  assert cpu_kernels.build(cxx) == lib and lib.stat().st_mtime_ns == built
  assert cpu_kernels.available(), "the kernel did not build or register (see the logged reason)"


@pytest.mark.parametrize("shape", [(3, 2, 2, 8, 50), (5, 1, 1, 64, 7), (2, 4, 3, 5, 129), (2, 2, 2, 12, 37),
                                   (16, 4, 2, 64, 320)])
def test_matches_the_xla_form_under_the_mask(shape):
  b, nk, g, h, s = shape
  q, k_t, v = _inputs(*shape)
  valid = jnp.asarray(np.random.default_rng(s).integers(1, s + 1, b), jnp.int32).at[0].set(s).at[-1].set(1)
  got = jax.jit(lambda *a: cpu_kernels.single_query_attention(*a, 0.3))(q, k_t, v, valid)
  want = _reference(q, k_t, v, valid, 0.3)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=2e-6)


def test_valid_past_the_cache_reads_the_whole_row():
  q, k_t, v = _inputs(2, 2, 2, 8, 16)
  over = cpu_kernels.single_query_attention(q, k_t, v, jnp.array([16, 40], jnp.int32), 0.5)
  full = _reference(q, k_t, v, jnp.array([16, 16], jnp.int32), 0.5)
  np.testing.assert_allclose(np.asarray(over), np.asarray(full), rtol=2e-6, atol=2e-6)


def test_a_row_outside_the_step_reads_nothing_and_gives_zeros():
  """`valid[b] <= 0` (a decode step's stopped or waiting row): zeros out, even over a cache of NaN, and the
  other rows' outputs are exactly what they are without it."""
  q, k_t, v = _inputs(4, 2, 2, 16, 32, seed=5)
  valid = jnp.array([9, 0, 32, -3], jnp.int32)
  off = (valid <= 0)[:, None, None, None]
  got = cpu_kernels.single_query_attention(q, jnp.where(off, jnp.nan, k_t), jnp.where(off, jnp.nan, v), valid, 0.25)
  got = np.asarray(got)
  np.testing.assert_array_equal(got[[1, 3]], 0.0)
  alone = np.asarray(cpu_kernels.single_query_attention(q, k_t, v, jnp.array([9, 5, 32, 7], jnp.int32), 0.25))
  np.testing.assert_array_equal(got[[0, 2]], alone[[0, 2]])


def test_reads_nothing_past_each_rows_length():
  """NaN in every slot past a row's length leaves its output exact: those slots are never read (the XLA form
  multiplies them by a zero probability, and NaN * 0 is NaN)."""
  q, k_t, v = _inputs(4, 2, 2, 16, 64)
  valid = jnp.array([1, 17, 40, 64], jnp.int32)
  past = jnp.arange(64)[None] >= valid[:, None]  # [B, S]
  k_nan = jnp.where(past[:, None, None, :], jnp.nan, k_t)
  v_nan = jnp.where(past[:, None, :, None], jnp.nan, v)
  clean = cpu_kernels.single_query_attention(q, k_t, v, valid, 0.25)
  dirty = cpu_kernels.single_query_attention(q, k_nan, v_nan, valid, 0.25)
  assert np.isfinite(np.asarray(dirty)).all()
  np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))
  assert not np.isfinite(np.asarray(_reference(q, k_nan, v_nan, valid, 0.25))).all()


def test_inside_a_compiled_loop_on_the_thread_pool():
  """Many (row, kv head) pairs shared out over XLA's intra-op threads, called from a `lax.fori_loop`: the same
  result as one call at a time, every iteration."""
  q, k_t, v = _inputs(32, 4, 2, 32, 96, seed=3)
  valid = jnp.arange(32, dtype=jnp.int32) * 3 + 1

  def body(i, acc):
    return acc + cpu_kernels.single_query_attention(q * (i + 1), k_t, v, valid, 0.2)

  got = jax.jit(lambda: jax.lax.fori_loop(0, 6, body, jnp.zeros_like(q)))()
  want = sum(cpu_kernels.single_query_attention(q * (i + 1), k_t, v, valid, 0.2) for i in range(6))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_a_failed_build_names_the_compiler_output(tmp_path, monkeypatch):
  monkeypatch.setenv("AGENTRL_KERNEL_CACHE", str(tmp_path))
  bad = tmp_path / "cxx"
  bad.write_text("#!/bin/sh\necho 'no such compiler today' >&2\nexit 1\n")
  bad.chmod(0o755)
  with pytest.raises(RuntimeError, match="no such compiler today"):
    cpu_kernels.build(str(bad))
  assert not list(tmp_path.glob("*.so")), "a failed build must leave nothing in the cache"


def test_off_on_request(monkeypatch):
  monkeypatch.setenv("AGENTRL_CPU_KERNELS", "0")
  assert not cpu_kernels.available.__wrapped__()


def test_length_aware_only_on_one_cpu_device_in_float32():
  assert attention_kernels.length_aware_decode(jnp.float32)
  assert not attention_kernels.length_aware_decode(jnp.bfloat16)
  mesh = jax.sharding.AbstractMesh((2,), ("data",))
  with jax.sharding.use_abstract_mesh(mesh):
    assert not attention_kernels.length_aware_decode(jnp.float32)


def _decode_text(model):
  graphdef, params = nnx.split(model)
  s = sampler_lib.make_sampler(graphdef, model.cfg, SamplingConfig(segment_len=8), batch=4)
  state = s.init(64, jax.random.key(0))
  return s.jitted["decode"].lower(params, state, jnp.int32(8), jnp.int32(1)).as_text()


def test_the_sampler_decodes_with_the_kernel_and_draws_what_the_xla_form_draws(monkeypatch):
  model = testing.tiny_model()
  assert cpu_kernels.TARGET in _decode_text(model)
  graphdef, params = nnx.split(model)
  prompts = [[3, 5, 7], [11, 2, 9, 4, 6], [8], [1, 2, 3, 4, 5, 6, 7, 8, 9]]

  def draw():
    s = sampler_lib.make_sampler(graphdef, model.cfg, SamplingConfig(segment_len=8, greedy=True), batch=4)
    return generate_lib.generate(s, params, prompts, key=jax.random.key(0), max_new_tokens=20)

  with_kernel = draw()
  monkeypatch.setattr(cpu_kernels, "available", lambda: False)
  assert cpu_kernels.TARGET not in _decode_text(model)
  without = draw()
  for a, b in zip(with_kernel.tokens, without.tokens):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(with_kernel.logp_raw, without.logp_raw):
    np.testing.assert_allclose(a, b, atol=1e-5)
