"""SFT of Qwen2.5-7B-Instruct on real end-to-end tool-use trajectories: the recipe's 7B stage 1 (the reference's
recipe/demystify/qwen2_7b_sft.sh; its constants are those of the 4B script).

Run (local paths; nothing downloads):
  python -m agentrl_jax.main --config=configs/sft_qwen2p5_7b.py --workdir=runs/sft_qwen2p5_7b \
      --config.model.hf_path=/data/Qwen2.5-7B-Instruct --config.data.path=/data/sft_3k.parquet
Then RL: --config=configs/demystify_qwen2p5_7b.py --config.model.checkpoint=runs/sft_qwen2p5_7b/checkpoints
Smoke (CPU, a tiny random Qwen2-family model): --config=configs/sft_qwen2p5_7b.py:smoke

Recipe constants: agentrl_jax/rl/recipe.py `sft_config` (see configs/sft_qwen3_4b.py). Qwen2.5-7B's context is
32768 tokens, the recipe's SFT length.
"""

from agentrl_jax.rl import recipe


def get_config(arg=None):
  if arg not in (None, "", "smoke"):
    raise ValueError(f"sft_qwen2p5_7b: unknown arg {arg!r}; expected nothing or 'smoke'")
  config = recipe.sft_config(size="qwen2p5_7b")
  if arg == "smoke":
    recipe.shrink_sft_for_smoke(config, size="tiny_qwen2")
  config.lock()
  return config
