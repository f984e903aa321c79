#!/usr/bin/env bash
# The prepared accelerator benchmark: `python -m agentrl_jax.bench.device` (a random-weight Qwen3-4B-shaped
# model in bf16: the sampler and the RL update step) on a GPU or TPU machine whose image already has JAX for its
# accelerator (a CUDA image with jax + the CUDA plugin, a TPU VM with jax[tpu]). It uses that JAX as it is, puts
# this checkout on PYTHONPATH, and installs our pure-Python dependencies at this project's pins from wheels in
# .whl/ (fetched beforehand on a machine with a package index), so an offline accelerator host needs nothing
# else. Each case prints one JSON line per part; all of them go to $OUT_DIR/device_bench.jsonl, the console
# and third-party logs to $OUT_DIR/device_bench.log.
#
#   bash launch/device_bench.sh --fetch-wheels   # with a package index: .whl/ for Python ${WHEEL_PY:-3.12}
#   bash launch/device_bench.sh                  # on the accelerator host (OUT_DIR=${OUT:-runs/device_bench})
#   bash launch/device_bench.sh --smoke          # tiny shapes in float32 on any backend (the test suite)
#
# Cases (one process each, so one failing or timed-out case does not lose the others' lines):
#   1. the sampler and 2. the update step, with attention "auto" (splash on TPU, the XLA path elsewhere);
#   3. GPU only: the update with cuDNN's flash attention (`--attention cudnn`);
#   3. TPU only: the sampler decoding over the paged cache (`--attention ragged_paged`).
# CASE_TIMEOUT (seconds, default 180) bounds each case, so the three fit a 10-minute call on a lent machine with
# its start; PYTHON picks the interpreter (default python3). Extra arguments go to every case (`--rounds 3`).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
wheels="$root/.whl"
# Pure-Python packages bench.device imports, at the pins of requirements.txt (jax/jaxlib/numpy are the host's).
pins=(flax optax chex ml_collections jaxtyping)

pin_of() { grep -iE "^$1==" requirements.txt | head -1; }

if [ "${1:-}" = "--fetch-wheels" ]; then
  mkdir -p "$wheels"
  specs=(); for p in "${pins[@]}"; do specs+=("$(pin_of "$p")"); done
  fpy="${PYTHON:-}"  # any pip will do: the project's venv where there is one
  [ -n "$fpy" ] || { [ -x .venv/bin/python ] && fpy=.venv/bin/python || fpy=python3; }
  "$fpy" -m pip download -q --no-deps --only-binary=:all: --python-version "${WHEEL_PY:-3.12}" -d "$wheels" \
    "${specs[@]}" || { echo "device_bench: pip could not fetch ${specs[*]}" >&2; exit 1; }
  ls -1 "$wheels"
  exit 0
fi

smoke=0
for a in "$@"; do [ "$a" = "--smoke" ] && smoke=1; done
out_dir="${OUT_DIR:-${OUT:-runs/device_bench}}"
mkdir -p "$out_dir"
jsonl="$out_dir/device_bench.jsonl"
logf="$out_dir/device_bench.log"
: > "$jsonl"

if compgen -G "$wheels/*.whl" >/dev/null; then
  site="$(mktemp -d)"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl \
    >>"$logf" 2>&1 || { echo "device_bench: installing the wheels in .whl/ failed (see $logf)" >&2; exit 1; }
  export PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
fi
# The 4B update holds float32 params, AdamW moments and gradients (~64 GB) next to the activations.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
# A rerun on the same host (after a timed-out case, say) loads the programs the first run compiled; the JSON
# lines count those loads (`compile_cache_hits`), so a cold start and a rerun are told apart.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/agentrl_jax_device_bench_cache}"

# One interpreter start (initialising an accelerator takes seconds): the versions for the log, then the backend.
info="$("$py" -c 'import jax, flax
print("device_bench: jax", jax.__version__, "flax", flax.__version__, jax.devices())
print(jax.default_backend())' 2>>"$logf")" || { echo "device_bench: python cannot import jax (see $logf)" >&2; exit 1; }
echo "${info%$'\n'*}" | tee -a "$logf"
backend="${info##*$'\n'}"

cases=("--parts sampler --attention auto" "--parts update --attention auto")
[ "$smoke" = 1 ] && cases=("--attention auto")  # both parts in one process: the test suite's time
if [ "$smoke" = 0 ] && [ "$backend" = gpu ]; then cases+=("--parts update --attention cudnn"); fi
if [ "$smoke" = 0 ] && [ "$backend" = tpu ]; then cases+=("--parts sampler --attention ragged_paged"); fi

failed=0
for c in "${cases[@]}"; do
  echo "device_bench: case $c $*" | tee -a "$logf"
  # shellcheck disable=SC2086  # a case is several flags
  timeout "${CASE_TIMEOUT:-180}" "$py" -m agentrl_jax.bench.device $c "$@" 2>>"$logf" | tee -a "$jsonl"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    failed=1
    echo "device_bench: case '$c' exited $rc$([ "$rc" = 124 ] && echo ' (timed out)'); last log lines:" >&2
    tail -n 5 "$logf" >&2
  fi
done
echo "device_bench: $(wc -l < "$jsonl") JSON line(s) in $jsonl"
exit "$failed"
