#!/usr/bin/env bash
# Set up (creates .venv, installs) and run the main job: the whole recipe on the embedded task on the CPU
# (<= 10 minutes on 2 cores). SEED=N changes every seed of the job (default 0); WORKDIR=... changes where it
# writes (default runs/local_demo, runs/local_demo_s<N> for another seed); a rerun resumes.
# Extra arguments are passed to agentrl_jax.main, e.g. --config.rl.total_steps=10
set -euo pipefail
source "$(dirname "$0")/setup.sh" runtime
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"  # a CPU job: JAX never probes for a TPU
seed="${SEED:-0}"
default_workdir=runs/local_demo
[ "$seed" = 0 ] || default_workdir="runs/local_demo_s$seed"
exec python -m agentrl_jax.main --config=configs/default.py --workdir="${WORKDIR:-$default_workdir}" \
  --config.seed="$seed" "$@"
