"""SFT of Qwen3-4B on real end-to-end tool-use trajectories: stage 1 of the recipe (arXiv 2510.11701).

Run (the base model and the SFT parquet are local paths; nothing downloads):
  python -m agentrl_jax.main --config=configs/sft_qwen3_4b.py --workdir=runs/sft_qwen3_4b \
      --config.model.hf_path=/data/Qwen3-4B-Instruct-2507 --config.data.path=/data/sft_3k.parquet
Smoke (CPU, a tiny random model and tiny conversations generated locally, under a minute):
  python -m agentrl_jax.main --config=configs/sft_qwen3_4b.py:smoke --workdir=/tmp/sft_smoke

Recipe constants: AdamW betas (0.9, 0.95), weight decay 0.01, lr 1e-5 with 10% linear warmup then cosine to 0,
grad clip 1.0, batch 32 conversations, 5 epochs; loss only on assistant tokens (token mean over the batch).
Killed runs resume from the latest checkpoint in `--workdir` with the same command.
"""

import ml_collections

from agentrl_jax.models import loading


def get_config(arg=None):
  if arg not in (None, "", "smoke"):
    raise ValueError(f"sft_qwen3_4b: unknown arg {arg!r}; expected nothing or 'smoke'")
  smoke = arg == "smoke"
  config = ml_collections.ConfigDict()
  config.job = "sft"
  config.seed = 0

  # The model's size and tokenizer come from the HF directory (config.json, tokenizer files).
  config.model = loading.model_block(
      size="qwen3_4b",          # used only without hf_path / checkpoint (random init), e.g. smoke runs
      hf_path="",               # local HF checkpoint directory (the base model of a real run)
      tokenizer_path="",        # default: hf_path
      param_dtype="float32",    # master weights and Adam moments
      dtype="bfloat16",         # activations and matmuls
      remat=True,
  )
  config.data = ml_collections.ConfigDict(dict(
      path="",                  # the recipe's SFT parquet (`messages`, `tools`) or JSONL
      data_dir="",              # built ArrayRecord datasets; default WORKDIR/tfds
      skip_malformed_rows=True,  # rows that do not fit the schema are skipped and counted at build
      shuffle=True,
      toy_conversations=0,      # > 0 and no path: generate this many tiny tool-use conversations
      toy_malformed=0,          # ... plus this many malformed ones (exercise the skip path)
      toy_tools=True,           # ... with the tool schema in the system turn
  ))
  config.sft = ml_collections.ConfigDict(dict(
      batch_size=32,
      num_epochs=5,
      max_seq_len=16384,        # packed row length; longer conversations are skipped and counted
      micro_batch_rows=8,       # rows per micro-batch; a multiple of the data-parallel devices
      warmup_ratio=0.1,
      logits_chunk_size=1024,
  ))
  config.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=1e-5, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01, grad_clip=1.0, min_lr_ratio=0.0))
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1, num_devices=0))  # 0: all
  config.checkpoint = ml_collections.ConfigDict(dict(every_steps=100, max_to_keep=3, async_save=True))
  config.log_every_steps = 10
  config.wandb_project = ""     # log to W&B too when set and wandb is installed
  config.export_hf = True       # write the final params as a HF directory to WORKDIR/hf

  if smoke:
    config.model.size = "tiny_qwen3"
    config.model.update(param_dtype="float32", dtype="float32", remat=False)
    config.data.update(toy_conversations=24, toy_malformed=2)
    config.sft.update(batch_size=8, num_epochs=2, max_seq_len=512, micro_batch_rows=2, logits_chunk_size=None)
    config.optimizer.learning_rate = 1e-3
    config.checkpoint.update(every_steps=2, max_to_keep=2, async_save=False)
    config.log_every_steps = 1
  config.lock()
  return config
