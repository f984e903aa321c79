#!/usr/bin/env bash
# Set up (creates .venv, installs) and run the main job: the whole recipe on the embedded task (CPU is fine;
# ~10 minutes on 2 cores). WORKDIR=... changes where it writes (default runs/local_demo); a rerun resumes.
# Extra arguments are passed to agentrl_jax.main, e.g. --config.rl.total_steps=10
set -euo pipefail
source "$(dirname "$0")/setup.sh" runtime
workdir="${WORKDIR:-runs/local_demo}"
exec python -m agentrl_jax.main --config=configs/default.py --workdir="$workdir" "$@"
