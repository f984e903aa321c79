"""`ModelConfig.kv_cache_dtype`: an 8-bit float KV cache (half of a bf16 one) holds float8 arrays, the passes
over it read them back in the compute dtype (the XLA path and the ragged paged kernel's contract), and the
model's log-probs through it stay within the rounding of 3 mantissa bits of the full-precision cache's; the TPU
kernel compiles with float8 pages for v5e, v5p and v6e."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import attention_kernels
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import make_cache


@pytest.mark.parametrize("impl", ["xla", "ragged_paged"])
def test_a_float8_cache_is_read_back_within_its_rounding(impl):
  base = ModelConfig.tiny_qwen3(head_dim=16, attention_impl=impl, attention_interpret=impl == "ragged_paged",
                                kv_page_size=8)
  tokens = testing.random_tokens(jax.random.key(0), 2, 24, base.vocab_size)
  out = {}
  for kv_dtype in ("", "float8_e4m3fn"):
    cfg = base.replace(kv_cache_dtype=kv_dtype)
    model = testing.tiny_model(cfg, seed=3)
    cache = make_cache(cfg, 2, 32)
    assert cache.dtype == (jnp.float8_e4m3fn if kv_dtype else jnp.float32)
    prefill, cache = model(tokens[:, :16], cache=cache)  # the prompt, then 8 tokens one chunk later
    extend, cache = model(tokens[:, 16:], cache=cache)
    out[kv_dtype] = jax.nn.log_softmax(jnp.concatenate([prefill, extend], axis=1))
  full, fp8 = np.asarray(out[""]), np.asarray(out["float8_e4m3fn"])
  assert not np.array_equal(full, fp8)  # the keys and values really were rounded
  # 3 mantissa bits: each key and value within 2^-4 of itself; the log-probs of this random model move by a few
  # hundredths of a nat at most, a few thousandths on average.
  err = np.abs(fp8 - full)
  assert err.max() < 0.05 and err.mean() < 5e-3, (err.max(), err.mean())
  with pytest.raises(ValueError, match="kv_cache_dtype"):
    base.replace(kv_cache_dtype="int4")


@pytest.mark.parametrize("topology", ["v5e:2x2", "v5p:2x2x1", "v6e:2x2"])
def test_the_ragged_paged_kernel_compiles_with_float8_pages(topology):
  """The real kernel through the TPU compiler (Mosaic), one decode step over a two-layer float8 paged cache of 8 kv
  heads (Qwen3-4B's), as `attention_kernels.kernel_refusal` compiles the bf16 one."""
  from agentrl_jax import compile_stats
  from agentrl_jax.aot import target

  device = target.target(topology).devices[0]
  mesh = jax.sharding.Mesh(np.asarray([device]), ("data",))
  sh = jax.sharding.NamedSharding(mesh, jax.P())
  spec = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype, sharding=sh)  # noqa: E731
  step = jax.jit(lambda q, kv, lengths: attention_kernels.ragged_paged_attention(
      q, kv, 1, lengths, jnp.ones_like(lengths), 1.0, 64))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), compile_stats.persistent_cache_off():
    lowered = step.trace(spec((2, 1, 8, 4, 128)), spec((2, 2, 256, 16, 128), jnp.float8_e4m3fn),
                         spec((2,), jnp.int32)).lower()
    assert testing.tpu_kernel_names(lowered.as_text())  # the Pallas kernel, not an XLA stand-in
    lowered.compile()
