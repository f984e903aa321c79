"""Every program a run of a config compiles, as abstract calls of the jobs' own jitted functions.

Each job builds its programs with the same constructors a run uses (`rl.update.make_update_fn`,
`make_logprobs_fn`, `sampling.sampler.make_sampler`, `sft.step.make_train_step`) and at the shapes the run
reaches: the update and scoring shapes of the trainer's batch layout (`rl.batch`), the rollout's call shapes
(`rollout.shapes.rollout_shapes`: every prefill, extend, decode and grow shape, for every cache capacity), the
SFT step's row buckets (`sft.packing.row_bucket`). Nothing is allocated: parameters, optimizer state and batches
are `ShapeDtypeStruct`s carrying their shardings.

Each program carries an analytic estimate of its work (FLOPs and HBM bytes per call on the whole slice), from
which `report` derives a roofline step time: XLA's own cost analysis counts a loop body once (a scanned layer
stack, a micro-batch scan, a decode loop), so it is reported as the compiler gives it, not used for time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from agentrl_jax import train_state as train_state_lib
from agentrl_jax.aot import target as target_lib
from agentrl_jax.bench import common
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import memory_plan
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import losses
from agentrl_jax.rl import async_config
from agentrl_jax.rl import transfer as transfer_lib
from agentrl_jax.rl import update as update_lib
from agentrl_jax.rollout import engine as engine_lib
from agentrl_jax.rollout import shapes as shapes_lib
from agentrl_jax.sampling import sampler as sampler_lib
from agentrl_jax.sampling.config import bucket, bucket_values


@dataclasses.dataclass
class Program:
  """One program of a run: how to lower it, and what it computes.

  Attributes:
    name: the program, e.g. "rl/update" or "rollout/decode".
    shape: its call shape in words, e.g. "B=256 T=23040".
    lower: traces and lowers it (under its mesh) -> `jax.stages.Lowered`.
    flops: model FLOPs of one call on the whole slice (analytic).
    hbm_bytes: HBM bytes one call must move on the whole slice (analytic: weights, KV cache, activations).
    devices: the devices it runs on.
    scale: what to shrink when it does not fit ("rollout rows", "micro-batch rows") and its current value.
    scale_bytes: per device, the bytes that grow with `scale` (analytic: the KV cache, or one micro-batch's
      activations), for the hint of what fits when the compiler cannot place the program at all.
    fixed_bytes: per device, what a rollout program holds whatever its rows (the parameters it reads).
    step: `scale` moves in multiples of this (its rows are split over this many row shards of the mesh).
    resident: per device, what the run keeps in HBM beside the program's own arguments while it runs (the
      AdamW moments during scoring and rollouts, the KL term's reference parameters), added to its HBM.
  """

  name: str
  shape: str
  lower: Callable[[], Any]
  flops: float
  hbm_bytes: float
  devices: int
  scale: tuple[str, int] | None = None
  scale_bytes: float = 0.0
  fixed_bytes: float = 0.0
  step: int = 1
  resident: int = 0


def row_shards(mesh, *, cache: bool = False) -> int:
  """How many ways a batch's rows are split over `mesh`: its data and fsdp axes for training and scoring (whose
  rows' tokens the context axis splits), and the context axis too for the rollout's cache rows (`cache=True`)."""
  n = int(mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1))
  return n * int(mesh.shape.get("context", 1)) if cache else n


@dataclasses.dataclass
class Plan:
  """The programs of a config on a target, and what was resolved to build them."""

  programs: list[Program]
  model_cfg: ModelConfig
  model_source: str
  notes: list[str]
  resident: int = 0
  """Per device, what an RL run keeps in HBM beside its rollout programs: its training state, less the
  parameters when the sampler reads them in place (same mesh), and the reference parameters of a KL term."""


def _abstract(x, sharding=None):
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _lowering(fn, mesh: jax.sharding.Mesh, *args, **kwargs) -> Callable[[], Any]:
  """`fn.trace(*args, **kwargs).lower()` under the mesh's abstract form (its device names the chip for the
  Pallas kernels)."""

  def lower():
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn.trace(*args, **kwargs).lower()

  return lower


# ------------------------------------------------------------------------------------------------------------
# Analytic work of a call
# ------------------------------------------------------------------------------------------------------------


def _attn_flops(cfg: ModelConfig, queries: float, keys: float) -> float:
  """Score and value products of `queries` queries over `keys` keys each, forward."""
  return 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * queries * keys


def _param_bytes(cfg: ModelConfig) -> float:
  return cfg.param_count() * jnp.dtype(cfg.param_dtype).itemsize


def _cache_bytes_per_token(cfg: ModelConfig) -> float:
  return 2.0 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cfg.jnp_kv_dtype).itemsize


def train_work(cfg: ModelConfig, rows: int, seq: int, *, backward: bool, causal_tokens: float | None = None
               ) -> tuple[float, float]:
  """(FLOPs, HBM bytes) of a forward (and backward, with remat's recomputed forward) over rows x seq tokens.
  Attention is causal: each token attends to the tokens before it in its sequence (`causal_tokens` pairs in
  all; default whole rows)."""
  tokens = rows * seq
  pairs = causal_tokens if causal_tokens is not None else rows * seq * (seq + 1) / 2
  fwd = 2.0 * common.matmul_params(cfg) * tokens + _attn_flops(cfg, pairs, 1.0)
  passes = (3.0 + (1.0 if cfg.remat else 0.0)) if backward else 1.0
  act = tokens * cfg.hidden_size * jnp.dtype(cfg.dtype).itemsize * cfg.num_layers * (4 if backward else 2)
  return fwd * passes, _param_bytes(cfg) * (3 if backward else 1) + act


def _micro_activation_bytes(cfg: ModelConfig, mesh: jax.sharding.Mesh, micro_rows: int, seq: int) -> float:
  """Per device, what one training micro-batch keeps for its backward pass (`models.memory_plan`)."""
  rows = max(micro_rows // row_shards(mesh), 1)
  context = int(mesh.shape.get("context", 1))
  return (memory_plan.activation_bytes(cfg, rows * seq // context, mesh.shape["tensor"], remat=cfg.remat)
          + memory_plan.context_bytes(cfg, rows * seq, mesh.shape["tensor"], context))


def _rl_update_seq(config: ml_collections.ConfigDict) -> list[int]:
  """The row lengths the update and scoring passes see: `rl.pack_len` when packing, else every length bucket
  `rollout.collate` can make (prompt bucket + response bucket)."""
  rl, ro = config.rl, config.rollout
  if rl.get("pack_len"):
    return [rl.pack_len]
  prompts = bucket_values(ro.prompt_bucket_min, bucket(ro.max_prompt_len, ro.prompt_bucket_min))
  responses = bucket_values(rl.response_bucket_min, bucket(ro.max_response_len, rl.response_bucket_min))
  return sorted({p + r for p in prompts for r in responses})


# ------------------------------------------------------------------------------------------------------------
# RL: update, scoring, rollouts (training and evaluation sampling)
# ------------------------------------------------------------------------------------------------------------


def rl_programs(config: ml_collections.ConfigDict, t: target_lib.Target) -> Plan:
  rl = config.rl
  async_cfg = async_config.AsyncConfig.from_rl(rl)  # the run's checks of the asynchronous settings, as ValueErrors
  disaggregated = async_cfg.placement == "disaggregated"
  if disaggregated:  # the trainer and the sampler each on their own part of the slice (rl/transfer.py)
    devs = list(t.devices)
    trainer_devs, sampler_devs = transfer_lib.split_devices(rl.async_sampler_devices, devs)
    sizes = {k: v for k, v in dict(config.mesh).items() if k != "num_devices"}
    ssizes = sharding_lib.sampler_sizes(config.get("sampler_mesh")) or sizes
    # The run's meshes (the transfer program spans both). Each side's own programs are compiled on the slice's
    # first devices instead (the same chips, a sub-slice of the same count): the TPU compiler refuses a program
    # whose devices are not the topology's ids 0..n-1.
    run_mesh = sharding_lib.make_mesh(**sizes, devices=trainer_devs)
    run_smesh = sharding_lib.make_mesh(**ssizes, devices=sampler_devs)
    mesh = sharding_lib.make_mesh(**sizes, devices=devs[:len(trainer_devs)])
    smesh = sharding_lib.make_mesh(**ssizes, devices=devs[:len(sampler_devs)])
  else:
    mesh = target_lib.mesh(config.mesh, t)
    smesh = target_lib.sampler_mesh(config.get("sampler_mesh"), mesh)
  tokenizer, cfg, source = target_lib.tokenizer_and_config(config.model, t)
  loss_cfg = losses.LossConfig(**rl.loss)
  opt_cfg = train_state_lib.OptimizerConfig(**config.optimizer)
  lora = lora_lib.LoraConfig.from_block(config.get("lora"))
  graphdef, state = train_state_lib.abstract_train_state(cfg, opt_cfg, mesh, lora if lora.enabled else None)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  temp = config.rollout.temperature
  chunk = rl.logits_chunk_size or None
  update = update_lib.make_update_fn(graphdef, shardings, loss_cfg, opt_cfg, mesh, micro_batch_size=rl.micro_batch_size,
                                     temperature=temp, logits_chunk_size=chunk)
  logprobs = update_lib.make_logprobs_fn(graphdef, shardings.params, mesh, micro_batch_size=rl.micro_batch_size,
                                         temperature=temp, logits_chunk_size=chunk)
  bs = update_lib.batch_sharding(mesh)
  rows = rl.mini_batch_prompts * rl.n
  rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  packed = bool(rl.get("pack_len"))
  # The KL term's frozen reference: a second copy of the parameters, in HBM for the whole run.
  ref_bytes = device_bytes(state.params) if loss_cfg.needs_reference else 0
  moments = device_bytes(state) - device_bytes(state.params)
  programs = init_programs(cfg, source, mesh, state, opt_cfg, reference=loss_cfg.needs_reference)
  notes = []
  for seq in _rl_update_seq(config):
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=bs)  # noqa: E731
    batch = {"tokens": spec((rows, seq), jnp.int32), "loss_mask": spec((rows, seq), jnp.float32),
             "advantages": spec((rows, seq) if packed else (rows,), jnp.float32),
             "old_logp": spec((rows, seq), jnp.float32)}
    scoring = {"tokens": batch["tokens"]}
    if packed:
      scoring.update(positions=spec((rows, seq), jnp.int32), segment_ids=spec((rows, seq), jnp.int32))
      batch.update(scoring)
    if loss_cfg.needs_proximal_logp or not rl.reuse_sampler_logp:  # as the trainer passes them
      batch["sampler_logp"] = spec((rows, seq), jnp.float32)
    if loss_cfg.needs_reference:
      batch["ref_logp"] = spec((rows, seq), jnp.float32)
    shape = f"B={rows} T={seq}" + (" packed" if packed else "")
    fl, hb = train_work(cfg, rows, seq, backward=True)
    act = _micro_activation_bytes(cfg, mesh, rl.micro_batch_size, seq)
    programs.append(Program("rl/update", shape, _lowering(update, mesh, state, batch, rng), fl, hb, mesh.size,
                            ("micro-batch rows", rl.micro_batch_size), act, step=row_shards(mesh),
                            resident=ref_bytes))
    if not rl.reuse_sampler_logp or loss_cfg.needs_reference:
      fl, hb = train_work(cfg, rows, seq, backward=False)
      # Its argument is one set of parameters (the policy's or the reference's); the moments and the other
      # set stay in HBM beside it.
      programs.append(Program("rl/logprobs", shape, _lowering(logprobs, mesh, state.params, scoring), fl, hb,
                              mesh.size, ("micro-batch rows", rl.micro_batch_size), act / 4, step=row_shards(mesh),
                              resident=moments + ref_bytes))
  if loss_cfg.needs_reference:
    notes.append("the reference model's scoring pass is the policy's logprobs program (same shapes and layout); "
                 "its parameters are counted resident in every program after they are loaded")
  rcfg = engine_lib.rollout_config(config.rollout)
  ro = config.rollout
  # The sampler's policy (`train_state.sampler_policy`): the train state's params, or with LoRA merged weights.
  sgraphdef, to_sampler = train_state_lib.sampler_policy(graphdef, state.params, mesh)
  sparams = jax.eval_shape(to_sampler, state.params)
  programs += rollout_programs(sgraphdef, cfg, tokenizer, rcfg, smesh, sparams, n=rl.n, kind="rollout",
                               temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k,
                               refill=bool(rl.get("max_staleness")))  # asynchronous: the stream's starts too
  ev = config.get("eval")
  if ev is not None:
    programs += rollout_programs(sgraphdef, cfg, tokenizer, rcfg, smesh, sparams, n=ev.n, kind="eval",
                                 temperature=ev.temperature, top_p=ev.top_p, top_k=ev.top_k)
    if not ev.sources:
      notes.append("eval/* programs: compiled by a run when config.eval.sources is set (the recipe's command "
                   "sets it)")
  # Asynchronous runs keep the rollout stream alive across updates: its KV cache (at its largest capacity, which
  # it keeps once reached) and the sampler's weights stay in HBM on the sampler's devices while the trainer's
  # programs run; with delayed weights (async_weight_sync_segments > 0, or on arrival) a second copy of the
  # sampler's weights (the next version) waits beside the one decoding. An evaluation runs on a stopped stream
  # (`RolloutStream.stop`: its cache freed, one version of the weights, which the evaluation decodes with), as a
  # synchronous run's does.
  rollout = [p for p in programs if p.name.startswith("rollout/")]
  streaming = async_cfg.enabled
  delayed = async_cfg.delayed
  stream_cache = int(max((p.scale_bytes for p in rollout if p.name == "rollout/init"), default=0)) if streaming else 0
  copy = int(max((p.fixed_bytes for p in rollout), default=0))  # the sampler's weights, per device
  if disaggregated:
    # The transfer moves what the sampler runs: the params, or with LoRA the merged copy.
    programs.append(_transfer_program(cfg, sparams, sharding_lib.state_shardings(sparams, run_mesh), run_smesh, t,
                                      notes))
    # The sampler's devices: the weights decoding are each rollout program's argument; the next version beside
    # them when delayed.
    resident = copy * delayed
    # The transfer runs on both sides: the trainer's AdamW moments (and reference) stay beside it on one, the
    # stream's weights and KV cache on the other.
    programs[-1].resident = max(moments + ref_bytes, copy * (1 + delayed) + stream_cache)
    notes.append(f"disaggregated: the update and scoring programs for {mesh.size} devices "
                 f"({dict(mesh.shape)}), the rollout and eval programs for the other {smesh.size} "
                 f"({dict(smesh.shape)}), each compiled on the slice's first devices (the TPU compiler places a "
                 "program on ids 0..n-1; the chips are alike); HBM per chip is per side")
  else:
    # The sampler reads the train state's params in place on the same mesh (not LoRA's merged copy: counted as
    # the rollout programs' arguments), unless delayed weights make it decode on copies of its own.
    in_place = smesh is mesh and not lora.enabled and not delayed
    resident = device_bytes(state) - (device_bytes(state.params) if in_place else 0) + ref_bytes + copy * delayed
    # Colocated, the stream's cache and its own copies of the weights (LoRA's merged one; delayed: the one
    # decoding and the next) stay beside the update and the scoring pass.
    beside = stream_cache + copy * ((lora.enabled or delayed) + delayed) if streaming else 0
    for p in programs:
      if p.name in ("rl/update", "rl/logprobs"):
        p.resident += beside
  if streaming:
    notes.append(f"asynchronous: the rollout stream's KV cache ({stream_cache / 2**30:.2f} GiB a sampler device)"
                 + (" and the sampler's weights" if disaggregated or lora.enabled or delayed else "")
                 + " stay in HBM beside " + ("the weight transfer" if disaggregated else
                                             "the update and the scoring pass")
                 + "; an evaluation stops the stream first (its cache freed)"
                 + (f"; delayed weights (async_weight_sync_segments > 0 or async_weight_sync='arrival') keep "
                    f"the next version beside the one decoding "
                    f"({copy / 2**30:.2f} GiB a sampler device)" if delayed else ""))
  for p in programs:
    if p.name.startswith("rollout/"):
      p.resident = resident
    elif p.name.startswith("eval/"):  # a stopped stream: no next version waits (the weights are its argument)
      p.resident = resident - copy * delayed
  return Plan(programs, cfg, source, notes, resident)


# Inter-chip interconnect bandwidth per chip, one way over all its links (bytes/s; half the bidirectional figure
# of the Cloud TPU system architecture pages: v5e 400, v5p 1,200, v6e 800 GB/s), and its links (ICI ports: 2D
# torus 4, 3D torus 6).
ICI_BYTES_S = {"v4": 300e9, "v5e": 200e9, "v5p": 600e9, "v6e": 400e9}
ICI_LINKS = {"v4": 6, "v5e": 4, "v5p": 6, "v6e": 4}


def _transfer_program(cfg: ModelConfig, params, src_shardings, smesh, t: target_lib.Target, notes: list[str]
                      ) -> Program:
  """The disaggregated weight transfer: one program over the union of the trainer's and the sampler's devices."""
  xfer = transfer_lib.WeightTransfer(src_shardings, sharding_lib.state_shardings(params, smesh))
  if xfer.union is None:
    raise ValueError(f"aot: the disaggregated sampler mesh {dict(smesh.shape)} must have the trainer's axis sizes "
                     "of size > 1 in the same order (the weight transfer is one program over both meshes)")
  xfer._build(params)  # pylint: disable=protected-access
  union_args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct((2 * x.shape[0], *x.shape[1:]), x.dtype, sharding=s),
                            params, xfer._in)  # pylint: disable=protected-access
  nbytes = float(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(params)))
  # Each sampler chip receives its shard of every weight (replicated axes receive a copy each).
  per_chip = device_bytes(jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params,
                                       sharding_lib.state_shardings(params, smesh))) * t.devices_per_chip
  # The weights cross the cut between the halves: where the split runs along a torus dimension of size 2 (no
  # wraparound), each sampler chip has one link to the trainer's side, a sixth (3D) or a quarter (2D) of its ICI.
  link = ICI_BYTES_S[t.generation] / ICI_LINKS[t.generation]
  est = per_chip / link
  notes.append(f"weight transfer: {nbytes / 2**30:.2f} GiB of parameters, {per_chip / 2**30:.2f} GiB into each "
               f"sampler chip: ~{est * 1e3:.0f} ms over one ICI link a chip across the cut ({link / 1e9:.0f} GB/s; "
               f"~{per_chip / ICI_BYTES_S[t.generation] * 1e3:.0f} ms if every link of the chip carried it); the "
               "est. s column is the HBM roofline of the copy")
  return Program("rl/weight_transfer", f"{nbytes / 2**30:.2f} GiB -> {smesh.size} devices",
                 _lowering(xfer._program, xfer.union, union_args),  # pylint: disable=protected-access
                 0.0, 2.0 * nbytes, xfer.union.size)


def init_programs(cfg: ModelConfig, source: str, mesh: jax.sharding.Mesh, state, opt_cfg, *,
                  reference: bool = False) -> list[Program]:
  """The programs a fresh run compiles before its first step: the parameters' random init (when the model is
  not loaded from a checkpoint or HF weights: `models.loading.init_model`), again for a KL term's reference,
  and the AdamW moments' init (`rl.update.init_train_state`)."""
  from agentrl_jax.models import loading

  out = []
  if "random init" in source:
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    pbytes = _param_bytes(cfg)
    # Each init builds its own jitted function, as each `loading.init_model` call of a run does.
    out.append(Program("init/params", "params", _lowering(loading.init_params_fn(cfg, mesh)[1], mesh, key), 0.0,
                       pbytes, mesh.size))
    if reference:  # loaded after the policy's train state, which stays in HBM beside it
      out.append(Program("init/reference", "params", _lowering(loading.init_params_fn(cfg, mesh)[1], mesh, key),
                         0.0, pbytes, mesh.size, resident=device_bytes(state)))
  tx_init = jax.jit(opt_cfg.make().init, out_shardings=jax.tree.map(lambda a: a.sharding, state.opt_state))
  # The moments' init reads only the parameters' shapes, so jit drops them from its arguments: they are in HBM
  # beside it all the same (and a KL term's reference is loaded only after it).
  params = device_bytes(state.params)
  trainable = train_state_lib.split_trainable(state.params)[0]  # with LoRA, the adapters' moments only
  out.append(Program("init/optimizer", "AdamW moments", _lowering(tx_init, mesh, trainable), 0.0,
                     2.0 * device_bytes(trainable) * mesh.size, mesh.size, resident=params))
  return out


def device_bytes(tree) -> int:
  """Bytes one device holds of a pytree of sharded `ShapeDtypeStruct`s (the largest shard of each leaf)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    sharding = getattr(leaf, "sharding", None)
    shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
    total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
  return total


def rollout_programs(graphdef, cfg: ModelConfig, tokenizer, rcfg, mesh: jax.sharding.Mesh, params, *, n: int,
                     kind: str, temperature: float, top_p: float, top_k: int, greedy: bool = False,
                     refill: bool = False) -> list[Program]:
  """The sampler programs of rollouts with these sampling settings (`rollout.shapes.rollout_shapes`; `refill`:
  with an asynchronous run's rollout stream)."""
  sampling = shapes_lib.sampling_config(tokenizer, rcfg, temperature=1.0 if greedy else temperature, top_p=top_p,
                                        top_k=top_k, greedy=greedy)
  sampler = sampler_lib.make_sampler(graphdef, cfg, sampling, batch=rcfg.batch_size, mesh=mesh, params=params)
  jit = sampler.jitted
  shp = shapes_lib.rollout_shapes(rcfg, n, fixed_capacity=sampler.fixed_capacity, refill=refill)
  b = rcfg.batch_size
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
  state_at = lambda cap: jax.eval_shape(lambda: sampler_lib.init_state(cfg, b, cap, jax.random.key(0)))  # noqa: E731
  pbytes = _param_bytes(cfg)
  cache = lambda cap: b * cap * _cache_bytes_per_token(cfg) / mesh.size  # noqa: E731  per device
  placed = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), params,
                        sharding_lib.state_shardings(params, mesh))
  fixed = float(device_bytes(placed))
  out = []
  for cap in shp.capacities:
    out.append(Program(f"{kind}/init", f"B={b} S={cap}",
                       _lowering(jit["init"], mesh, cfg, b, cap, key, forced_len=0), 0.0,
                       b * cap * _cache_bytes_per_token(cfg), mesh.size, ("rollout rows", b), cache(cap)))
  for gp, t, cap in shp.prefill:
    args = (params, state_at(cap), i32(gp, t), i32(gp), i32(gp * n), i32(gp * n), None)
    fl = 2.0 * common.matmul_params(cfg) * gp * t + _attn_flops(cfg, gp * t * (t + 1) / 2, 1.0)
    out.append(Program(f"{kind}/prefill", f"P={gp}x{n} T={t} S={cap}", _lowering(jit["prefill_groups"](n), mesh,
                                                                                 *args),
                       fl, pbytes + gp * n * t * _cache_bytes_per_token(cfg), mesh.size, ("rollout rows", b),
                       cache(cap)))
  for r, t, cap in shp.extend:
    args = (params, state_at(cap), i32(r), i32(r, t), i32(r), jax.ShapeDtypeStruct((r,), jnp.bool_), i32(r), None)
    fl = 2.0 * common.matmul_params(cfg) * r * t + _attn_flops(cfg, r * t, cap)
    out.append(Program(f"{kind}/extend", f"R={r} T={t} S={cap}", _lowering(jit["extend"], mesh, *args), fl,
                       pbytes + 2 * r * cap * _cache_bytes_per_token(cfg), mesh.size, ("rollout rows", b),
                       cache(cap)))
  for cap in shp.decode:
    steps = rcfg.segment_len
    args = (params, state_at(cap), jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))
    # A segment of decode steps over full rows: every step reads the weights and each row's cache.
    fl = steps * (2.0 * common.matmul_params(cfg) * b + _attn_flops(cfg, b, cap))
    hb = steps * (pbytes + b * cap * _cache_bytes_per_token(cfg))
    out.append(Program(f"{kind}/decode", f"B={b} S={cap} x{steps} steps", _lowering(jit["decode"], mesh, *args),
                       fl, hb, mesh.size, ("rollout rows", b), cache(cap)))
  for c0, c1 in shp.grow:
    out.append(Program(f"{kind}/grow", f"B={b} S={c0}->{c1}", _lowering(jit["grow"], mesh, state_at(c0), c1),
                       0.0, b * (c0 + c1) * _cache_bytes_per_token(cfg), mesh.size, ("rollout rows", b),
                       cache(c0) + cache(c1)))
  for p in out:
    p.fixed_bytes = 0.0 if p.name.endswith(("/init", "/grow")) else fixed
    p.step = row_shards(mesh, cache=True)
  return out


# ------------------------------------------------------------------------------------------------------------
# SFT and the sampling jobs
# ------------------------------------------------------------------------------------------------------------


def sft_programs(config: ml_collections.ConfigDict, t: target_lib.Target) -> Plan:
  from agentrl_jax.sft import packing, step as step_lib

  s = config.sft
  mesh = target_lib.mesh(config.mesh, t)
  _, cfg, source = target_lib.tokenizer_and_config(config.model, t)
  sft_cfg = step_lib.SFTConfig(**s)
  opt = dict(config.optimizer)
  opt_cfg = train_state_lib.OptimizerConfig(**opt, schedule="cosine", total_steps=1000, warmup_steps=100)
  lora = lora_lib.LoraConfig.from_block(config.get("lora"))
  graphdef, state = train_state_lib.abstract_train_state(cfg, opt_cfg, mesh, lora if lora.enabled else None)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  train_step = step_lib.make_train_step(graphdef, shardings, opt_cfg, mesh, micro_rows=sft_cfg.micro_batch_rows,
                                        seq_len=sft_cfg.max_seq_len, logits_chunk_size=sft_cfg.logits_chunk_size)
  bsh = step_lib.batch_sharding(mesh, sft_cfg.micro_batch_rows, sft_cfg.max_seq_len)
  rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  programs = init_programs(cfg, source, mesh, state, opt_cfg)
  for num_rows in packing.row_buckets(sft_cfg.micro_batch_rows, sft_cfg.batch_size, sft_cfg.fixed_rows):
    m, r, seq = num_rows // sft_cfg.micro_batch_rows, sft_cfg.micro_batch_rows, sft_cfg.max_seq_len
    batch = {f: jax.ShapeDtypeStruct((m, r, seq), jnp.float32 if f == "weights" else jnp.int32, sharding=bsh)
             for f in packing.FIELDS}
    fl, hb = train_work(cfg, num_rows, seq, backward=True)
    programs.append(Program("sft/step", f"rows={num_rows} T={seq}", _lowering(train_step, mesh, state, batch, rng),
                            fl, hb, mesh.size, ("micro-batch rows", r), step=row_shards(mesh)))
  return Plan(programs, cfg, source, [])


def sampling_programs(config: ml_collections.ConfigDict, t: target_lib.Target) -> Plan:
  """eval / filter / collect: rollouts only, on `config.mesh`, with the job's sampling settings."""
  job = config.job
  block = {"eval": "eval", "filter": "filter", "collect": "collect"}[job]
  settings = config[block]
  n = settings.n if job in ("eval", "collect") else settings.k
  mesh = target_lib.mesh(config.mesh, t)
  tokenizer, cfg, source = target_lib.tokenizer_and_config(config.model, t)
  from agentrl_jax.models import hf_io
  from flax import nnx

  graphdef, abstract = nnx.split(hf_io.abstract_model(cfg))
  rcfg = engine_lib.rollout_config(config.rollout)
  greedy = settings.temperature == 0
  programs = rollout_programs(graphdef, cfg, tokenizer, rcfg, mesh, abstract, n=n, kind=job,
                              temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                              greedy=greedy)
  return Plan(programs, cfg, source, [])


JOBS = {"rl": rl_programs, "sft": sft_programs, "eval": sampling_programs, "filter": sampling_programs,
        "collect": sampling_programs}


def for_config(config: ml_collections.ConfigDict, t: target_lib.Target) -> Plan:
  """The programs a run of `config` compiles on the slice `t`.

  Raises:
    ValueError: a job with no programs of its own (the CPU pipeline runs other jobs' configs stage by stage).
  """
  job = config.get("job")
  if job not in JOBS:
    raise ValueError(f"aot: config.job={job!r} has no programs to check; supported: {sorted(JOBS)} (a pipeline "
                     "runs those jobs' configs stage by stage)")
  return JOBS[job](config, t)
