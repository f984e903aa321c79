"""GRPO-TCR agentic RL of Qwen3-4B with the code tool: stage 2 of the recipe (arXiv 2510.11701).

Run (model, prompts and eval sets are local paths; nothing downloads):
  python -m agentrl_jax.main --config=configs/demystify_qwen3_4b.py --workdir=runs/demystify_qwen3_4b \
      --config.model.hf_path=/data/Qwen3-4B-sft --config.data.train_path=/data/rl_30k.parquet \
      --config.eval.sources="$(python -c 'from agentrl_jax.rl import recipe; print(recipe.eval_sources("/data/eval"))')"
  Start from our SFT run instead: --config.model.checkpoint=runs/sft_qwen3_4b/checkpoints
  On a TPU slice: bash launch/tpu_vm.sh run configs/demystify_qwen3_4b.py gs://bucket/runs/x --config....
Per slice family (the default is a v5p layout; each is checked by `python -m agentrl_jax.aot --config=...:v5e
--topology=v5e:4x4`, see the README's table):
  :v5e  v5e-16 (16 chips x 16 GiB): full fine-tuning, each 23,040-token row split over 2 chips (context
        parallelism), 8-row micro-batches, 48 rollout rows; LoRA instead: --config.lora.rank=64
        --config.lora.alpha=128 --config.optimizer.learning_rate=1e-5
  :v6e  v6e-16 (16 chips x 32 GiB): LoRA rank 64 and an 8-bit (float8) rollout KV cache, 256 rollout rows (full
        fine-tuning: --config.lora.rank=0 --config.optimizer.learning_rate=1e-6 --config.rollout.batch_size=224)
Smoke (CPU, tiny model, the embedded task): --config=configs/demystify_qwen3_4b.py:smoke

Every recipe constant is in agentrl_jax/rl/recipe.py (clip 0.2/0.28, dual clip 10, token-mean, no KL, entropy
coefficient 0, AdamW 1e-6 constant, 64 x 16 per step, mini-batch 16, max response 20480, overlong 4096/1.0,
16 turns, tool 30 s / 2048 MB, train T=1 top_p=1, validation n=32 T=1 top_p=0.6 with 20 generations logged,
test every 10, save every 30, 3 epochs); tests/test_recipe_constants.py holds each against the line of
recipe/demystify/grpo_tcr_qwen3_4b.sh (or the verl default it leaves in force) it comes from.
"""

from agentrl_jax.rl import recipe


def get_config(arg=None):
  if arg not in (None, "", "smoke", *recipe.SLICE_FAMILIES):
    raise ValueError(f"demystify_qwen3_4b: unknown arg {arg!r}; expected nothing, 'smoke', 'v5e' or 'v6e'")
  config = recipe.rl_config(size="qwen3_4b")
  if arg in recipe.SLICE_FAMILIES:
    recipe.for_slice(config, "qwen3_4b", arg)
  if arg == "smoke":
    recipe.shrink_for_smoke(config)
  config.lock()
  return config
