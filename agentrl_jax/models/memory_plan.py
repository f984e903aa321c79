"""Per-device memory plan of a policy on a TPU slice, from the project's own sharding rules.

    python -m agentrl_jax.models.memory_plan --model qwen3_4b --slice v5p-16 --seq 23040 --rows 256

prints, per device of a `(data, fsdp, context, tensor)` mesh over the slice's chips: the parameters, the AdamW
moments, the gradients and their accumulator, the rollout KV cache for `rows` sequences of `seq` tokens, and the
activations of one training micro-batch with and without rematerialisation, against the chip's HBM. Shapes and shardings are
exact (every parameter's partition spec comes from `sharding.LOGICAL_RULES`, applied to an abstract mesh of the
slice's size: no devices are needed) and checked against real sharded arrays in tests/models/test_memory_plan.py.
Activations are the residuals JAX's autodiff saves for the backward pass with a fused attention kernel (splash /
cuDNN: no score matrix), counted per layer and checked against `saved_residuals` on CPU with the splash kernel in
interpret mode; XLA's fusion can only drop some of them (see `activation_bytes`). `python -m
agentrl_jax.aot.memory_check` holds these numbers against the TPU compiler's own plan of the same programs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re

import jax
import numpy as np

from agentrl_jax.models import kv_cache
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """A TPU generation's per-chip figures (vendor data sheets), for plans and roofline estimates.

  Attributes:
    hbm: HBM bytes per chip.
    cores: TensorCores per chip (a "v4-32" or "v5p-16" slice is named by cores, "v6e-16" by chips).
    bf16_flops: dense bf16 peak FLOP/s per chip.
    hbm_bytes_s: HBM bandwidth per chip, bytes/s.
    device_kind: how JAX names the chip (`device.device_kind`).
  """

  hbm: int
  cores: int
  bf16_flops: float
  hbm_bytes_s: float
  device_kind: str


CHIP_SPECS = {"v4": Chip(32 * GIB, 2, 275e12, 1.2e12, "TPU v4"), "v5p": Chip(95 * GIB, 2, 459e12, 2.765e12, "TPU v5"),
              "v5e": Chip(16 * GIB, 1, 197e12, 0.819e12, "TPU v5 lite"),
              "v6e": Chip(32 * GIB, 1, 918e12, 1.64e12, "TPU v6 lite")}
CHIP_SPECS["v5litepod"] = CHIP_SPECS["v5e"]
# TPU generation -> (HBM bytes per chip, TensorCores per chip).
CHIPS = {name: (c.hbm, c.cores) for name, c in CHIP_SPECS.items()}


def parse_slice(name: str) -> tuple[int, int]:
  """(chips, HBM bytes per chip) of an accelerator type such as 'v5p-16', 'v5litepod-16' or 'v6e-8'."""
  m = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", name)
  if not m:
    raise ValueError(f"memory_plan: unknown slice {name!r}; expected e.g. v4-32, v5p-16, v5e-16, v6e-8")
  hbm, cores = CHIPS[m.group(1)]
  n = int(m.group(2))
  if n % cores:
    raise ValueError(f"memory_plan: {name}: {m.group(1)} slices are named by TensorCores ({cores} per chip)")
  return n // cores, hbm


def _itemsize(dtype: str) -> int:
  return np.dtype(jax.numpy.dtype(dtype)).itemsize


def _per_device(shape, spec, mesh_shape: dict[str, int]) -> int:
  """Elements one device holds of an array of `shape` laid out by `spec`."""
  n = 1
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    n *= -(-dim // math.prod(mesh_shape.get(a, 1) for a in axes))
  return n


@dataclasses.dataclass(frozen=True)
class Plan:
  """Bytes per device of each part (see module docstring) and the chip's HBM."""

  params: int
  optimizer: int
  gradients: int
  kv_cache: int
  activations: int
  activations_remat: int
  hbm: int
  mesh: dict
  rollout_rows_fit: int = 0
  decode_working: int = 0

  def rows(self) -> list[tuple[str, int]]:
    return [("params", self.params), ("AdamW moments", self.optimizer), ("gradients (+ accumulator)", self.gradients),
            ("KV cache (rollout)", self.kv_cache), ("activations (no remat)", self.activations),
            ("activations (remat)", self.activations_remat), ("decode working set", self.decode_working)]

  @property
  def train_total(self) -> int:
    """The update step's peak with remat: params + moments + gradients + activations."""
    return self.params + self.optimizer + self.gradients + self.activations_remat

  @property
  def rollout_total(self) -> int:
    """The rollout's peak: the trainer's params and AdamW moments stay resident next to the KV cache, and a
    decode step works on compute-dtype weights (`decode_bytes`)."""
    return self.params + self.optimizer + self.kv_cache + self.decode_working


# Share of HBM a plan may fill: the rest is left to XLA's temporaries, fragmentation and the runtime.
USABLE_HBM = 0.9


def rows_that_fit(cfg: ModelConfig, seq: int, hbm: int, mesh_shape: dict[str, int], resident: int) -> int:
  """Most rollout rows of `seq` tokens whose KV cache fits next to `resident` bytes (params and AdamW moments)
  in `USABLE_HBM` of a chip (a multiple of the cache's row axes, data x fsdp x context, so every device holds
  the same rows)."""
  unit = mesh_shape["data"] * mesh_shape["fsdp"] * mesh_shape.get("context", 1)
  per_unit = kv_cache_bytes(cfg, unit, seq, mesh_shape)
  free = int(hbm * USABLE_HBM) - resident
  return max(free // per_unit, 0) * unit


def param_bytes(cfg: ModelConfig, mesh_shape: dict[str, int], lora=None, *, adapters_only: bool = False) -> int:
  """Exact parameter bytes per device under the project's sharding rules; `lora` (a `lora.LoraConfig`): with
  its adapters, or (`adapters_only`) the adapters alone."""
  from flax import nnx

  from agentrl_jax.models import hf_io
  from agentrl_jax.models import lora as lora_lib

  mesh = _abstract_mesh(mesh_shape)
  model = hf_io.abstract_model(cfg)
  if lora is not None and lora.enabled:
    lora_lib.apply(model, lora, jax.random.key(0))
  state = nnx.state(model, nnx.LoRAParam if adapters_only else nnx.Param)
  total = 0
  for v in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable)):
    value = v.get_value()
    axes = v.get_metadata().get("logical_axes")
    spec = jax.sharding.PartitionSpec() if axes is None else sharding_lib.logical_to_spec(axes, value.shape, mesh)
    total += _per_device(value.shape, spec, mesh_shape) * np.dtype(value.dtype).itemsize
  return total


def kv_cache_bytes(cfg: ModelConfig, rows: int, seq: int, mesh_shape: dict[str, int]) -> int:
  """The rollout cache for `rows` sequences of `seq` tokens, sharded as `kv_cache.KVCache` lays it out."""
  mesh = _abstract_mesh(mesh_shape)
  total = 0
  nl, k, h = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
  for shape, axes in (((rows, nl, k, h, seq), kv_cache.K_AXES), ((rows, nl, k, seq, h), kv_cache.V_AXES)):
    spec = sharding_lib.logical_to_spec(axes, shape, mesh)
    total += _per_device(shape, spec, mesh_shape) * _itemsize(cfg.kv_cache_dtype or cfg.dtype)
  return total


def _abstract_mesh(mesh_shape: dict[str, int]) -> jax.sharding.AbstractMesh:
  shape = {"context": 1, **mesh_shape}
  return jax.sharding.AbstractMesh(tuple(shape[a] for a in sharding_lib.MESH_AXES), sharding_lib.MESH_AXES)


def context_bytes(cfg: ModelConfig, row_tokens: int, tensor: int, context: int) -> int:
  """What context parallelism adds to a layer's working set (`models/context_parallel.py`): a row's keys and
  values gathered whole (all-gather) or whole rows of a share of the heads (Ulysses: about the same bytes), and
  their gradients before the reduce-scatter; 0 without the context axis."""
  if context <= 1:
    return 0
  return 4 * row_tokens * -(-cfg.num_kv_heads // tensor) * cfg.head_dim * _itemsize(cfg.dtype)


def activation_bytes(cfg: ModelConfig, tokens: int, tensor: int, *, remat: bool, logits_chunk: int = 1024) -> int:
  """What one micro-batch of `tokens` tokens (per device) keeps for the backward pass, with a fused attention
  kernel (splash / cuDNN: no score matrix).

  The count is the residuals JAX's autodiff saves (checked element for element against `saved_residuals` of the
  update's forward with the splash kernel, in float32, in tests/models/test_memory_plan.py), per token and layer:
  6 hidden-width and 2 MLP-width arrays (norm inputs and outputs, projections, the SwiGLU's gate and up
  projections: `qwen.swiglu` saves no more), 5 query-width and 4 kv-width arrays (q, k, v around RoPE and the
  kernel's operands) and the per-head / per-token statistics of the norms and the kernel; plus the final norm's
  3 hidden-width arrays, the RoPE tables and the fused LM head's 3 per-token statistics. XLA's fusion can
  only drop some of these, so this is an upper bound of the saved activations. With remat only each layer's
  input survives, plus one layer's residuals while it is recomputed. The loss adds the float32 logits of one
  `logits_chunk`-token chunk and their gradient (transient). Counted at the compute dtype's size; a bf16 run
  also keeps its norms' float32 inputs (at most 2 hidden-width arrays per layer more).

  The backward pass of a layer adds its working set (`backward_working_bytes`), which the residuals do not
  show but the TPU compiler's plan of the update does.
  """
  logits = 2 * min(tokens, logits_chunk) * -(-cfg.vocab_size // tensor) * 4
  recomputed = _layer_residuals(cfg, tokens, tensor) if remat else 0
  return (residual_bytes(cfg, tokens, remat=remat, tensor=tensor) + recomputed + logits
          + backward_working_bytes(cfg, tokens, tensor))


def backward_working_bytes(cfg: ModelConfig, tokens: int, tensor: int) -> int:
  """What one layer's backward pass holds beside the saved residuals: 6 MLP-width float32 arrays per token
  (the SwiGLU's gate, up and product and their cotangents, which autodiff's backward keeps in float32 on a TPU).
  Measured, not derived: the TPU compiler's plans of the RL update (`python -m agentrl_jax.aot.memory_check`)
  exceed the residual count by 11.7 (Qwen3-4B) and 12.4 (Qwen2.5-7B) MLP-width bf16 arrays per token, on v5e,
  v5p and v6e slices alike."""
  return 6 * 4 * tokens * -(-cfg.intermediate_size // tensor)


def decode_bytes(cfg: ModelConfig, param_bytes_per_device: int) -> int:
  """A decode step's working set beside the cache: the weights cast to the compute dtype (sharded as the
  master copy) and the LM head gathered whole for the logits (the TPU compiler's plans of the decode step
  agree within 0.1 GiB on v5e, v5p and v6e slices for Qwen3-4B and Qwen2.5-7B)."""
  b = _itemsize(cfg.dtype)
  return param_bytes_per_device // _itemsize(cfg.param_dtype) * b + cfg.vocab_size * cfg.hidden_size * b





def _layer_residuals(cfg: ModelConfig, tokens: int, tensor: int) -> int:
  """Bytes one decoder layer saves for its backward pass without remat (see `activation_bytes`)."""
  b = _itemsize(cfg.dtype)
  d, f = cfg.hidden_size, -(-cfg.intermediate_size // tensor)
  n, k = -(-cfg.num_heads // tensor), -(-cfg.num_kv_heads // tensor)
  qo, kv = n * cfg.head_dim, k * cfg.head_dim
  return tokens * b * (6 * d + 2 * f + 5 * qo + 4 * kv) + tokens * 4 * (3 * n + 2 * k + 4)


def residual_bytes(cfg: ModelConfig, tokens: int, *, remat: bool, tensor: int = 1) -> int:
  """`activation_bytes` without its transient parts (the loss chunk's logits; with remat, the recomputed
  layer): what stays saved between the forward and the backward pass, as `saved_residuals` reports it."""
  b = _itemsize(cfg.dtype)
  per_layer = tokens * cfg.hidden_size * b if remat else _layer_residuals(cfg, tokens, tensor)
  final = tokens * b * 3 * cfg.hidden_size + tokens * 4 * 2 + tokens * b * 2 * cfg.head_dim  # final norm; RoPE
  final += tokens * 4 * 3  # the fused LM head's max, log-sum-exp and mean logit (float32)
  return cfg.num_layers * per_layer + final


def plan(cfg: ModelConfig, *, chips: int, hbm: int, seq: int, rows: int, data: int = 1, tensor: int = 1,
         context: int = 1, micro_rows: int = 1, logits_chunk: int = 1024, lora=None) -> Plan:
  """The memory plan of `cfg` on `chips` chips as a (data, fsdp = chips / data / context / tensor, context,
  tensor) mesh.

  Args:
    seq: context length (prompt + response) of a rollout row and of a training row.
    rows: rollout rows decoded together across the slice (the KV cache's batch).
    context: devices a training row's tokens are split over (context parallelism: each holds seq / context).
    micro_rows: training rows per micro-batch and row shard (the data x fsdp devices' groups).
    lora: a `lora.LoraConfig` with rank > 0: the params carry its adapters, and only they have AdamW moments and
      gradients (the frozen base has neither).
  """
  if chips % (data * tensor * context):
    raise ValueError(f"memory_plan: data={data} x context={context} x tensor={tensor} does not divide {chips} chips")
  mesh_shape = {"data": data, "fsdp": chips // (data * tensor * context), "context": context, "tensor": tensor}
  lora = lora if lora is not None and lora.enabled else None
  p = param_bytes(cfg, mesh_shape, lora)
  trained = p if lora is None else param_bytes(cfg, mesh_shape, lora, adapters_only=True)
  master = trained // _itemsize(cfg.param_dtype)  # elements; the moments and the accumulator are float32
  tokens = micro_rows * seq // context
  decode_working = decode_bytes(cfg, p)
  cp = context_bytes(cfg, micro_rows * seq, tensor, context)
  # Gradients: the update's float32 accumulator and one micro-batch's gradients beside it (the recipe's mini-batch
  # is always several micro-batches: `rl.update.make_update_fn`), and the optimizer's step (AdamW's update, one
  # float32 array per trained weight before it is added to them): the TPU compiler's plans of the update hold all
  # three (without the third the plan fell 1.9 GiB a chip short for Qwen3-4B on v5p-16, 3.7 for Qwen2.5-7B).
  return Plan(params=p, optimizer=2 * master * 4, gradients=3 * master * 4,
              kv_cache=kv_cache_bytes(cfg, rows, seq, mesh_shape),
              activations=activation_bytes(cfg, tokens, tensor, remat=False, logits_chunk=logits_chunk) + cp,
              activations_remat=activation_bytes(cfg, tokens, tensor, remat=True, logits_chunk=logits_chunk) + cp,
              hbm=hbm, mesh=mesh_shape,
              rollout_rows_fit=rows_that_fit(cfg, seq, hbm, mesh_shape, p + 2 * master * 4 + decode_working),
              decode_working=decode_working)


def format_plan(name: str, slice_name: str, p: Plan, *, seq: int, rows: int) -> str:
  lines = [f"{name} on {slice_name} (mesh {p.mesh}), seq {seq}, rollout rows {rows}: GiB per device",
           f"| {'part':<24} | {'GiB':>8} |", f"|{'-' * 26}|{'-' * 10}|"]
  lines += [f"| {k:<24} | {v / GIB:>8.2f} |" for k, v in p.rows()]
  lines += [f"| {'train step (remat)':<24} | {p.train_total / GIB:>8.2f} |",
            f"| {'rollout (+ moments)':<24} | {p.rollout_total / GIB:>8.2f} |",
            f"| {'HBM per chip':<24} | {p.hbm / GIB:>8.2f} |",
            f"rollout rows of {seq} tokens that fit in {USABLE_HBM:.0%} of HBM next to params and moments: "
            f"{p.rollout_rows_fit}"]
  return "\n".join(lines)


def _lora(rank: int):
  from agentrl_jax.models import lora as lora_lib

  return lora_lib.LoraConfig(rank=rank) if rank else None


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default="qwen3_4b", help="a ModelConfig size (qwen3_4b, qwen2p5_7b, ...)")
  ap.add_argument("--slice", default="v5p-16")
  ap.add_argument("--seq", type=int, default=23040, help="prompt + response tokens (recipe: 2560 + 20480)")
  ap.add_argument("--rows", type=int, default=256, help="rollout rows decoded together")
  ap.add_argument("--data", type=int, default=1)
  ap.add_argument("--tensor", type=int, default=1)
  ap.add_argument("--context", type=int, default=1, help="devices a training row's tokens are split over")
  ap.add_argument("--micro-rows", type=int, default=1)
  ap.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank on every projection")
  ap.add_argument("--dtype", default="bfloat16", help="compute (and KV cache) dtype")
  ap.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
  args = ap.parse_args(argv)
  cfg = ModelConfig.by_name(args.model, dtype=args.dtype)
  chips, hbm = parse_slice(args.slice)
  p = plan(cfg, chips=chips, hbm=hbm, seq=args.seq, rows=args.rows, data=args.data, tensor=args.tensor,
           context=args.context, micro_rows=args.micro_rows, lora=_lora(args.lora_rank))
  out = {"model": args.model, "slice": args.slice, "seq": args.seq, "rows": args.rows, "mesh": p.mesh,
         **{k: v for k, v in dataclasses.asdict(p).items() if k != "mesh"}, "train_total": p.train_total,
         "rollout_total": p.rollout_total}
  print(json.dumps(out) if args.json else format_plan(args.model, args.slice, p, seq=args.seq, rows=args.rows))
  return out


if __name__ == "__main__":
  main()
