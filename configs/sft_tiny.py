"""Tiny CPU SFT run for tests: a tiny random Qwen3, the tiny tokenizer and toy tool-use conversations.

Run: python -m agentrl_jax.main --config=configs/sft_tiny.py --workdir=/tmp/sft_tiny
Args: `:overfit` trains 80 steps on four conversations at a high learning rate (loss -> ~0) and exports HF.
"""

import ml_collections

from agentrl_jax.models import loading
from agentrl_jax.models import lora


def get_config(arg=None):
  if arg not in (None, "", "overfit"):
    raise ValueError(f"sft_tiny: unknown arg {arg!r}; expected nothing or 'overfit'")
  config = ml_collections.ConfigDict()
  config.job = "sft"
  config.seed = 0
  config.model = loading.model_block(size="tiny_qwen3", param_dtype="float32", dtype="float32")
  config.data = ml_collections.ConfigDict(dict(path="", data_dir="", skip_malformed_rows=True, shuffle=True,
                                               toy_conversations=12, toy_malformed=2,
                                               toy_tools=True))
  config.sft = ml_collections.ConfigDict(dict(batch_size=4, num_epochs=3, max_seq_len=512, micro_batch_rows=2,
                                              warmup_ratio=0.1, logits_chunk_size=None))
  config.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01, grad_clip=1.0, min_lr_ratio=0.0))
  config.lora = lora.config_block()  # rank > 0: LoRA adapters instead of full fine-tuning
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, context=1, tensor=1, num_devices=0))  # 0: all
  config.checkpoint = ml_collections.ConfigDict(dict(every_steps=2, max_to_keep=2, async_save=False))
  config.log_every_steps = 1
  config.wandb_project = ""
  config.export_hf = False
  if arg == "overfit":
    # No tool schema in the system turn (the calls and results stay): ~110 tokens per conversation.
    config.data.update(toy_conversations=4, toy_malformed=0, toy_tools=False)
    config.sft.update(batch_size=4, num_epochs=80, max_seq_len=128, warmup_ratio=0.05)
    config.mesh.num_devices = 2  # 2-way FSDP: sharded, and fast with fake CPU devices
    config.optimizer.update(learning_rate=1e-2, weight_decay=0.0, min_lr_ratio=0.1)
    config.checkpoint.every_steps = 1000
    config.log_every_steps = 20
    config.export_hf = True
  config.lock()
  return config
