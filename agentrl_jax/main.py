"""Entry point: `python -m agentrl_jax.main --config=configs/<x>.py[:arg] --workdir=DIR [--config.a.b=value]`.

The config's `job` field names what to run; each job is one function `run(config, workdir)` in its package.
"""

import importlib
import logging
import os

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and samples.")

# job name -> module whose `run(config, workdir)` executes it
JOBS = {
    "pipeline": "agentrl_jax.pipeline.job",
    "ablations": "agentrl_jax.pipeline.ablations",
    "sft": "agentrl_jax.sft.trainer",
    "rl": "agentrl_jax.rl.trainer",
    "eval": "agentrl_jax.evaluation.runner",
    "collect": "agentrl_jax.data.collect",
    "filter": "agentrl_jax.rl.filter_prompts",
}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/default.py")
  workdir = _WORKDIR.value
  if not workdir:
    raise app.UsageError("--workdir is required")
  job = config.get("job")
  if job not in JOBS:
    raise app.UsageError(f"config.job={job!r} is not one of {sorted(JOBS)}")
  if os.environ.get("AGENTRL_DISTRIBUTED") == "1":  # multi-host TPU slices (launch/tpu_vm.sh sets it)
    import jax

    jax.distributed.initialize()
  if "://" not in workdir:
    os.makedirs(workdir, exist_ok=True)
  logging.getLogger().setLevel(logging.INFO)
  importlib.import_module(JOBS[job]).run(config, workdir)


if __name__ == "__main__":
  app.run(main)
