"""LoRA adapters on the decoder: zero B is the base function exactly, merged weights give the adapted model's
logits, the adapters' gradients equal those through the merged weights, the cache path (sampling) matches the
full forward, target patterns, dropout, config validation."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from agentrl_jax import testing
from agentrl_jax.models import lora
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import KVCache

CFG = ModelConfig.tiny_qwen3(num_layers=2)
ALL = lora.LoraConfig(rank=4, alpha=8.0)


def _max_diff(a, b) -> float:
  return float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))))


def _random_b(model, seed=0, scale=0.05):
  """The model with every B adapter drawn at random (a freshly added adapter's B is 0: no change to see)."""
  graphdef, params = nnx.split(model)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
  out = []
  for i, (path, v) in enumerate(leaves):
    if isinstance(v, nnx.LoRAParam) and "_lora_b_" in str(path[-1]):
      v = v.replace(scale * jax.random.normal(jax.random.key(seed * 100 + i), v.get_value().shape))
    out.append(v)
  return nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, out))


def _adapted(cfg=CFG, lora_cfg=ALL, seed=0):
  return _random_b(lora.apply(testing.tiny_model(cfg, seed=seed), lora_cfg, jax.random.key(7)), seed)


@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
def test_zero_b_is_the_base_function_exactly(scan):
  cfg = CFG.replace(scan_layers=scan)
  base = testing.tiny_model(cfg, seed=0)
  tokens = testing.random_tokens(jax.random.key(1), 2, 16, cfg.vocab_size)
  want = testing.jit_forward(base)(tokens)[0]
  model = lora.apply(testing.tiny_model(cfg, seed=0), ALL, jax.random.key(7))
  assert _max_diff(testing.jit_forward(model)(tokens)[0], want) == 0.0
  adapted = _random_b(model)
  assert _max_diff(testing.jit_forward(adapted)(tokens)[0], want) > 1e-2  # the adapters do change the function
  graphdef, params = nnx.split(adapted)
  zeroed = nnx.merge(graphdef, lora.without_adapters(params))
  assert _max_diff(testing.jit_forward(zeroed)(tokens)[0], want) == 0.0
  # The reference shares the base weights with the policy (no copy) and never touches the policy's adapters.
  assert zeroed.layers.attn.q_dnh.get_value() is adapted.layers.attn.q_dnh.get_value()
  assert float(jnp.max(jnp.abs(adapted.layers.attn.q_lora_b_rnh[...]))) > 0


def test_merged_weights_give_the_adapted_logits():
  model = _adapted()
  tokens = testing.random_tokens(jax.random.key(2), 3, 12, CFG.vocab_size)
  want = testing.jit_forward(model)(tokens)[0]
  plain = lora.merged(model)
  assert not nnx.state(plain, nnx.LoRAParam) and nnx.state(model, nnx.LoRAParam)  # the original keeps them
  assert _max_diff(testing.jit_forward(plain)(tokens)[0], want) <= 2e-5
  # Jitted, as a sampler would merge once per weight update.
  graphdef, params = nnx.split(model)
  merged_params = jax.jit(lambda p: lora.merge_params(graphdef, p)[1])(params)
  plain_def = nnx.split(plain)[0]
  assert _max_diff(testing.jit_forward(nnx.merge(plain_def, merged_params))(tokens)[0], want) <= 2e-5


def test_adapter_gradients_equal_the_gradients_through_merged_weights():
  """The unmerged forward (adapters beside the frozen products; the MLP leaves its hand-written backward) has
  the gradient of the function W + alpha / r * A B."""
  model = _adapted()
  graphdef, params = nnx.split(model)
  adapters, base = lora.split(params)
  tokens = testing.random_tokens(jax.random.key(3), 2, 10, CFG.vocab_size)
  w = jax.random.normal(jax.random.key(4), (2, 10, CFG.vocab_size))

  def unmerged(a):
    return jnp.sum(nnx.merge(graphdef, base, a)(tokens)[0] * w)

  def through_merged(a):
    return jnp.sum(lora.merged(nnx.merge(graphdef, base, a))(tokens)[0] * w)

  g1 = jax.jit(jax.grad(unmerged))(adapters)
  g2 = jax.jit(jax.grad(through_merged))(adapters)
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g2))
  assert scale > 0
  for x, y in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    assert _max_diff(x, y) <= 1e-4 * scale


def test_cached_decode_with_adapters_matches_the_full_forward():
  """The sampler's path (prefill then one token at a time into the KV cache) runs the adapters too."""
  model = _adapted()
  tokens = testing.random_tokens(jax.random.key(5), 2, 10, CFG.vocab_size)
  want = testing.jit_forward(model)(tokens)[0]
  fwd = testing.jit_forward(model)
  logits, cache = fwd(tokens[:, :4], cache=KVCache.init(CFG, batch=2, max_len=16))
  got = [logits]
  for t in range(4, 10):
    logits, cache = fwd(tokens[:, t:t + 1], cache=cache)
    got.append(logits)
  assert _max_diff(jnp.concatenate(got, axis=1), want) <= 1e-4


def test_target_pattern_selects_the_adapted_weights():
  model = lora.apply(testing.tiny_model(CFG), lora.LoraConfig(rank=3, targets="q|v|down"), jax.random.key(0))
  names = sorted("/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)))
  assert names == ["layers/attn/q_lora_a_dr", "layers/attn/q_lora_b_rnh", "layers/attn/v_lora_a_dr",
                   "layers/attn/v_lora_b_rkh", "layers/mlp/down_lora_a_fr", "layers/mlp/down_lora_b_rd"]
  layers, d, n, h, f = CFG.num_layers, CFG.hidden_size, CFG.num_heads, CFG.head_dim, CFG.intermediate_size
  q_b = model.layers.attn.q_lora_b_rnh
  assert q_b.get_value().shape == (layers, 3, n, h)
  assert q_b.get_metadata()["logical_axes"] == ("layers", None, "heads", "head_dim")
  assert model.layers.mlp.down_lora_a_fr.get_value().shape == (layers, f, 3)
  assert model.layers.attn.q_lora_a_dr.get_value().shape == (layers, d, 3)
  assert float(jnp.max(jnp.abs(q_b[...]))) == 0.0  # B starts at zero
  assert lora.LoraConfig(rank=2, targets=".*").modules == tuple(lora.TARGETS)
  assert lora.LoraConfig(rank=2, targets="gate|up").modules == ("gate", "up")
  with pytest.raises(ValueError, match="already has LoRA adapters"):
    lora.apply(model, ALL, jax.random.key(0))


def test_dropout_applies_only_with_a_key():
  model = _adapted(lora_cfg=lora.LoraConfig(rank=4, alpha=8.0, dropout=0.5))
  graphdef, params = nnx.split(model)
  tokens = testing.random_tokens(jax.random.key(6), 2, 12, CFG.vocab_size)
  fwd = jax.jit(lambda p, key: nnx.merge(graphdef, p)(tokens, dropout_key=key)[0])
  plain = jax.jit(lambda p: nnx.merge(graphdef, p)(tokens)[0])(params)
  a, b, c = fwd(params, jax.random.key(1)), fwd(params, jax.random.key(1)), fwd(params, jax.random.key(2))
  assert _max_diff(a, b) == 0.0 and _max_diff(a, c) > 1e-3 and _max_diff(a, plain) > 1e-3
  # Without dropout in the config a key changes nothing.
  no_drop = _adapted()
  g2, p2 = nnx.split(no_drop)
  with_key = jax.jit(lambda p: nnx.merge(g2, p)(tokens, dropout_key=jax.random.key(1))[0])(p2)
  assert _max_diff(with_key, testing.jit_forward(no_drop)(tokens)[0]) == 0.0
  assert lora.dropout_rate(graphdef, params) == 0.5 and lora.dropout_rate(g2, p2) == 0.0


@pytest.mark.parametrize("field,value", [("rank", -1), ("rank", 1.5), ("alpha", 0.0), ("dropout", 1.0),
                                         ("targets", "attn"), ("targets", "q|(")])
def test_config_validation_names_the_field(field, value):
  with pytest.raises(ValueError, match=f"LoraConfig.{field}"):
    lora.LoraConfig(**{"rank": 4, field: value})


def test_config_block_round_trip_and_rank_zero_is_off():
  block = lora.config_block(rank=8, targets="q|k")
  cfg = lora.LoraConfig.from_block(block)
  assert cfg.enabled and cfg.rank == 8 and cfg.modules == ("q", "k") and cfg.scale == 16.0 / 8
  assert not lora.LoraConfig.from_block(None).enabled and not lora.LoraConfig.from_block(lora.config_block()).enabled
  model = testing.tiny_model(CFG)
  assert lora.apply(model, lora.LoraConfig(), jax.random.key(0)) is model and not nnx.state(model, nnx.LoRAParam)
  with pytest.raises(ValueError, match="unknown fields"):
    lora.config_block(ranks=2)
  assert not jax.tree.leaves(lora.split(nnx.state(model))[0])
