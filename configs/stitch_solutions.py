"""The `stitched` SFT baseline (the synthetic data the paper argues against; needed for its ablation): a
fabricated `code_interpreter` call for a computation found in a plain-text solution, its output (RUN in the
sandbox, or the stated value), spliced in before the answer; written in the same SFT schema as real trajectories.

Run (prompt rows whose extra_info holds the solution, or an SFT file of plain solutions):
  python -m agentrl_jax.main --config=configs/stitch_solutions.py --workdir=runs/stitched \
      --config.data.train_path=/data/solutions.parquet --config.data.train_schema=rl
  (--config.data.train_schema=sft: the last assistant message of each conversation is the solution;
   --config.stitch.output_mode=stated: the solution's stated value is the tool output and nothing runs)
Writes WORKDIR/stitched.parquet, stitch_report.jsonl (every row: stitched, or why not) and stitch_summary.json.
Rows with no solution, nothing to compute, or code that fails are skipped and counted.
Args: :smoke     toy arithmetic problems with plain solutions (level-0 rows have nothing to compute)
      :aime2024  the real AIME 2024 solutions shipped beside the project (../shared/data/aime2024.jsonl)
The job is `collect` with `builder = "stitched"` (agentrl_jax/data/stitched.py); no model is loaded.
"""

import ml_collections

from agentrl_jax.rl import recipe

def get_config(arg=None):
  if arg not in (None, "", "smoke", "aime2024"):
    raise ValueError(f"stitch_solutions: unknown arg {arg!r}; expected nothing, 'smoke' or 'aime2024'")
  base = recipe.rl_config()
  config = ml_collections.ConfigDict()
  config.job = "collect"
  config.builder = "stitched"
  config.seed = 0
  config.data = base.data
  config.data.update(train_schema="rl", toy_problems=0)
  config.prompt_style = base.prompt_style
  config.tools = base.tools
  config.stitch = ml_collections.ConfigDict(dict(
      output_mode="run",             # or "stated": the solution's own number is the tool output
      solution_field="solution",     # extra_info key of prompt rows
      bridge="Let me compute this with code.", append_answer=True, advertise_tools=True,
      max_tool_output_chars=base.rollout.max_tool_output_chars, limit=0, output="stitched.parquet"))
  if arg == "smoke":
    config.data.update(toy_problems=16, toy_levels=[0, 1, 2, 3])
    config.tools.update(timeout_s=5.0, memory_mb=512)
  elif arg == "aime2024":
    config.data.update(train_path=recipe.SHARED_AIME2024, train_schema="aime2024")
  config.lock()
  return config
