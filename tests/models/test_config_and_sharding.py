"""ModelConfig sizes, full-size shape checks, and the sharded forward on 8 fake CPU devices."""

from flax import nnx
import jax
import jax.numpy as jnp
import pytest

from agentrl_jax import testing
from agentrl_jax.models import hf_io, sharding
from agentrl_jax.models.config import SIZES, ModelConfig


def _count(model):
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_qwen3_4b_eval_shape_param_count():
  model = hf_io.abstract_model(ModelConfig.qwen3_4b())
  n = _count(model)
  assert abs(n - 4.02e9) / 4.02e9 <= 0.005, n
  assert n == ModelConfig.qwen3_4b().param_count()


@pytest.mark.parametrize("name,expected", [("qwen3_0p6b", 0.596e9), ("qwen3_1p7b", 1.72e9), ("qwen3_8b", 8.19e9),
                                           ("qwen2p5_7b", 7.62e9)])
def test_published_sizes(name, expected):
  cfg = ModelConfig.by_name(name)
  assert abs(cfg.param_count() - expected) / expected < 0.01, cfg.param_count()


def test_qwen3_4b_forward_traces():
  """The full-size forward traces (no memory allocated) with a KV cache, as the sampler uses it."""
  from agentrl_jax.models.kv_cache import KVCache

  cfg = ModelConfig.qwen3_4b(param_dtype="bfloat16", dtype="bfloat16")
  model = hf_io.abstract_model(cfg)
  graphdef, state = nnx.split(model)

  def fwd(state, tokens):
    cache = KVCache.init(cfg, batch=2, max_len=64)
    logits, cache = nnx.merge(graphdef, state)(tokens, cache=cache)
    return logits, cache

  logits, cache = jax.eval_shape(fwd, state, jax.ShapeDtypeStruct((2, 16), jnp.int32))
  assert logits.shape == (2, 16, 151936) and logits.dtype == jnp.float32
  assert cache.k.shape == (2, 36, 8, 128, 64) and cache.v.shape == (2, 36, 8, 64, 128)  # rows, then layers


def test_hf_config_round_trip():
  for name in SIZES:
    cfg = ModelConfig.by_name(name)
    assert ModelConfig.from_hf_config(cfg.to_hf_config()) == cfg.replace(
        max_position_embeddings=cfg.max_position_embeddings)
  with pytest.raises(ValueError, match="unknown size"):
    ModelConfig.by_name("gpt2")


@pytest.mark.parametrize("field,value", [("num_kv_heads", 3), ("head_dim", 7), ("dtype", "int8"), ("family", "llama"),
                                         ("hidden_size", 0)])
def test_config_validation_names_field(field, value):
  with pytest.raises(ValueError, match=field):
    ModelConfig.tiny_qwen3(**{field: value})


def test_rules_table_replicates_indivisible_dims():
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  assert sharding.logical_to_spec(("embed", "heads", "head_dim"), (64, 4, 16), mesh) == jax.P("fsdp", "tensor", None)
  # 3 heads are not divisible by tensor=2 -> replicated; 6 hidden not divisible by fsdp=4 -> fsdp dropped
  assert sharding.logical_to_spec(("embed", "heads", "head_dim"), (6, 3, 16), mesh) == jax.P(None, None, None)
  assert sharding.logical_to_spec(("batch", "seq"), (8, 5), mesh) == jax.P("fsdp", None)
  with pytest.raises(ValueError, match="not in LOGICAL_RULES"):
    sharding.logical_to_spec(("nonsense",))


def test_every_param_has_logical_axes():
  for cfg in (ModelConfig.tiny_qwen3(), ModelConfig.tiny_qwen2()):
    for path, var in nnx.to_flat_state(nnx.state(hf_io.abstract_model(cfg), nnx.Param)):
      axes = var.get_metadata().get("logical_axes")
      assert axes is not None and len(axes) == len(var.get_value().shape), path


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_sharded_forward_matches_single_device(family):
  assert len(jax.devices()) == 8, "conftest sets 8 fake CPU devices"
  cfg = ModelConfig.tiny_qwen3() if family == "qwen3" else ModelConfig.tiny_qwen2()
  model = testing.tiny_model(cfg, seed=4)
  graphdef, state = nnx.split(model)
  tokens = testing.random_tokens(jax.random.key(0), 4, 16, cfg.vocab_size)

  def fwd(state, tokens):
    return nnx.merge(graphdef, state)(tokens)[0]

  single = jax.jit(fwd)(state, tokens)
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  shardings = sharding.state_shardings(state, mesh)
  sharded_state = jax.device_put(state, shardings)
  q = sharded_state["layers"]["attn"]["q_dnh"].get_value()
  assert q.sharding.spec == jax.P(None, "fsdp", "tensor", None)  # [L, D, N, H]: the layer axis is never sharded
  with jax.set_mesh(mesh):
    tok_sharded = jax.device_put(tokens, sharding.named_sharding(mesh, ("batch", "seq"), tokens.shape))
    out = jax.jit(fwd)(sharded_state, tok_sharded)
  assert float(jnp.max(jnp.abs(out - single))) <= 1e-5


def test_sharded_load_places_params(hf_checkpoint):
  cfg, path = hf_checkpoint
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  model = hf_io.load_hf_checkpoint(path, mesh=mesh)
  emb = model.embed_vd[...]
  assert emb.sharding.spec == jax.P("tensor", "fsdp")
  assert len(emb.sharding.device_set) == 8
