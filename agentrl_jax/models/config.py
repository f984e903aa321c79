"""Model configuration: one frozen dataclass for the Qwen2/2.5 and Qwen3 decoder families.

Real sizes come from the published `config.json` files; `from_hf_config` reads any such file (or dict)
and `to_hf_config` writes one that `transformers` loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Storage dtypes of the rollout's KV cache besides the compute dtype: 8-bit floats halve a bf16 cache.
_KV_DTYPES = {**_DTYPES, "float8_e4m3fn": jnp.float8_e4m3fn}
# Attention kernels (models/attention_kernels.py): of training, scoring and prefill; "ragged_paged" adds decode
# and extend over a paged KV cache.
ATTENTION_IMPLS = ("xla", "splash", "cudnn", "ragged_paged")
CONTEXT_STRATEGIES = ("all_gather", "ulysses")  # models/context_parallel.py


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of a Qwen-family decoder.

  Attributes:
    family: "qwen3" (q/k RMSNorm, no qkv bias) or "qwen2" (qkv bias; also Qwen2.5).
    vocab_size: V.
    hidden_size: D.
    intermediate_size: F, the SwiGLU width.
    num_layers: L.
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads (GQA: N % K == 0).
    head_dim: H.
    rope_theta: RoPE base.
    rms_norm_eps: epsilon of every RMSNorm.
    tie_embeddings: unembedding shares the embedding matrix.
    qkv_bias: q/k/v projections carry a bias (Qwen2).
    qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
    max_position_embeddings: informational; the KV cache size is chosen by the caller.
    param_dtype: storage dtype of the weights ("float32" or "bfloat16").
    dtype: compute dtype of activations and matmuls; logits are always float32.
    remat: rematerialise each decoder layer in the backward pass (saves activation memory).
    scan_layers: run the decoder stack as one `lax.scan` over the stacked layer parameters (compile time and
      code size independent of depth), else unrolled (L copies of the layer's code). The parameters and the KV
      cache are stacked by layer either way. A compute setting, not part of HF configs.
    attention_block: query block of causal self-attention without a cache (training, scoring): each block
      skips the keys above the diagonal; 0 = one dense [T, T] block. A compute setting, not part of HF configs.
    attention_impl: kernel of that attention: "xla" (the blocked attention above, any backend), "splash" (TPU
      splash attention), "cudnn" (cuDNN flash attention on GPU) or "ragged_paged" (TPU: splash without a cache,
      and every pass over the KV cache, decode, extend and prefill, through the ragged paged attention kernel
      over a `PagedKVCache`); see `models/attention_kernels.py`. Otherwise passes over the cache use the XLA
      path. A compute setting, not part of HF configs.
    attention_interpret: run the Pallas kernels in interpret mode (CPU tests): splash in Pallas's interpreter;
      for "ragged_paged", the XLA statement of that kernel's contract (`paged_attention_reference`), as the
      interpreter cannot run the kernel itself.
    kv_page_size: tokens per page of the `PagedKVCache` ("ragged_paged" only).
    context_strategy: how attention reaches the keys of a row whose tokens are split over the mesh's `context`
      axis (`models/context_parallel.py`): "all_gather" (each device gathers the keys and values) or "ulysses"
      (all-to-all to a split of the kv heads). A compute setting, not part of HF configs.
    kv_cache_dtype: storage dtype of the rollout's KV cache ("" = `dtype`; "float8_e4m3fn" halves a bf16 cache:
      keys and values are rounded to 3 mantissa bits when written and read back in the compute dtype, at scale
      1, as vLLM's fp8 cache does without calibration). A compute setting, not part of HF configs.
    context_load_balance: with the context axis, device i holds chunks i and 2N - 1 - i of a row's 2N (equal
      causal attention work on every device), else chunk i of N. A compute setting, not part of HF configs.
    bos_token_id, eos_token_id: carried through for HF export.
  """

  family: str = "qwen3"
  vocab_size: int = 151936
  hidden_size: int = 2560
  intermediate_size: int = 9728
  num_layers: int = 36
  num_heads: int = 32
  num_kv_heads: int = 8
  head_dim: int = 128
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = True
  qkv_bias: bool = False
  qk_norm: bool = True
  max_position_embeddings: int = 40960
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: bool = False
  scan_layers: bool = True
  attention_block: int = 256
  attention_impl: str = "xla"
  attention_interpret: bool = False
  kv_page_size: int = 64
  context_strategy: str = "all_gather"
  context_load_balance: bool = True
  kv_cache_dtype: str = ""
  bos_token_id: int | None = 151643
  eos_token_id: int | None = 151645

  def __post_init__(self):
    if self.family not in _ARCHITECTURES:
      raise ValueError(f"ModelConfig.family: unknown family {self.family!r}; expected one of {sorted(_ARCHITECTURES)}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "max_position_embeddings"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"ModelConfig.{name}: must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"ModelConfig.num_kv_heads: num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim: RoPE needs an even head_dim, got {self.head_dim}")
    if not isinstance(self.attention_block, int) or self.attention_block < 0:
      raise ValueError(f"ModelConfig.attention_block: must be an int >= 0, got {self.attention_block!r}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"ModelConfig.attention_impl: expected one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")
    if not isinstance(self.kv_page_size, int) or self.kv_page_size < 1:
      raise ValueError(f"ModelConfig.kv_page_size: must be a positive int, got {self.kv_page_size!r}")
    if self.context_strategy not in CONTEXT_STRATEGIES:
      raise ValueError(f"ModelConfig.context_strategy: expected one of {CONTEXT_STRATEGIES}, got "
                       f"{self.context_strategy!r}")
    if self.kv_cache_dtype and self.kv_cache_dtype not in _KV_DTYPES:
      raise ValueError(f"ModelConfig.kv_cache_dtype: expected '' or one of {sorted(_KV_DTYPES)}, got "
                       f"{self.kv_cache_dtype!r}")
    if not isinstance(self.context_load_balance, bool):
      raise ValueError(f"ModelConfig.context_load_balance: must be a bool, got {self.context_load_balance!r}")
    if self.rope_theta <= 0:
      raise ValueError(f"ModelConfig.rope_theta: must be > 0, got {self.rope_theta}")
    if not 0 < self.rms_norm_eps < 1:
      raise ValueError(f"ModelConfig.rms_norm_eps: must lie in (0, 1), got {self.rms_norm_eps}")
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name}: expected one of {sorted(_DTYPES)}, got {getattr(self, name)!r}")

  # ---------------------------------------------------------------- derived
  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def jnp_kv_dtype(self):
    """The KV cache's storage dtype (`kv_cache_dtype`, default the compute dtype)."""
    return _KV_DTYPES[self.kv_cache_dtype or self.dtype]

  @property
  def num_groups(self) -> int:
    """G = N // K query heads per key/value head."""
    return self.num_heads // self.num_kv_heads

  def replace(self, **kwargs) -> ModelConfig:
    return dataclasses.replace(self, **kwargs)

  def param_count(self) -> int:
    """Exact number of parameters (matches the model's state)."""
    d, f, n, k, h, v = (self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads,
                        self.head_dim, self.vocab_size)
    attn = d * n * h + 2 * d * k * h + n * h * d
    if self.qkv_bias:
      attn += n * h + 2 * k * h
    if self.qk_norm:
      attn += 2 * h
    layer = attn + 3 * d * f + 2 * d
    return v * d * (1 if self.tie_embeddings else 2) + self.num_layers * layer + d

  # ---------------------------------------------------------------- real sizes
  @classmethod
  def qwen3_0p6b(cls, **kw) -> ModelConfig:
    return cls(**{**dict(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16, num_kv_heads=8), **kw})

  @classmethod
  def qwen3_1p7b(cls, **kw) -> ModelConfig:
    return cls(**{**dict(hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16, num_kv_heads=8), **kw})

  @classmethod
  def qwen3_4b(cls, **kw) -> ModelConfig:
    return cls(**{**dict(hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32, num_kv_heads=8), **kw})

  @classmethod
  def qwen3_8b(cls, **kw) -> ModelConfig:
    return cls(**{**dict(hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32, num_kv_heads=8,
                         tie_embeddings=False, eos_token_id=151645), **kw})

  @classmethod
  def qwen2p5_7b(cls, **kw) -> ModelConfig:
    return cls(**{**dict(family="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                         num_heads=28, num_kv_heads=4, head_dim=128, tie_embeddings=False, qkv_bias=True,
                         qk_norm=False, max_position_embeddings=131072, bos_token_id=151643,
                         eos_token_id=151643), **kw})

  # ---------------------------------------------------------------- tiny sizes (tests, CPU demo)
  @classmethod
  def tiny_qwen3(cls, **kw) -> ModelConfig:
    """~0.1M-parameter Qwen3 for unit tests."""
    return cls(**{**dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, rope_theta=10_000.0, max_position_embeddings=2048,
                         bos_token_id=None, eos_token_id=None), **kw})

  @classmethod
  def tiny_qwen2(cls, **kw) -> ModelConfig:
    """~0.1M-parameter Qwen2 (qkv bias, untied) for unit tests."""
    return cls.tiny_qwen3(**{**dict(family="qwen2", qkv_bias=True, qk_norm=False, tie_embeddings=False), **kw})

  @classmethod
  def demo_1m(cls, **kw) -> ModelConfig:
    """~0.48M-parameter Qwen3 (hidden 128, 2 layers) of the embedded CPU demo (`configs/default.py`)."""
    return cls(**{**dict(vocab_size=768, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=32, rope_theta=10_000.0, max_position_embeddings=2048,
                         bos_token_id=None, eos_token_id=None), **kw})

  @classmethod
  def bench_5m(cls, **kw) -> ModelConfig:
    """~5M-parameter Qwen3 (hidden 256, 4 layers, vocab 4096, untied embeddings) used by the benchmarks."""
    return cls(**{**dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4,
                         num_kv_heads=2, head_dim=64, tie_embeddings=False, max_position_embeddings=4096,
                         bos_token_id=None, eos_token_id=None), **kw})

  @classmethod
  def bench_58m(cls, **kw) -> ModelConfig:
    """~58M-parameter Qwen3 (hidden 512, 8 layers, vocab 32000, untied embeddings) used by the benchmarks."""
    return cls(**{**dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                         num_kv_heads=4, head_dim=64, tie_embeddings=False, max_position_embeddings=4096,
                         bos_token_id=None, eos_token_id=None), **kw})

  @classmethod
  def by_name(cls, name: str, **kw) -> ModelConfig:
    """Looks a size up by its classmethod name, e.g. "qwen3_4b" or "tiny_qwen3"."""
    if name not in SIZES:
      raise ValueError(f"ModelConfig: unknown size {name!r}; known: {', '.join(SIZES)}")
    return getattr(cls, name)(**kw)

  # ---------------------------------------------------------------- HF interop
  @classmethod
  def from_hf_config(cls, config: dict[str, Any] | str | os.PathLike, **overrides) -> ModelConfig:
    """Builds a config from a HF `config.json` (a dict, the file, or its directory).

    Raises:
      ValueError: unknown architecture/model_type, unsupported RoPE scaling, or a missing field (named).
    """
    if not isinstance(config, dict):
      path = os.fspath(config)
      if os.path.isdir(path):
        path = os.path.join(path, "config.json")
      try:
        with open(path) as f:
          config = json.load(f)
      except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read HF config {path}: {e}") from e
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    if model_type in ("qwen3",) or "Qwen3ForCausalLM" in archs:
      family = "qwen3"
    elif model_type in ("qwen2",) or "Qwen2ForCausalLM" in archs:
      family = "qwen2"
    else:
      raise ValueError(f"config.json: unknown architecture (model_type={model_type!r}, architectures={archs!r}); "
                       "supported: Qwen3ForCausalLM, Qwen2ForCausalLM")

    def need(key):
      if key not in config:
        raise ValueError(f"config.json: missing field {key!r}")
      return config[key]

    rope = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
      raise ValueError(f"config.json: rope_scaling type {rope_type!r} is not supported (only default RoPE)")
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    if family == "qwen3" and config.get("attention_bias"):
      raise ValueError("config.json: attention_bias=true is not supported for Qwen3 (no published Qwen3 uses it)")
    if config.get("use_sliding_window"):
      raise ValueError("config.json: use_sliding_window=true is not supported")
    n = need("num_attention_heads")
    d = need("hidden_size")
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    kw = dict(
        family=family,
        vocab_size=need("vocab_size"),
        hidden_size=d,
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=n,
        num_kv_heads=config.get("num_key_value_heads") or n,
        head_dim=config.get("head_dim") or d // n,
        rope_theta=float(theta),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(config.get("tie_word_embeddings", family == "qwen3")),
        qkv_bias=family == "qwen2",
        qk_norm=family == "qwen3",
        max_position_embeddings=config.get("max_position_embeddings", 32768),
        param_dtype=dtype if dtype in _DTYPES else "float32",
        dtype=dtype if dtype in _DTYPES else "float32",
        bos_token_id=config.get("bos_token_id"),
        eos_token_id=config.get("eos_token_id") if not isinstance(config.get("eos_token_id"), list)
        else config["eos_token_id"][0],
    )
    kw.update(overrides)
    return cls(**kw)

  def to_hf_config(self) -> dict[str, Any]:
    """A `config.json` dict that `transformers` loads into the equivalent model."""
    cfg = {
        "architectures": [_ARCHITECTURES[self.family]],
        "model_type": self.family,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": self.max_position_embeddings,
        "rms_norm_eps": self.rms_norm_eps,
        "rope_theta": self.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": self.tie_embeddings,
        "attention_dropout": 0.0,
        "use_cache": True,
        "use_sliding_window": False,
        "torch_dtype": self.param_dtype,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": self.eos_token_id,
    }
    if self.family == "qwen3":
      cfg["attention_bias"] = False
    return cfg


SIZES = ("qwen3_0p6b", "qwen3_1p7b", "qwen3_4b", "qwen3_8b", "qwen2p5_7b", "tiny_qwen3", "tiny_qwen2", "demo_1m", "bench_5m",
         "bench_58m")
