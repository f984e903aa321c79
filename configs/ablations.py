"""The paper's three findings in miniature (`bash launch/ablations.sh`; agentrl_jax/pipeline/ablations.py).

Run:  python -m agentrl_jax.main --config=configs/ablations.py --workdir=runs/ablations
Arms (each the main job of configs/default.py with one change), for every seed in `seeds`:
  real      the default: real end-to-end teacher trajectories, deliberative teacher, clip 0.2 / 0.28
  stitched  (a) SFT on the stitched synthetic baseline instead, then the same RL
  clip_sym  (b) symmetric clipping 0.2 / 0.2 (reuses `real`'s data, teacher, SFT and filter stages)
  frequent  (c) the frequent-calling teacher (a call for every problem and every operation)
Writes WORKDIR/ablations.md, ablations.json and plots; a rerun resumes finished arms and stages.
Args: :smoke  two arms at the pipeline's smoke size, one seed (tests)
"""

import ml_collections


def _pipeline(arg):
  import importlib.util
  import os

  spec = importlib.util.spec_from_file_location("configs_default", os.path.join(os.path.dirname(__file__),
                                                                                "default.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def get_config(arg=None):
  if arg not in (None, "", "smoke"):
    raise ValueError(f"ablations: unknown arg {arg!r}; expected nothing or 'smoke'")
  config = ml_collections.ConfigDict()
  config.job = "ablations"
  config.pipeline = _pipeline("smoke" if arg == "smoke" else None)
  config.seeds = (0, 1, 2)  # --config.seeds="(0,)" for one
  config.arms = ["real", "stitched", "clip_sym", "frequent"]
  config.arm_overrides = ml_collections.ConfigDict(dict(
      real=[], stitched=[["teacher.source", "stitched"]], clip_sym=[["rl.loss.clip_high", 0.2]],
      frequent=[["teacher.style", "frequent"]]))
  if arg == "smoke":
    config.seeds = (0,)
    config.arms = ["real", "clip_sym"]
  config.lock()
  return config
