"""HF checkpoint loading (single and index-sharded), export round trip, and bad checkpoints."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import pytest
import safetensors.numpy

from agentrl_jax import testing
from agentrl_jax.models import hf_io
from agentrl_jax.models.config import ModelConfig


def _logits_diff(ours, hf, cfg, seed=0):
  tokens = testing.random_tokens(jax.random.key(seed), 2, 9, cfg.vocab_size)
  return float(jnp.max(jnp.abs(ours(tokens)[0] - testing.hf_logits(hf, tokens))))


def test_export_round_trip(hf_checkpoint, tmp_path):
  """our export -> transformers loads -> same logits as our model."""
  cfg, path = hf_checkpoint
  ours = hf_io.load_hf_checkpoint(path)
  out = hf_io.export_hf(ours, tmp_path / "export", tokenizer=testing.tiny_tokenizer())
  reloaded = testing.load_hf_torch(out)
  assert _logits_diff(ours, reloaded, cfg) <= 1e-4
  assert os.path.exists(os.path.join(out, "tokenizer_config.json"))
  # and our loader reads our own export back exactly
  again = hf_io.load_hf_checkpoint(out)
  tokens = testing.random_tokens(jax.random.key(5), 1, 7, cfg.vocab_size)
  assert float(jnp.max(jnp.abs(again(tokens)[0] - ours(tokens)[0]))) == 0.0


def test_index_sharded_checkpoint(tmp_path):
  cfg = ModelConfig.tiny_qwen3()
  path = testing.save_random_hf_checkpoint(cfg, tmp_path / "sharded", seed=3, max_shard_size="100KB")
  assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
  ours = hf_io.load_hf_checkpoint(path)
  assert _logits_diff(ours, testing.load_hf_torch(path), cfg) <= 1e-4


def test_load_bfloat16_params(hf_checkpoint):
  cfg, path = hf_checkpoint
  ours = hf_io.load_hf_checkpoint(path, param_dtype="bfloat16", dtype="bfloat16")
  assert ours.embed_vd[...].dtype == jnp.bfloat16
  logits, _ = ours(testing.random_tokens(jax.random.key(0), 1, 4, cfg.vocab_size))
  assert logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(logits)))


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


def _rewrite_tensors(path, fn):
  f = os.path.join(path, "model.safetensors")
  tensors = dict(safetensors.numpy.load_file(f))
  fn(tensors)
  safetensors.numpy.save_file(tensors, f, metadata={"format": "pt"})


def test_missing_tensor_is_named(hf_checkpoint, tmp_path):
  cfg, src = hf_checkpoint
  path = _copy(src, tmp_path / "ckpt")
  _rewrite_tensors(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(ValueError, match=r"missing tensor 'model.layers.1.mlp.up_proj.weight'"):
    hf_io.load_hf_checkpoint(path)


def test_wrong_shape_is_named(hf_checkpoint, tmp_path):
  cfg, src = hf_checkpoint
  path = _copy(src, tmp_path / "ckpt")

  def shrink(t):
    t["model.layers.0.self_attn.k_proj.weight"] = t["model.layers.0.self_attn.k_proj.weight"][:-1]

  _rewrite_tensors(path, shrink)
  with pytest.raises(ValueError, match=r"model.layers.0.self_attn.k_proj.weight.*shape"):
    hf_io.load_hf_checkpoint(path)


def test_unknown_architecture_is_named(hf_checkpoint, tmp_path):
  cfg, src = hf_checkpoint
  path = _copy(src, tmp_path / "ckpt")
  with open(os.path.join(path, "config.json")) as f:
    hf_cfg = json.load(f)
  hf_cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_cfg, f)
  with pytest.raises(ValueError, match="unknown architecture.*LlamaForCausalLM"):
    hf_io.load_hf_checkpoint(path)


def test_missing_config_field_and_weights(tmp_path):
  with pytest.raises(ValueError, match="missing field 'num_attention_heads'"):
    ModelConfig.from_hf_config({"model_type": "qwen3", "vocab_size": 10})
  (tmp_path / "config.json").write_text(json.dumps(ModelConfig.tiny_qwen3().to_hf_config()))
  with pytest.raises(ValueError, match="no model.safetensors"):
    hf_io.load_hf_checkpoint(tmp_path)
