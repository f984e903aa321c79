"""Tunix's GRPO loss-and-gradient step, driven by `agentrl_jax.bench.update` (runs in .venv-tunix, not .venv).

    .venv-tunix/bin/python agentrl_jax/bench/update_tunix.py --hf-dir DIR --batch BATCH.npz

Imports only Tunix, JAX and NumPy (no agentrl_jax). The step is Tunix's own: `tunix.rl.algo_core.grpo_loss_fn`
(policy "grpo", DAPOConfig: token-mean, clip 0.2 / 0.28, no KL, plus dual clip c = 10 as in our recipe) on
Tunix's Qwen3 loaded from the same HF directory, under `nnx.value_and_grad` -> `optax.global_norm` ->
`nnx.Optimizer.update` jitted with the optimizer donated: the body of `tunix.sft.peft_trainer
.PeftTrainer._train_step` as its `jit_train_and_eval_step` compiles it. The optimizer matches ours: global-norm
clip 1.0 then AdamW.

Protocol (stdout, one JSON object per line): after loading and one compiled step it prints
{"ready": true, "compile_s", "loss", "entropy", "pg_clipfrac", "grad_norm"} (values of that first step); then
for each stdin line "run N" it runs N steps and prints {"times": [...], "cpu": [...]} (wall and process CPU
seconds per step); "quit" ends it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _backend() -> dict:
  """The backend and devices this worker runs on (the parent passes its own JAX_PLATFORMS)."""
  import jax

  return {"backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "device_count": jax.device_count()}


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--hf-dir", required=True)
  p.add_argument("--batch", required=True, help="npz with tokens, loss_mask, advantages, old_logp, prompt_len")
  p.add_argument("--lr", type=float, default=1e-6)
  args = p.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from flax import nnx
  from tunix.models.qwen3 import model as qwen3_lib
  from tunix.models.qwen3 import params as qwen3_params
  from tunix.rl import algo_core
  from tunix.rl import common
  from tunix.rl.grpo.dapo_learner import DAPOConfig

  with open(f"{args.hf_dir}/config.json") as f:
    hf = json.load(f)
  cfg = qwen3_lib.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
      hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
      num_kv_heads=hf["num_key_value_heads"], rope_theta=int(hf["rope_theta"]), norm_eps=hf["rms_norm_eps"],
      use_tied_embedding=hf["tie_word_embeddings"], dtype=jnp.float32, param_dtype=jnp.float32)
  auto = (jax.sharding.AxisType.Auto,) * 2  # Tunix's models constrain activations GSPMD-style
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1], axis_types=auto)
  with jax.set_mesh(mesh):
    model = qwen3_params.create_model_from_safe_tensors(args.hf_dir, cfg, mesh)

  data = np.load(args.batch)
  pl = int(data["prompt_len"])
  tokens = jnp.asarray(data["tokens"], jnp.int32)
  example = common.TrainExample(
      prompt_ids=tokens[:, :pl], prompt_mask=jnp.ones_like(tokens[:, :pl]),
      completion_ids=tokens[:, pl:], completion_mask=jnp.asarray(data["loss_mask"][:, pl:], jnp.int32),
      advantages=jnp.asarray(data["advantages"], jnp.float32), ref_per_token_logps=None,
      old_per_token_logps=jnp.asarray(data["old_logp"][:, pl:], jnp.float32))

  algo = DAPOConfig()  # token-mean, epsilon 0.2, epsilon_high 0.28, no KL
  algo.epsilon_c = 10.0  # dual clip, read by grpo_loss_fn with getattr
  algo.temperature = 1.0  # set at run time by GRPOLearner from the rollout config
  pad_id = int(data["pad_id"])

  def loss_fn(model, example):
    return algo_core.grpo_loss_fn(model, example, algo, pad_id, pad_id)

  def train_step(model, optimizer, example):  # tunix.sft.peft_trainer.PeftTrainer._train_step
    grad_fn = nnx.value_and_grad(loss_fn, argnums=0, has_aux=True)
    (loss, aux), grads = grad_fn(model, example)
    grad_norm = optax.global_norm(grads)
    optimizer.update(model, grads)
    return loss, aux, grad_norm

  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(args.lr, b1=0.9, b2=0.999, weight_decay=0.01))
  with jax.set_mesh(mesh):
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    step = nnx.jit(train_step, donate_argnames=("optimizer",))
    t = time.perf_counter()
    loss, aux, grad_norm = jax.block_until_ready(step(model, optimizer, example))
    first = {"ready": True, "compile_s": time.perf_counter() - t, "loss": float(loss),
             "entropy": float(aux["entropy"]), "pg_clipfrac": float(aux["pg_clipfrac"]),
             "grad_norm": float(grad_norm)}
    print(json.dumps({**first, **_backend()}), flush=True)
    for line in sys.stdin:
      cmd = line.split()
      if not cmd or cmd[0] == "quit":
        break
      times, cpu = [], []
      for _ in range(int(cmd[1])):
        t, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(step(model, optimizer, example))
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
      print(json.dumps({"times": times, "cpu": cpu}), flush=True)


if __name__ == "__main__":
  main()
