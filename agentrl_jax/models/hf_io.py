"""HF interop: load a Qwen checkpoint directory into a (sharded) model, and export back to a HF directory.

Loading reads one parameter at a time (lazily from single or index-sharded safetensors), converts it to our
layout and places it straight into its target sharding with `jax.make_array_from_callback`, so the host never
holds more than one parameter beyond what the devices keep: there is never a second host copy of the model. A
decoder-layer parameter is stacked over the layers (`model.layers.{i}.mlp.up_proj.weight` for every i is one
`[L, D, F]` array), so that parameter is the L layers' tensors of one kind.
"""

from __future__ import annotations

from collections.abc import Iterator
import json
import logging
import os

from flax import nnx
import jax
import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.qwen import Qwen

log = logging.getLogger(__name__)

_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_MAX_SHARD_BYTES = 4 << 30


# --------------------------------------------------------------------------- name/layout mapping
def _param_map(cfg: ModelConfig) -> Iterator[tuple[tuple, tuple[str, ...], tuple[int, ...], str]]:
  """Yields (our flat path, HF tensor names, HF shape of each, layout kind); a decoder-layer parameter names one
  HF tensor per layer (stacked along our leading axis). See `_to_ours`/`_to_hf` for the kinds."""
  d, f, n, k, h, v = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                      cfg.vocab_size)
  yield ("embed_vd",), ("model.embed_tokens.weight",), (v, d), "same"
  yield ("final_norm_d",), ("model.norm.weight",), (d,), "same"
  if not cfg.tie_embeddings:
    yield ("unembed_dv",), ("lm_head.weight",), (v, d), "transpose"
  layer = [("attn_norm_d",), "input_layernorm.weight", (d,), "same"], [
      ("mlp_norm_d",), "post_attention_layernorm.weight", (d,), "same"], [
      ("attn", "q_dnh"), "self_attn.q_proj.weight", (n * h, d), "in_proj"], [
      ("attn", "k_dkh"), "self_attn.k_proj.weight", (k * h, d), "in_proj"], [
      ("attn", "v_dkh"), "self_attn.v_proj.weight", (k * h, d), "in_proj"], [
      ("attn", "o_nhd"), "self_attn.o_proj.weight", (d, n * h), "out_proj"]
  if cfg.qkv_bias:
    layer += ([("attn", "q_bias_nh"), "self_attn.q_proj.bias", (n * h,), "reshape"],
              [("attn", "k_bias_kh"), "self_attn.k_proj.bias", (k * h,), "reshape"],
              [("attn", "v_bias_kh"), "self_attn.v_proj.bias", (k * h,), "reshape"])
  if cfg.qk_norm:
    layer += ([("attn", "q_norm_h"), "self_attn.q_norm.weight", (h,), "same"],
              [("attn", "k_norm_h"), "self_attn.k_norm.weight", (h,), "same"])
  layer += ([("mlp", "gate_df"), "mlp.gate_proj.weight", (f, d), "transpose"],
            [("mlp", "up_df"), "mlp.up_proj.weight", (f, d), "transpose"],
            [("mlp", "down_fd"), "mlp.down_proj.weight", (d, f), "transpose"])
  for path, suffix, shape, kind in layer:
    yield ("layers",) + path, tuple(f"model.layers.{i}.{suffix}" for i in range(cfg.num_layers)), shape, kind


def _to_ours(w: np.ndarray, kind: str, our_shape: tuple[int, ...]) -> np.ndarray:
  """HF layout -> ours. HF linear weights are [out, in]; ours are [in, ...out] (einsum-ready)."""
  if kind in ("transpose", "in_proj", "out_proj"):  # e.g. HF [N*H, D] -> [D, N, H]; HF [D, N*H] -> [N, H, D]
    return np.ascontiguousarray(w.T).reshape(our_shape)
  return w.reshape(our_shape)


def _to_hf(w: np.ndarray, kind: str, hf_shape: tuple[int, ...]) -> np.ndarray:
  """Ours -> HF layout (inverse of `_to_ours`)."""
  if kind in ("transpose", "in_proj"):  # ours [D, (heads, H) | F | V] -> HF [out, D]
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)
  if kind == "out_proj":  # ours [N, H, D] -> HF [D, N*H]
    return np.ascontiguousarray(w.reshape(-1, w.shape[-1]).T)
  return w.reshape(hf_shape)


class _SafetensorsReader:
  """Lazy access to the tensors of a checkpoint directory (single file or index-sharded)."""

  def __init__(self, path: str):
    self.path = path
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index):
      with open(index) as f:
        self.weight_map = json.load(f)["weight_map"]
    elif os.path.exists(single):
      with safetensors.safe_open(single, framework="numpy") as f:
        self.weight_map = {name: "model.safetensors" for name in f.keys()}
    else:
      raise ValueError(f"{path}: no model.safetensors or model.safetensors.index.json")
    self._handles = {}

  def names(self):
    return set(self.weight_map)

  def get(self, name: str) -> np.ndarray:
    if name not in self.weight_map:
      raise ValueError(f"{self.path}: checkpoint is missing tensor {name!r}")
    fname = self.weight_map[name]
    if fname not in self._handles:
      self._handles[fname] = safetensors.safe_open(os.path.join(self.path, fname), framework="numpy")
    return self._handles[fname].get_tensor(name)

  def close(self):
    self._handles.clear()


# --------------------------------------------------------------------------- load
def abstract_model(cfg: ModelConfig) -> Qwen:
  """The model with ShapeDtypeStruct leaves: no memory allocated (use with `jax.eval_shape`-style code)."""
  return nnx.eval_shape(lambda: Qwen(cfg, rngs=nnx.Rngs(0)))


def load_hf_checkpoint(path: str | os.PathLike, cfg: ModelConfig | None = None, *, mesh: jax.sharding.Mesh | None = None,
                       **cfg_overrides) -> Qwen:
  """Loads a HF Qwen2/Qwen3 checkpoint directory into our model.

  Args:
    path: directory with `config.json` and safetensors weights.
    cfg: the config to build; by default read from `config.json` (then `cfg_overrides` apply, e.g.
      `param_dtype="bfloat16"`).
    mesh: place every parameter directly into its sharding on this mesh; default the first local device.

  Raises:
    ValueError: unknown architecture, a missing tensor or a tensor of the wrong shape (named).
  """
  path = os.fspath(path)
  cfg = cfg or ModelConfig.from_hf_config(path, **cfg_overrides)
  graphdef, abs_state = nnx.split(abstract_model(cfg))
  if mesh is None:
    mesh = sharding_lib.make_mesh(1, 1, 1, devices=jax.local_devices()[:1])
  shardings = nnx.to_flat_state(sharding_lib.state_shardings(abs_state, mesh))
  shardings = {p: v.get_value() for p, v in shardings}
  reader = _SafetensorsReader(path)
  flat_state = nnx.to_flat_state(abs_state)
  flat = dict(flat_state)
  expected: set[str] = set()
  try:
    for our_path, hf_names, hf_shape, kind in _param_map(cfg):
      expected.update(hf_names)
      var = flat[our_path]
      want = var.get_value()
      stacked = our_path[0] == "layers"
      one_shape = tuple(want.shape[1:]) if stacked else tuple(want.shape)
      parts = []
      for hf_name in hf_names:
        w = reader.get(hf_name)
        if tuple(w.shape) != hf_shape:
          raise ValueError(f"{path}: tensor {hf_name!r} has shape {tuple(w.shape)}, expected {hf_shape} "
                           f"(config: {cfg.family}, hidden {cfg.hidden_size}, vocab {cfg.vocab_size})")
        parts.append(_to_ours(w, kind, one_shape).astype(_NP_DTYPES[cfg.param_dtype]))
        del w
      w = np.stack(parts) if stacked else parts[0]
      del parts
      var.set_value(jax.make_array_from_callback(want.shape, shardings[our_path], lambda idx, w=w: w[idx]))
      del w
  finally:
    reader.close()
  extra = reader.names() - expected - {"lm_head.weight"}
  if extra:
    log.warning("%s: ignoring %d unexpected tensors, e.g. %s", path, len(extra), sorted(extra)[:3])
  return nnx.merge(graphdef, nnx.from_flat_state(flat_state))


# --------------------------------------------------------------------------- export
def export_hf(model: Qwen, out_dir: str | os.PathLike, *, dtype: str | None = None, tokenizer=None) -> str:
  """Writes `config.json` + safetensors (index-sharded above 4 GiB) that `transformers` loads.

  Parameters are fetched to the host one at a time. `dtype` defaults to the model's param dtype.
  """
  if nnx.state(model, nnx.LoRAParam):
    raise ValueError("export_hf: the model has LoRA adapters; fold them into the weights first (lora.merged)")
  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  cfg = model.cfg
  dtype = dtype or cfg.param_dtype
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for our_path, hf_names, hf_shape, kind in _param_map(cfg):
    w = np.asarray(jax.device_get(flat[our_path].get_value())).astype(_NP_DTYPES[dtype])
    for hf_name, part in zip(hf_names, w if our_path[0] == "layers" else [w]):
      part = _to_hf(part, kind, hf_shape)
      if size + part.nbytes > _MAX_SHARD_BYTES and shards[-1]:
        shards.append({})
        size = 0
      shards[-1][hf_name] = part
      size += part.nbytes
    del w
  if len(shards) == 1:
    safetensors.numpy.save_file(shards[0], os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      safetensors.numpy.save_file(shard, os.path.join(out_dir, fname), metadata={"format": "pt"})
      weight_map.update({name: fname for name in shard})
    total = sum(w.nbytes for s in shards for w in s.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  hf_cfg = cfg.replace(param_dtype=dtype).to_hf_config()
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(out_dir)  # tokenizer.json, tokenizer_config.json and the chat template
    # Serving stacks (transformers' generate, vLLM) take the default stop and pad tokens from here.
    eos = [t for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(tok_lib.ENDOFTEXT))
           if isinstance(t, int) and t >= 0]
    gen = {"eos_token_id": list(dict.fromkeys(eos)), "pad_token_id": tokenizer.pad_token_id,
           "bos_token_id": cfg.bos_token_id}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
      json.dump({k: v for k, v in gen.items() if v is not None}, f, indent=2)
  return out_dir


def save_random_checkpoint(cfg: ModelConfig, out_dir: str | os.PathLike, seed: int = 0,
                           max_shard_size: str | None = None) -> str:
  """Creates a random-weight HF model with `transformers` (torch CPU) and saves it to `out_dir`.

  Norm weights and biases are randomised too (HF initialises them to ones/zeros), so parity tests exercise
  every parameter. Requires torch (a test-only dependency).
  """
  import torch
  import transformers

  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  hf_cfg = cfg.to_hf_config()
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_cfg, f)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(out_dir),
                                                        dtype=torch.float32)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif name.endswith(".bias"):
        p.copy_(0.1 * torch.randn_like(p))
  kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
  model.save_pretrained(out_dir, safe_serialization=True, **kwargs)
  return out_dir
