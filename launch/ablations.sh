#!/usr/bin/env bash
# Set up (as launch/local.sh) and run the paper's three findings in miniature: arms of the main job that differ in
# one choice (real vs stitched SFT data, clip-higher vs symmetric clipping, deliberative vs frequent tool use),
# with several seeds; writes runs/ablations/ablations.md, ablations.json and plots (WORKDIR=... to change).
# A rerun resumes finished arms. Extra arguments go to agentrl_jax.main, e.g. --config.seeds='(0,)'.
set -euo pipefail
source "$(dirname "$0")/setup.sh" runtime
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"  # a CPU job: JAX never probes for a TPU
workdir="${WORKDIR:-runs/ablations}"
exec python -m agentrl_jax.main --config=configs/ablations.py --workdir="$workdir" "$@"
