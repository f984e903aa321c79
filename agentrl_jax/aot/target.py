"""The slice a pre-flight compiles for: its chips (from libtpu's topology descriptions), its meshes, and the
model config a run of the config would build there.

Nothing here starts a TPU runtime: `jax.experimental.topologies.get_topology_desc` describes the chips of a
slice from the TPU compiler's own tables, and programs are lowered under their abstract mesh, whose device
tells the Pallas kernels which chip they are compiled for.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re

import jax
import ml_collections
import numpy as np

from agentrl_jax import checkpoint as ckpt_lib
from agentrl_jax.models import attention_kernels, loading, memory_plan
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig

log = logging.getLogger(__name__)
_TOPOLOGY = re.compile(r"(v4|v5e|v5p|v6e):(\d+(x\d+)+)")


@dataclasses.dataclass(frozen=True)
class Target:
  """A TPU slice described by libtpu.

  Attributes:
    topology: the topology name, e.g. "v5p:2x2x2".
    generation: "v4", "v5e", "v5p" or "v6e".
    devices: the slice's JAX devices (one per chip, or per TensorCore on v4).
    chip: the generation's data-sheet figures per chip.
  """

  topology: str
  generation: str
  devices: tuple
  chip: memory_plan.Chip

  @property
  def device_kind(self) -> str:
    return self.devices[0].device_kind

  @property
  def devices_per_chip(self) -> int:
    """JAX devices per chip, as libtpu describes the slice: devices sharing a chip's coordinates (2 on v4, whose
    topology lists one device per TensorCore; 1 on v5p, whose two cores form one device, and on v5e / v6e)."""
    chips = {tuple(getattr(d, "coords", ())) for d in self.devices}
    if len(chips) <= 1 and len(self.devices) > 1:  # no coordinates to tell chips apart: the generation's rule
      return 2 if self.generation == "v4" else 1
    return len(self.devices) // len(chips)

  @property
  def hbm_per_device(self) -> int:
    return self.chip.hbm // self.devices_per_chip

  @property
  def flops_per_device(self) -> float:
    return self.chip.bf16_flops / self.devices_per_chip

  @property
  def bytes_s_per_device(self) -> float:
    return self.chip.hbm_bytes_s / self.devices_per_chip


def target(topology: str) -> Target:
  """The chips of `topology` (e.g. "v5e:2x4", "v5p:2x2x2", "v6e:4x4").

  Raises:
    ValueError: an unknown topology name, or libtpu is missing (it says how to install it).
  """
  m = _TOPOLOGY.fullmatch(topology)
  if not m:
    raise ValueError(f"aot: unknown topology {topology!r}; expected <generation>:<shape>, e.g. v5e:2x4, v5p:2x2x2, "
                     "v6e:4x4 (generations: v4, v5e, v5p, v6e)")
  try:
    import libtpu  # noqa: F401  # pylint: disable=unused-import,import-outside-toplevel
  except ImportError as e:
    raise ValueError("aot: the TPU compiler (libtpu) is not installed: pip install 'jax[tpu]==" + jax.__version__ +
                     "' (launch/setup.sh installs it with the test requirements)") from e
  from jax.experimental import topologies

  # Two processes may hold libtpu at once (a test worker, a job): the compiler needs no exclusive TPU access.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  desc = topologies.get_topology_desc(topology_name=topology, platform="tpu")
  generation = m.group(1)
  return Target(topology=topology, generation=generation, devices=tuple(desc.devices),
                chip=memory_plan.CHIP_SPECS[generation])


def mesh(block: ml_collections.ConfigDict, t: Target) -> jax.sharding.Mesh:
  """A config's `mesh` block laid over the slice's devices (`num_devices: 0` = all of them)."""
  sizes = dict(block)
  n = sizes.pop("num_devices", 0) or len(t.devices)
  if n > len(t.devices):
    raise ValueError(f"aot: config.mesh.num_devices={n} but {t.topology} has {len(t.devices)} devices")
  return sharding_lib.make_mesh(**sizes, devices=list(t.devices[:n]))


def sampler_mesh(block, train_mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  return sharding_lib.sampler_mesh_from_config(block, train_mesh)


_REAL_SIZES = ("qwen3_0p6b", "qwen3_1p7b", "qwen3_4b", "qwen3_8b", "qwen2p5_7b")


def tokenizer_and_config(block: ml_collections.ConfigDict, t: Target) -> tuple[object, ModelConfig, str]:
  """The tokenizer and `ModelConfig` a run of the `model` block would build on the slice, and where they came
  from. As `checkpoint.tokenizer_and_config`, with "auto" resolved for the target chip (bfloat16 compute;
  the attention kernels that compile for it). A real size with no checkpoint, HF directory or tokenizer on this
  host (the usual pre-flight: the weights live elsewhere) takes the published config and the real Qwen
  tokenizer (`models.qwen_tokenizer`, no download)."""
  from agentrl_jax.models import qwen_tokenizer, tokenizer as tok_lib
  from agentrl_jax.tasks import tokenizer as embedded_tokenizer

  overrides = loading.config_overrides(block, backend="tpu")
  tok_path = block.get("tokenizer_path") or block.get("hf_path")
  if block.get("checkpoint") or (block.get("hf_path") and os.path.isdir(block.hf_path)):
    tokenizer, cfg = ckpt_lib.tokenizer_and_config(embedded_tokenizer.fill_model_block(block), overrides=overrides)
    source = f"checkpoint {block.checkpoint}" if block.get("checkpoint") else f"HF directory {block.hf_path}"
  elif block.get("size") in _REAL_SIZES:
    family = "qwen2.5" if block.size.startswith("qwen2") else "qwen3"
    tokenizer = tok_lib.load_tokenizer(tok_path) if tok_path and os.path.isdir(tok_path) else qwen_tokenizer.load(family)
    cfg = ModelConfig.by_name(block.size, **overrides)
    source = f"size {block.size} (published config; weights not read)"
  else:
    tokenizer, cfg = ckpt_lib.tokenizer_and_config(embedded_tokenizer.fill_model_block(block), overrides=overrides)
    source = f"size {block.get('size')} (random init)"
  if block.get("attention_impl") == "auto":
    cfg = cfg.replace(attention_impl=attention_kernels.auto_impl("tpu", device=t.devices[0], head_dim=cfg.head_dim))
  return tokenizer, cfg, source


def abstract_mesh_of(m: jax.sharding.Mesh):
  """The mesh's abstract form, whose device names the chip (the Pallas kernels read it while lowering)."""
  return m.abstract_mesh


def device_array(t: Target) -> np.ndarray:
  return np.asarray(t.devices)
