"""Entry point: `python -m agentrl_jax.main --config=configs/<x>.py[:arg] --workdir=DIR [--config.a.b=value]`.

The config's `job` field names what to run; each job is one function `run(config, workdir)` in its package.
A config's `jax_platforms` (e.g. "cpu" for the CPU jobs) selects JAX's backends unless `JAX_PLATFORMS` is set,
so a CPU job never probes for an accelerator.
"""

import importlib
import logging
import os

from agentrl_jax.pipeline import console

console.capture_import_noise()  # before the config files import transformers: its notices go to the job's log

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from agentrl_jax import compile_stats  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and samples.")
# One JAX process per host (multi-controller); the flags win over JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
# JAX_PROCESS_ID. AGENTRL_DISTRIBUTED=1 (launch/tpu_vm.sh) lets JAX find them itself on a TPU slice.
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for several processes.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "JAX processes of the run (one per host).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")

# job name -> module whose `run(config, workdir)` executes it
JOBS = {
    "pipeline": "agentrl_jax.pipeline.job",
    "ablations": "agentrl_jax.pipeline.ablations",
    "sft": "agentrl_jax.sft.trainer",
    "rl": "agentrl_jax.rl.trainer",
    "eval": "agentrl_jax.evaluation.runner",
    "eval_embedded": "agentrl_jax.pipeline.fresh_eval",
    "collect": "agentrl_jax.data.collect",
    "filter": "agentrl_jax.rl.filter_prompts",
}


def distributed_args(coordinator, num_processes, process_id, env) -> dict | None:
  """`jax.distributed.initialize` arguments from the flags or the environment; None for a single process."""
  coordinator = coordinator or env.get("JAX_COORDINATOR_ADDRESS")
  num_processes = num_processes if num_processes is not None else int(env.get("JAX_NUM_PROCESSES", 1))
  process_id = process_id if process_id is not None else int(env.get("JAX_PROCESS_ID", 0))
  if env.get("AGENTRL_DISTRIBUTED") == "1" and not coordinator:
    return {}  # a TPU slice: JAX reads the topology from the TPU metadata
  if num_processes <= 1:
    return None
  if not coordinator or not 0 <= process_id < num_processes:
    raise app.UsageError(f"{num_processes} processes need --coordinator_address and a --process_id in "
                         f"[0, {num_processes}), got {coordinator!r} and {process_id}")
  return {"coordinator_address": coordinator, "num_processes": num_processes, "process_id": process_id}


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
  import jax  # no backend has started yet: that happens at the first device query

  if config.get("jax_platforms") and not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", config.jax_platforms)
  distributed = distributed_args(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, os.environ)
  if distributed is not None:
    jax.distributed.initialize(**distributed)
  if "://" not in workdir:
    os.makedirs(workdir, exist_ok=True)
  logging.getLogger().setLevel(logging.INFO)
  if job not in ("pipeline", "ablations", "eval_embedded") and "://" not in workdir:  # those set up their own console
    # The console keeps the project's lines; third-party INFO (Orbax, absl, TFDS) goes to <workdir>/<job>.log.
    name = f"{job}.log" if jax.process_index() == 0 else f"{job}.process_{jax.process_index()}.log"
    console.setup_logging(os.path.join(workdir, name), console_level=logging.INFO)
    # Jobs reuse compiled programs across restarts and reruns: the config's cache, else JAX_COMPILATION_CACHE_DIR,
    # else <workdir>/jax_cache.
    compile_stats.enable_compilation_cache(config.get("compile_cache_dir") or os.environ.get(
        "JAX_COMPILATION_CACHE_DIR") or os.path.join(workdir, "jax_cache"))
  with compile_stats.measured() as m:
    importlib.import_module(JOBS[job]).run(config, workdir)
  c = m["compile"]
  logging.getLogger("agentrl_jax.main").info(
      "job %s: %.1f s, of which compiling %.1f s (%d programs, %d from the persistent cache)", job, m["wall_s"],
      c.compile_s, c.programs, c.cache_hits)


if __name__ == "__main__":
  app.run(main)
