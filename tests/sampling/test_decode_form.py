"""The form of the decode loop XLA:CPU compiles (`sampling.state.carry_per_layer`): no step copies a layer's weights.

Issue 32: with a layer's weights sliced out of the stacked parameters inside the loop, every decode step copied
them (read, write, read again), which cost the 58M benchmark model a third of its decode speed. The weights are
split once per call; the check reads the optimized program, so it holds on any machine."""

import dataclasses
import math
import re

from flax import nnx
import jax
import jax.numpy as jnp

from agentrl_jax import testing
from agentrl_jax.models import attention_kernels
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.sampling import generate as generate_lib, sampler as sampler_lib
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


def _weight_sizes(params):
  """Element counts of the per-layer weight matrices (the size of any copy of one, whatever its layout)."""
  return {int(leaf[0].size) for leaf in jax.tree.leaves(params["layers"]) if leaf.ndim >= 3}


def test_decode_loop_copies_no_weight_in_any_layout():
  """No step copies a weight into another layout either: the attention output projection, written as a
  contraction over (heads, head_dim), had XLA:CPU transpose the whole `o` weight to (head_dim, heads) order
  on every step (one `copy` fusion per layer per step); one contraction over the flattened heads reads it in
  place."""
  model = testing.tiny_model()
  hlo, params = _decode_hlo(model)
  sizes = _weight_sizes(params)
  in_loop = [line for line in hlo.splitlines() if "/while/body/" in line or "fusion(%get-tuple-element" in line]
  copies = []
  for line in in_loop:
    m = re.match(r"\s*%(\S*copy\S*) = f32\[([\d,]+)\]", line)
    if m and math.prod(map(int, m.group(2).split(","))) in sizes:
      copies.append(line.strip()[:160])
  assert not copies, copies


def test_layer_weights_split_once_per_weight_version():
  """`Sampler.decode` splits the layers' weights once per weight version (new arrays), not once per call, and
  draws exactly what a decode splitting them inside the call draws."""
  model = testing.tiny_model()
  graphdef, params = nnx.split(model)
  s = sampler_lib.make_sampler(graphdef, model.cfg, SamplingConfig(segment_len=4), batch=2)
  in_call = dataclasses.replace(s, decode=lambda *a: s.jitted["decode"](*a))  # no fifth argument: split inside
  prompts = [[1, 2, 3], [4, 5]]

  def run(sampler, p):
    out = generate_lib.generate(sampler, p, prompts, key=jax.random.key(0), max_new_tokens=10)
    return [list(map(int, t)) for t in out.tokens], [list(map(float, x)) for x in out.logp_raw]

  first = run(s, params)  # three decode calls
  assert s.layer_parts.splits == 1
  assert run(s, params) == first and s.layer_parts.splits == 1  # same arrays: the parts are reused
  assert run(in_call, params) == first

  updated = jax.tree.map(lambda x: x * 1.5, params)  # a new weight version
  moved = run(s, updated)
  assert s.layer_parts.splits == 2
  assert moved == run(in_call, updated)
  assert moved != first  # the new weights were used, not the parts of the old ones


def test_cpu_sampler_keeps_the_cache_per_layer_between_calls():
  """On XLA:CPU the sampler's cache is one array per layer from `init` on (`sampling.state.cache_per_layer`), so no
  decode call splits a stacked cache at its start or restacks it at its end (two copies of the whole cache a
  call): the compiled decode program holds no array of the stacked cache's shape. The draws are those of a
  stacked cache that each call splits and restacks."""
  model = testing.tiny_model(ModelConfig.tiny_qwen3(num_layers=3))  # 3 layers: no other array has the cache's shape
  cfg = model.cfg
  assert sampler_lib.cache_per_layer(cfg)
  hlo, _ = _decode_hlo(model, batch=3, capacity=40)
  stacked = {f"f32[3,{cfg.num_layers},{cfg.num_kv_heads},{cfg.head_dim},40]",
             f"f32[3,{cfg.num_layers},{cfg.num_kv_heads},40,{cfg.head_dim}]"}
  per_layer = {s.replace(f"[3,{cfg.num_layers},", "[3,1,") for s in stacked}
  assert any(s in hlo for s in per_layer), "the per-layer cache arrays are not in the program"
  found = [line.strip()[:160] for line in hlo.splitlines() if any(f" = {s}" in line for s in stacked)]
  assert not found, found

  graphdef, params = nnx.split(model)
  s = sampler_lib.make_sampler(graphdef, cfg, SamplingConfig(segment_len=4), batch=2)
  state = s.init(16, jax.random.key(0))
  assert len(jax.tree.leaves(state.cache.k)) == cfg.num_layers
  assert all(k.shape == (2, 1, cfg.num_kv_heads, cfg.head_dim, 16) for k in state.cache.k)
  with_stacked = dataclasses.replace(s, init=lambda cap, key: (lambda st: st.replace(cache=st.cache.stacked()))(
      s.init(cap, key)))
  prompts = [[1, 2, 3], [4, 5]]

  def run(sampler):
    out = generate_lib.generate(sampler, params, prompts, key=jax.random.key(0), max_new_tokens=10)
    return [list(map(int, t)) for t in out.tokens], [list(map(float, x)) for x in out.logp_raw]

  assert run(s) == run(with_stacked)
