"""The form of the decode loop XLA:CPU compiles (`sampler.carry_per_layer`): no step copies a layer's weights.

Issue 32: with a layer's weights sliced out of the stacked parameters inside the loop, every decode step copied
them (read, write, read again), which cost the 58M benchmark model a third of its decode speed. The weights are
split once per call; the check reads the optimized program, so it holds on any machine."""

import re

from flax import nnx
import jax
import jax.numpy as jnp

from agentrl_jax import testing
from agentrl_jax.models import attention_kernels
from agentrl_jax.sampling import sampler as sampler_lib
from agentrl_jax.sampling.config import SamplingConfig


def _decode_hlo(model, batch=4, capacity=64):
  graphdef, params = nnx.split(model)
  s = sampler_lib.make_sampler(graphdef, model.cfg, SamplingConfig(segment_len=8), batch=batch)
  state = s.init(capacity, jax.random.key(0))
  return s.jitted["decode"].lower(params, state, jnp.int32(8), jnp.int32(1)).compile().as_text(), params


def _shapes(params):
  """Each per-layer weight's shape as HLO writes it, with and without the leading layer axis of 1."""
  out = set()
  for leaf in jax.tree.leaves(params["layers"]):
    if leaf.ndim >= 3:  # matrices (norm vectors are too small to matter)
      dims = ",".join(map(str, leaf.shape[1:]))
      out |= {f"f32[{dims}]", f"f32[1,{dims}]"}
  return out


def test_decode_on_cpu_splits_the_layer_weights_once_per_call_not_per_step():
  assert attention_kernels.target_platform() == "cpu"
  model = testing.tiny_model()
  assert sampler_lib.carry_per_layer(sampler_lib.init_state(model.cfg, 2, 8, jax.random.key(0)).cache)
  hlo, params = _decode_hlo(model)
  weights = _shapes(params)
  in_loop = [line for line in hlo.splitlines() if "/while/body/" in line]
  assert in_loop, "the decode loop was not found in the program"
  copied = [line.strip()[:160] for line in in_loop
            if re.search(r"/while/body/(split|slice|dynamic_slice)", line)
            and any(f" = {shape}" in line for shape in weights)]
  assert not copied, copied
  # ... and the split happens outside the loop, once per call.
  assert any(re.search(r'op_name="jit\(decode\)/split', line) and any(f" = {s}" in line for s in weights)
             for line in hlo.splitlines())
