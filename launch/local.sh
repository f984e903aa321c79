#!/usr/bin/env bash
# Set up (creates .venv, installs) and run the main job on the embedded default config (CPU is fine).
# Extra arguments are passed to agentrl_jax.main, e.g. --config.rl.steps=5
set -euo pipefail
source "$(dirname "$0")/setup.sh" runtime
workdir="${WORKDIR:-runs/local}"
exec python -m agentrl_jax.main --config=configs/default.py --workdir="$workdir" "$@"
