"""Building the policy from a config's `model` block, shared by every job (SFT, RL, eval, collection).

The block's fields (all jobs use the same ones):

    size            a `ModelConfig` size name (`tiny_qwen3`, `qwen3_4b`, ...) for random init (tests, benchmarks)
    hf_path         a local HF checkpoint directory (config.json + safetensors); wins over `size`
    checkpoint      an Orbax checkpoint directory of one of our runs (`<workdir>/checkpoints`); wins over both
                    (read by `agentrl_jax.checkpoint.load_policy` / `tokenizer_and_config`, which call this module
                    for everything else: the models package does not read our checkpoints)
    checkpoint_step which step of `checkpoint` (0 = the latest)
    tokenizer_path  tokenizer directory; default `hf_path` (the jobs fill in the embedded task's tokenizer when
                    both are empty: `agentrl_jax.tasks.tokenizer.fill_model_block`)
    attention_impl  the attention kernel ("" = the ModelConfig's "xla"; "auto": on a TPU the kernels that compile
                    for its chip, ragged paged else splash (`attention_kernels.auto_impl`); xla elsewhere)
    kv_cache_dtype  the rollout's KV cache storage ("" = the compute dtype; "float8_e4m3fn" halves it)
    context_strategy
                    how attention meets a row split over the mesh's `context` axis ("" = "all_gather";
                    "ulysses"; `models/context_parallel.py`)
    param_dtype, dtype, remat, scan_layers
                    overrides of the ModelConfig fields ("" = keep); `dtype="auto"` is the compute dtype of the
                    backend: bfloat16 on TPU and GPU, float32 on CPU (master weights, optimizer state, logits,
                    log-probs, loss and entropy stay float32 either way)
"""

from __future__ import annotations

import logging

from flax import nnx
import jax
import ml_collections

from agentrl_jax.models import attention_kernels, hf_io
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.qwen import Qwen

log = logging.getLogger(__name__)
_OVERRIDES = ("param_dtype", "dtype", "remat", "attention_impl", "scan_layers", "context_strategy", "kv_cache_dtype")


def compute_dtype(dtype: str, backend: str | None = None) -> str:
  """A model block's `dtype`: "auto" -> bfloat16 on accelerators, float32 on CPU (where bf16 matmuls are
  emulated and slower); anything else as given. `backend`: the platform compiled for (default this process's)."""
  if dtype != "auto":
    return dtype
  return "float32" if (backend or jax.default_backend()) == "cpu" else "bfloat16"


def config_overrides(m: ml_collections.ConfigDict, backend: str | None = None) -> dict:
  """The `ModelConfig` fields the block overrides, with `dtype="auto"` resolved for `backend`; an
  `attention_impl="auto"` is left out (it is chosen once the config is known: `attention_kernels.auto_impl`)."""
  overrides = {k: m[k] for k in _OVERRIDES if m.get(k) not in (None, "")}
  if "dtype" in overrides:
    overrides["dtype"] = compute_dtype(overrides["dtype"], backend)
  if overrides.get("attention_impl") == "auto":
    del overrides["attention_impl"]
  return overrides


def tokenizer_and_config(m: ml_collections.ConfigDict, overrides: dict | None = None, *,
                         stored: ModelConfig | None = None):
  """The tokenizer and the `ModelConfig` the block describes (nothing is allocated); `overrides` default to
  `config_overrides(m)` on this process's backend. `stored`: the config a checkpoint of ours recorded, for a
  block that names one (`agentrl_jax.checkpoint.tokenizer_and_config` passes it)."""
  overrides = config_overrides(m) if overrides is None else overrides
  tok_path = m.get("tokenizer_path") or m.get("hf_path")
  if not tok_path:
    raise ValueError("model.tokenizer_path and model.hf_path are both empty: no tokenizer to load (the jobs "
                     "default to the embedded task's tokenizer: agentrl_jax.tasks.tokenizer.fill_model_block)")
  tokenizer = tok_lib.load_tokenizer(tok_path)
  if stored is not None:
    cfg = stored.replace(**overrides)
  elif m.get("checkpoint"):
    raise ValueError(f"model.checkpoint={m.checkpoint!r}: a checkpoint of ours is read by "
                     "agentrl_jax.checkpoint.tokenizer_and_config / load_policy")
  elif m.get("hf_path"):
    cfg = ModelConfig.from_hf_config(m.hf_path, **overrides)
  else:
    cfg = ModelConfig.by_name(m.size, vocab_size=len(tokenizer), **overrides)
  if m.get("attention_impl") == "auto":
    cfg = cfg.replace(attention_impl=attention_kernels.auto_impl(head_dim=cfg.head_dim))
  return tokenizer, cfg


def init_model(cfg: ModelConfig, key: jax.Array, mesh: jax.sharding.Mesh) -> Qwen:
  """A randomly initialised model, created by one compiled function straight into its shardings (an eager
  init runs every op separately and would build a large model in one device's memory first)."""
  graphdef, init = init_params_fn(cfg, mesh)
  return nnx.merge(graphdef, init(key))


def init_params_fn(cfg: ModelConfig, mesh: jax.sharding.Mesh):
  """(graphdef, jitted `key -> params state` in their shardings): `init_model`'s program (the pre-flight
  compiles it too)."""
  graphdef, abstract = nnx.split(hf_io.abstract_model(cfg))
  shardings = sharding_lib.state_shardings(abstract, mesh)
  return graphdef, jax.jit(lambda k: nnx.state(Qwen(cfg, rngs=nnx.Rngs(params=k))), out_shardings=shardings)


def load_policy(m: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, key: jax.Array):
  """(tokenizer, model) for a `model` config block naming an HF directory or a size (random init), with params
  placed in their shardings on `mesh`; a block naming a checkpoint of ours goes through
  `agentrl_jax.checkpoint.load_policy`."""
  tokenizer, cfg = tokenizer_and_config(m)
  if m.get("hf_path"):
    model = hf_io.load_hf_checkpoint(m.hf_path, cfg, mesh=mesh)
    source = f"HF directory {m.hf_path}"
  else:
    model = init_model(cfg, key, mesh)
    source = f"random init ({m.size})"
  return checked(tokenizer, model, source)


def checked(tokenizer, model: Qwen, source: str):
  """(tokenizer, model) once the tokenizer is known to fit the model's vocabulary; logs where the params came
  from."""
  cfg = model.cfg
  if len(tokenizer) > cfg.vocab_size:
    raise ValueError(f"model.tokenizer_path: tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
                     f"{cfg.vocab_size}")
  log.info("policy: %s %s, %s params, from %s", cfg.family, cfg.param_dtype, f"{cfg.param_count():,}", source)
  return tokenizer, model


def model_block(**kw) -> ml_collections.ConfigDict:
  """A `model` config block with every field present (configs override what they need)."""
  block = dict(size="tiny_qwen3", hf_path="", checkpoint="", checkpoint_step=0, tokenizer_path="", param_dtype="",
               dtype="", remat=False, attention_impl="", scan_layers=True, context_strategy="", kv_cache_dtype="")
  unknown = set(kw) - set(block)
  if unknown:
    raise ValueError(f"model_block: unknown fields {sorted(unknown)}")
  block.update(kw)
  return ml_collections.ConfigDict(block)
