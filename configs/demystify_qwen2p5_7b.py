"""GRPO-TCR agentic RL of Qwen2.5-7B-Instruct with the code tool (the recipe's 7B setting, arXiv 2510.11701).

Run (local paths; nothing downloads):
  python -m agentrl_jax.main --config=configs/demystify_qwen2p5_7b.py --workdir=runs/demystify_qwen2p5_7b \
      --config.model.hf_path=/data/Qwen2.5-7B-sft --config.data.train_path=/data/rl_30k.parquet
Per slice family (the default is a v5p layout; each is checked by `python -m agentrl_jax.aot --config=...:v5e
--topology=v5e:4x4`, see the README's table):
  :v5e  v5e-16: LoRA rank 64 (learning rate 1e-5), each 23,040-token row split over 4 chips (context
        parallelism), 4-row micro-batches, 96 rollout rows
  :v6e  v6e-16: LoRA rank 64, rows split over 2 chips, 8-row micro-batches, 256 rollout rows
Smoke (CPU): --config=configs/demystify_qwen2p5_7b.py:smoke (a tiny Qwen2-family model)

The recipe's constants are those of configs/demystify_qwen3_4b.py (agentrl_jax/rl/recipe.py); only the model
changes. Qwen2.5 has no q/k norm and carries qkv biases; its context is 32768 tokens, which fits the recipe's
2560 + 20480.
"""

from agentrl_jax.rl import recipe


def get_config(arg=None):
  if arg not in (None, "", "smoke", *recipe.SLICE_FAMILIES):
    raise ValueError(f"demystify_qwen2p5_7b: unknown arg {arg!r}; expected nothing, 'smoke', 'v5e' or 'v6e'")
  config = recipe.rl_config(size="qwen2p5_7b")
  if arg in recipe.SLICE_FAMILIES:
    recipe.for_slice(config, "qwen2p5_7b", arg)
  if arg == "smoke":
    recipe.shrink_for_smoke(config)
    config.model.size = "tiny_qwen2"
  config.lock()
  return config
