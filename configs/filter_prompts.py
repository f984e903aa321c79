"""Model-aware prompt filtering: each prompt's pass rate under the current policy (k samples with the tool loop)
and the prompts whose rate lies in a band, written in the RL parquet schema for the next RL run.

Run:
  python -m agentrl_jax.main --config=configs/filter_prompts.py --workdir=runs/filter_x \
      --config.model.checkpoint=runs/sft_qwen3_4b/checkpoints --config.data.train_path=/data/train.parquet
Then train on WORKDIR/filtered.parquet (--config.data.train_path=...). Every prompt's rate is in
WORKDIR/pass_rates.jsonl, the counts and histogram in filter_summary.json.
The band defaults to (0, 1): drop the prompts the policy always or never solves (no GRPO signal); e.g.
--config.filter.max_pass_rate=0.8 --config.filter.include_max=True keeps 0 < rate <= 0.8.
Args: :smoke  tiny model, the embedded arithmetic task, k=4 (a random tiny model solves nothing: start from an
              SFT run with --config.model.checkpoint=...).
"""

import ml_collections

from agentrl_jax.rl import recipe


def get_config(arg=None):
  if arg not in (None, "", "smoke"):
    raise ValueError(f"filter_prompts: unknown arg {arg!r}; expected nothing or 'smoke'")
  config = recipe.sampling_job_config("filter", smoke=arg == "smoke")
  # The rate RL will see: the training sampling settings (T=1.0, top_p=1.0) and the recipe's n samples.
  config.filter = ml_collections.ConfigDict(dict(
      k=recipe.rl_config().rl.n, temperature=config.rollout.temperature, top_p=config.rollout.top_p, top_k=config.rollout.top_k,
      prompts_per_batch=64, limit=0,
      min_pass_rate=0.0, max_pass_rate=1.0, include_min=False, include_max=False,
      output="filtered.parquet", report="pass_rates.jsonl"))
  if arg == "smoke":
    config.filter.update(k=4, prompts_per_batch=16)
  recipe.drop_training_blocks(config)
  config.lock()
  return config
