"""Trajectory collection: REAL end-to-end tool-use trajectories of a policy, written as the recipe's SFT parquet.

Run (a checkpoint of ours or a HF directory; prompts in the RL parquet schema or any eval schema):
  python -m agentrl_jax.main --config=configs/collect_trajectories.py --workdir=runs/collect_x \
      --config.model.hf_path=/data/Qwen3-4B --config.data.train_path=/data/prompts.parquet
  (--config.data.train_schema=aime2024 | aime2025 | gpqa_diamond | livecodebench_v6 for an eval file)
Writes WORKDIR/trajectories.parquet (SFT schema: feed it to configs/sft_*.py as --config.data.path=...), the
same rows to trajectories.jsonl batch by batch, collect_report.jsonl (every episode's decision) and
collect_summary.json. The filters (agentrl_jax/data/collect.py) are the `collect` block.
Args: :smoke  the same at CPU size: a tiny model on the embedded arithmetic task with the real sandbox. A random
              tiny model keeps nothing: give it a tiny SFT run with --config.model.checkpoint=<sft workdir>/checkpoints
              (tests/data/test_collect_filter_cli_slow.py runs that chain on the scripted teacher's conversations).
The synthetic `stitched` baseline is configs/stitch_solutions.py (same job, `builder = "stitched"`).
"""

import ml_collections

from agentrl_jax.rl import recipe


def get_config(arg=None):
  if arg not in (None, "", "smoke"):
    raise ValueError(f"collect_trajectories: unknown arg {arg!r}; expected nothing or 'smoke'")
  config = recipe.sampling_job_config("collect", smoke=arg == "smoke")
  config.builder = "rollout"
  # Sampling as in RL training (T=1.0, top_p=1.0); the recipe's rollout limits (16 turns, 20480 tokens).
  config.collect = ml_collections.ConfigDict(dict(
      n=8, temperature=1.0, top_p=1.0, top_k=0, prompts_per_batch=64, limit=0,
      min_tool_calls=1,              # trajectories must use the tool at least once
      max_per_prompt=2,              # 0 = keep every good trajectory
      dedup_threshold=0.8, dedup_ngram=4,   # word 4-gram Jaccard within a prompt; 0 disables
      output="trajectories.parquet"))
  if arg == "smoke":
    config.collect.update(n=4, prompts_per_batch=16)
  recipe.drop_training_blocks(config)
  config.lock()
  return config
