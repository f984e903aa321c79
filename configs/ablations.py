"""The paper's three findings in miniature (`bash launch/ablations.sh`; agentrl_jax/pipeline/ablations.py).

Run:  python -m agentrl_jax.main --config=configs/ablations.py --workdir=runs/ablations
Arms (each the main job of configs/default.py with one change), for every seed in `seeds`:
  real      the default: real end-to-end teacher trajectories, deliberative teacher, clip 0.2 / 0.28
  stitched  (a) SFT on the stitched synthetic baseline instead, then the same RL
  clip_sym  (b) symmetric clipping 0.2 / 0.2 (reuses `real`'s data, teacher, SFT and filter stages); like the
            main job it makes two passes over each rollout batch, which moves the policy enough per batch for the
            upper bound to bind at all (one pass: ~1e-5 of the tokens)
  frequent  (c) the frequent-calling teacher (a call for every problem and every operation)
Not run by default (--config.arms='("clip_hi_scaled","clip_sym_scaled")', in the same workdir to reuse `real`'s
stages): (b) with both bounds scaled down to what this miniature's policy moves per rollout batch,
  clip_hi_scaled  clip 0.05 / 0.07 (the recipe's 0.2 / 0.28 scaled by 1/4)
  clip_sym_scaled clip 0.05 / 0.05
or (--config.arms='("clip_hi_ep4","clip_sym_ep4")') with the policy moved further per rollout batch: 4 passes
over each batch's mini-batches (16 optimizer steps a batch instead of the main job's 8),
  clip_hi_ep4     clip 0.2 / 0.28, 4 epochs a batch
  clip_sym_ep4    clip 0.2 / 0.2, 4 epochs a batch
or (--config.arms='("lora",)') RL with LoRA adapters (rank 16, alpha 32, every projection; 10x the main job's
learning rate, as LoRA needs) on the same full SFT checkpoint (reuses `real`'s stages up to the filter):
  lora            LoRA RL, compared with `real`'s full-parameter RL
`real` is the main job itself (the same stages as `SEED=N bash launch/local.sh`); the stitched and frequent arms
skip the greedy answers and the RL stage's periodic held-out curve (the clipping arms keep both, to reuse `real`'s
evaluation stages).
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
  # Seeds run side by side, each in a process of its own (its console in WORKDIR/seed<N>.console.txt): one
  # pipeline process keeps 1.65 of 2 cores busy (sandboxes, tokenizer, the Python loop leave gaps), three keep 1.92
  # busy; 1 runs them in turn.
  config.processes = 3
  config.arms = ("real", "stitched", "clip_sym", "frequent")
  config.common_overrides = []
  # The arms that share no stage with `real` skip the greedy answers (the findings compare avg@k) and the RL
  # stage's periodic held-out curve; `real` is the main job itself (`SEED=N bash launch/local.sh` computes the
  # same), and the clipping arms keep its evaluation settings so that they reuse its stages.
  own_stages = [["eval.every_steps", 0], ["eval.greedy", False]]
  config.arm_overrides = ml_collections.ConfigDict(dict(
      real=[], stitched=[["teacher.source", "stitched"], *own_stages], clip_sym=[["rl.loss.clip_high", 0.2]],
      frequent=[["teacher.style", "frequent"], *own_stages],
      clip_hi_scaled=[["rl.loss.clip_low", 0.05], ["rl.loss.clip_high", 0.07]],
      clip_sym_scaled=[["rl.loss.clip_low", 0.05], ["rl.loss.clip_high", 0.05]],
      clip_hi_ep4=[["rl.epochs_per_batch", 4]], clip_sym_ep4=[["rl.epochs_per_batch", 4], ["rl.loss.clip_high", 0.2]],
      lora=[["lora.rank", 16], ["lora.alpha", 32.0], ["optimizer.learning_rate", 1e-3]]))
  if arg == "smoke":
    config.seeds = (0,)
    config.arms = ("real", "clip_sym")
  config.lock()
  return config
