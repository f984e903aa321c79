"""Standalone evaluation with the tool loop: avg@32 / pass@32 / maj@32 on AIME 2024/2025, GPQA-Diamond and
LiveCodeBench v6 (the recipe's eval scripts, recipe/demystify/eval/*.sh: n=32, T=1.0, top_p=0.6, prompts up to
4096 tokens, responses up to 20480, 16 turns, 20 generations logged).

Run (a checkpoint of ours or a HF directory; eval files are local):
  python -m agentrl_jax.main --config=configs/eval_demystify.py --workdir=runs/eval_x \
      --config.model.checkpoint=runs/demystify_qwen3_4b/checkpoints --config.eval_root=/data/eval
  or --config.model.hf_path=/data/DemyAgent-4B
Writes WORKDIR/eval_metrics.json and every rollout to WORKDIR/eval_rollouts.jsonl, and prints the metrics.
Args: :aime2024  only the real AIME 2024 file shipped beside the project (../shared/data), tiny model, n=2
"""

from agentrl_jax.rl import recipe


def get_config(arg=None):
  if arg not in (None, "", "aime2024"):
    raise ValueError(f"eval_demystify: unknown arg {arg!r}; expected nothing or 'aime2024'")
  config = recipe.sampling_job_config("eval")
  config.eval_root = ""  # directory holding the four eval files (names in recipe.eval_sources)
  config.eval.update(n=32, temperature=1.0, top_p=0.6, ks=[1, 8, 16, 32], samples_to_log=20)
  config.rollout.max_prompt_len = 4096  # the eval scripts' max_prompt_length (the RL scripts' is 2560)
  if arg == "aime2024":
    recipe.shrink_for_smoke(config)
    config.rollout.update(max_prompt_len=1024, max_response_len=32, prompt_bucket_min=256)
    config.eval.update(n=2, ks=[1, 2], sources=[dict(name="AIME2024", path=recipe.SHARED_AIME2024,
                                                     schema="aime2024", limit=0)])
  config.lock()
  return config
