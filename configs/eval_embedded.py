"""Fresh problems for any checkpoint: the way to check the main job's claim on problems no stage has seen.

Run:  python -m agentrl_jax.main --config=configs/eval_embedded.py --workdir=runs/fresh_local_demo \
          --config.run=runs/local_demo --config.seed=1234 --config.problems=1024
Draws `problems` new problems of the embedded arithmetic family with `seed` and `level_weights`, leaves out
every problem (by canonical form: any operand order or rendering) of the run's data splits and of `exclude`
(comma-separated run directories or split files), evaluates the run's SFT and RL checkpoints on them exactly
as the main job's evaluation stages do (4 samples at T=1 and one greedy answer per problem), and prints the
before/after table with paired 95% bootstrap intervals over problems (agentrl_jax/pipeline/fresh_eval.py).
`before` / `after` name other policies: one of our checkpoint directories or a HF directory (config.json +
safetensors + tokenizer), e.g. --config.after=exported/ --config.after_label=HF; with one policy the table
shows its values with their intervals.
Args: :smoke  a few problems, one sample (tests)
"""

import importlib.util
import os

import ml_collections


def _default():
  spec = importlib.util.spec_from_file_location("configs_default", os.path.join(os.path.dirname(__file__),
                                                                                "default.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config(arg=None):
  if arg not in (None, "", "smoke"):
    raise ValueError(f"eval_embedded: unknown arg {arg!r}; expected nothing or 'smoke'")
  main_job = _default()
  config = ml_collections.ConfigDict()
  config.job = "eval_embedded"
  config.seed = 1234                 # draws the fresh problems and the samples
  config.jax_platforms = "cpu"
  config.problems = 1024
  config.level_weights = main_job.task.level_weights
  config.run = ""                    # a main-job workdir: its SFT and RL checkpoints, its splits excluded
  config.exclude = ""                # more runs or split files to exclude, comma-separated
  config.before, config.before_label = "", "SFT"   # default <run>/sft/checkpoints
  config.after, config.after_label = "", "RL"      # default <run>/rl/checkpoints
  config.data_dir = ""
  config.compile_cache_dir = ""
  # The main job's policy, sampling, tool and reward settings: the same evaluation as its eval stages.
  config.tokenizer = main_job.tokenizer
  for block in ("model", "mesh", "rollout", "tools", "reward", "prompt_style", "eval"):
    config[block] = ml_collections.ConfigDict(main_job[block].to_dict())
  if arg == "smoke":
    config.problems = 6
    config.eval.update(n=2, ks=[2])
    config.rollout.update(batch_size=16, max_response_len=48, cache_bucket_min=96, max_turns=3)
  config.lock()
  return config
