"""Multi-turn SFT trainer: `python -m agentrl_jax.main --config=configs/sft_qwen3_4b.py --workdir=DIR`.

One function, `run(config, workdir)`, in the sections of big_vision's train.py: config -> mesh, tokenizer and
data -> model and optimizer state (fresh, or restored from the latest checkpoint) -> the loop (encode + pack,
one jitted step, metrics, checkpoints) -> final checkpoint and HF export.

A run killed at any point resumes from its latest checkpoint with the same config and workdir and reaches the
same params bit for bit: the checkpoint holds the train state, the grain iterator position, the PRNG key and
the host-side counters, and every step is a deterministic function of those.

Several processes (one per host, `--num_processes`): every process reads and packs the same global batch and
places only its own devices' rows (`agentrl_jax/multihost.py`), so a run on N hosts computes what one host with
the same devices would; process 0 writes the metrics and the HF export, Orbax saves and restores the sharded
state across hosts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from flax import nnx
import jax
import ml_collections
import numpy as np

from agentrl_jax import checkpoint as ckpt_lib
from agentrl_jax import data
from agentrl_jax import compile_stats, metrics_writer, multihost
from agentrl_jax import train_state as train_state_lib
from agentrl_jax.models import hf_io
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.sft import step as step_lib
from agentrl_jax.sft import toy_data
from agentrl_jax.tasks import tokenizer as embedded_tokenizer

log = logging.getLogger(__name__)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains; returns the metrics of the last logged step."""
  compiled0 = compile_stats.compile_totals()  # the job's compile work is reported in its metrics
  # ---------------------------------------------------------------------------------------------- config
  sft_cfg = step_lib.SFTConfig(**config.sft)
  ckpt_cfg = ckpt_lib.CheckpointConfig(**config.checkpoint)
  root = jax.random.key(config.seed)
  init_key, _ = jax.random.split(root)  # named keys: init; SFT has nothing stochastic beyond the data order
  mesh = sharding_lib.mesh_from_config(config.mesh)
  model_block = embedded_tokenizer.fill_model_block(config.model)
  tokenizer, model_cfg = ckpt_lib.tokenizer_and_config(model_block)
  log.info("sft: %s (%s params) on mesh %s", model_cfg.family, f"{model_cfg.param_count():,}", dict(mesh.shape))

  # ---------------------------------------------------------------------------------------------- data
  path = config.data.path
  if not path:  # the smoke / test setting: tiny conversations generated locally
    if not config.data.toy_conversations:
      raise ValueError("config.data.path is empty and config.data.toy_conversations is 0: no data to train on")
    path = os.path.join(workdir, "toy_sft.jsonl")
    multihost.once("sft_toy_data", lambda: toy_data.write_jsonl(
        path, config.data.toy_conversations, seed=config.seed, malformed=config.data.toy_malformed,
        tools=config.data.toy_tools))
  source = data.SourceConfig(path=path, schema="sft", skip_malformed=config.data.skip_malformed_rows,
                             data_dir=config.data.data_dir or os.path.join(workdir, "tfds"))
  prepared = multihost.primary_first("sft_data", lambda: data.prepare(source))
  # shard 0 of 1 on every process: each reads the global batch (see the module docstring).
  pipe_cfg = data.PipelineConfig(batch_size=sft_cfg.batch_size, seed=config.seed, num_epochs=sft_cfg.num_epochs,
                                 shuffle=config.data.shuffle, shard_index=0, shard_count=1)
  total_steps = data.num_batches(prepared.num_examples, pipe_cfg)
  # Encoding and packing are part of the grain pipeline, so the iterator state stays the one position.
  dataset = data.conversation_batches(prepared.data_source, pipe_cfg).map(
      lambda convs: step_lib.encode_batch(tokenizer, convs, sft_cfg))
  data_iter = iter(dataset)
  log.info("sft: %d conversations (%d malformed rows skipped at build), %d epochs of batch %d = %d steps",
           prepared.num_examples, prepared.num_skipped, sft_cfg.num_epochs, sft_cfg.batch_size, total_steps)

  # ---------------------------------------------------------------------------------------------- state
  opt_cfg = train_state_lib.OptimizerConfig(**config.optimizer, schedule="cosine", total_steps=max(total_steps, 1),
                                      warmup_steps=sft_cfg.warmup_steps(total_steps))
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), ckpt_cfg)
  counters = {"skipped_conversations": 0, "truncated_conversations": 0, "trained_tokens": 0}
  lora = lora_lib.LoraConfig.from_block(config.get("lora"))  # rank 0: full fine-tuning
  graphdef, state, rng, step, restored_meta = train_state_lib.init_or_restore_train_state(
      ckpt, model_block, model_cfg, opt_cfg, mesh, root_key=root, init_key=init_key, data_iterator=data_iter,
      lora=lora)
  if step:
    counters.update(restored_meta.get("counters", {}))
    log.info("sft: resumed at step %d of %d", step, total_steps)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  train_step = step_lib.make_train_step(graphdef, shardings, opt_cfg, mesh, micro_rows=sft_cfg.micro_batch_rows,
                                        seq_len=sft_cfg.max_seq_len, logits_chunk_size=sft_cfg.logits_chunk_size)
  # The tokenizer goes into the metadata so that an export (`python -m agentrl_jax.checkpoint`) can ship it.
  meta = {"model_config": dataclasses.asdict(model_cfg), "total_steps": total_steps,
          "tokenizer_path": model_block.get("tokenizer_path") or model_block.get("hf_path") or "",
          **train_state_lib.checkpoint_metadata(model_block, init_key, lora)}

  def save(step, force=False):
    return ckpt.maybe_save(step, {"train": train_state_lib.checkpointed(state), "rng": rng},
                           data_iterator=data_iter, force=force, metadata={**meta, "counters": counters})

  # ---------------------------------------------------------------------------------------------- loop
  writer = metrics_writer.MetricsWriter(workdir, start_step=step, config=config.to_dict(),
                                        wandb_project=config.get("wandb_project") or None)
  bar = metrics_writer.progress_bar(total_steps, initial=step, desc="sft")
  pending, last, t0 = [], {}, time.perf_counter()
  with jax.set_mesh(mesh):
    while step < total_steps:
      batch = next(data_iter)
      for index, reason in batch.skipped:
        log.warning("sft: skipping conversation at row %d: %s", index, reason)
      counters["skipped_conversations"] += len(batch.skipped)
      counters["truncated_conversations"] += len(batch.truncated)
      if batch.packed is None:
        log.warning("sft: step %d: every conversation of the batch was skipped; no update", step + 1)
      else:
        arrays = step_lib.batch_arrays(batch.packed, mesh)
        state, metrics = train_step(state, arrays, jax.random.fold_in(rng, step))
        pending.append(metrics)
        counters["trained_tokens"] += batch.packed.num_tokens
        if step == 0 or (step + 1) % config.log_every_steps == 0:  # one decoded example with its trained text
          c = batch.encoded[0]
          writer.write_samples(step + 1, [{"row": c.index, "text": tokenizer.decode(c.tokens),
                                           "trained": tokenizer.decode(c.tokens[c.loss_mask])}])
      step += 1
      bar.update(1)

      if (step % config.log_every_steps == 0 or step == total_steps) and pending:
        host = multihost.to_host(pending)
        last = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
        last["tokens"] = float(sum(m["tokens"] for m in host))
        last["steps_per_sec"] = len(host) / (time.perf_counter() - t0)
        last.update({k: float(v) for k, v in counters.items()}, epoch=step / total_steps * sft_cfg.num_epochs)
        last.update(compile_stats.metrics_since(compiled0))
        writer.write(step, last)
        bar.set_postfix(loss=f"{last['loss']:.4f}", lr=f"{last['learning_rate']:.2e}")
        pending, t0 = [], time.perf_counter()
      save(step, force=step == total_steps)
  bar.close()

  # ---------------------------------------------------------------------------------------------- finish
  save(step, force=True)  # no-op unless the loop did not run (already complete)
  ckpt.close()
  writer.close()
  if config.export_hf:
    params = multihost.to_host(state.params) if jax.process_count() > 1 else state.params  # every process
    if multihost.is_primary():
      model = lora_lib.merged(nnx.merge(graphdef, params))  # adapters folded into the weights
      out = hf_io.export_hf(model, os.path.join(workdir, "hf"), tokenizer=tokenizer)
      log.info("sft: exported the final params to %s", out)
    multihost.barrier("sft_export")
  log.info("sft: done after %d steps; %d conversations skipped", step, counters["skipped_conversations"])
  return last
