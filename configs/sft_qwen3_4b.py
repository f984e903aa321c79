"""SFT of Qwen3-4B on real end-to-end tool-use trajectories: stage 1 of the recipe (arXiv 2510.11701;
the reference's recipe/demystify/qwen3_4b_sft.sh).

Run (the base model and the SFT parquet are local paths; nothing downloads):
  python -m agentrl_jax.main --config=configs/sft_qwen3_4b.py --workdir=runs/sft_qwen3_4b \
      --config.model.hf_path=/data/Qwen3-4B-Instruct-2507 --config.data.path=/data/sft_3k.parquet
Smoke (CPU, a tiny random model and tiny conversations generated locally, under a minute):
  python -m agentrl_jax.main --config=configs/sft_qwen3_4b.py:smoke --workdir=/tmp/sft_smoke

Recipe constants (agentrl_jax/rl/recipe.py `sft_config`): AdamW betas (0.9, 0.95), weight decay 0.01, lr 1e-5
with 10% linear warmup then cosine to 0, grad clip 1.0, batch 32 conversations, 5 epochs, 32768 tokens per
conversation (longer ones truncated on the right, as the reference; `--config.sft.truncation=skip` drops them),
a checkpoint every 62 steps; loss only on assistant tokens (token mean over the batch).
Killed runs resume from the latest checkpoint in `--workdir` with the same command.
"""

from agentrl_jax.rl import recipe


def get_config(arg=None):
  if arg not in (None, "", "smoke"):
    raise ValueError(f"sft_qwen3_4b: unknown arg {arg!r}; expected nothing or 'smoke'")
  config = recipe.sft_config(size="qwen3_4b")
  if arg == "smoke":
    recipe.shrink_sft_for_smoke(config)
  config.lock()
  return config
