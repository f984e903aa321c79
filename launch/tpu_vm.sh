#!/usr/bin/env bash
# Run agentrl_jax on a Cloud TPU VM or pod slice. Every host runs the same command; JAX's multi-controller
# runtime joins them (main.py calls jax.distributed.initialize() when AGENTRL_DISTRIBUTED=1).
#
#   export TPU_NAME=my-tpu ZONE=us-central2-b ACCELERATOR=v4-32 [PROJECT=my-project] [RUNTIME=tpu-ubuntu2204-base]
#   bash launch/tpu_vm.sh create                       # create the TPU VM (slice)
#   bash launch/tpu_vm.sh setup                        # copy this checkout to every host, install, jax[tpu]
#   bash launch/tpu_vm.sh preflight configs/demystify_qwen3_4b.py [--config.a.b=value ...]  # needs TOPOLOGY
#   bash launch/tpu_vm.sh run configs/demystify_qwen3_4b.py gs://bucket/runs/x [--config.a.b=value ...]
#   bash launch/tpu_vm.sh run configs/demystify_qwen3_4b.py:v5e gs://bucket/runs/x   # the layout for a v5e-16
#   bash launch/tpu_vm.sh logs [LINES]                 # the last lines of every host's run.log
#   bash launch/tpu_vm.sh copy LOCAL_PATH [REMOTE_DIR] # copy a file or directory to every host
#   bash launch/tpu_vm.sh ssh 'nvidia-smi || true'     # any command on all hosts
#   bash launch/tpu_vm.sh delete
#
# --dry-run (first argument) prints every command instead of running it, with placeholders for unset
# variables; it needs neither gcloud nor a TPU. PASS_ENV="WANDB_API_KEY XLA_FLAGS ..." names environment variables
# whose values `run` passes to every host (AGENTRL_* and JAX_* variables are always passed).
# preflight compiles every program of the config for TOPOLOGY (e.g. TOPOLOGY=v5p:2x2x2 for a v5p-16) with the
# real TPU compiler on this machine (no TPU, no gcloud: `python -m agentrl_jax.aot`, libtpu from the test
# requirements) and fails when a program does not fit; with TOPOLOGY set, `run` runs it first and starts nothing
# on the slice when it fails. A config argument naming a slice family (`:v5e`, `:v6e`: the layout, LoRA and KV
# cache the recipe needs on that generation's 16-chip slice, rl/recipe.py SLICE_LAYOUTS) sets TOPOLOGY to that
# slice (v5e:4x4, v6e:4x4) unless it is set, so such a run is always checked first.
# Checkpoints and datasets should live on storage every host sees (a GCS bucket or a shared disk); model
# weights load from a local or mounted directory given in the config (nothing downloads from a model hub).
set -euo pipefail
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
cmd="${1:?usage: tpu_vm.sh [--dry-run] create|setup|preflight|run|logs|copy|ssh|delete ...}"; shift || true

need() {  # need VAR: its value, or a placeholder in a dry run
  local name="$1"
  if [ -n "${!name:-}" ]; then printf '%s' "${!name}"
  elif [ "$dry" = 1 ]; then printf '<%s>' "$name"
  else echo "tpu_vm.sh: set $name (see the header of launch/tpu_vm.sh)" >&2; exit 2
  fi
}
if [ "$cmd" != preflight ]; then name="$(need TPU_NAME)"; zone="$(need ZONE)"; fi
if [ "$cmd" = preflight ] || [ "$cmd" = run ]; then
  case "${1:-}" in  # the slice a config's family argument lays the recipe out for
    *:v5e) TOPOLOGY="${TOPOLOGY:-v5e:4x4}" ;;
    *:v6e) TOPOLOGY="${TOPOLOGY:-v6e:4x4}" ;;
  esac
fi
gc=(gcloud compute tpus tpu-vm)
proj=(); [ -n "${PROJECT:-}" ] && proj=(--project "$PROJECT")
remote_dir="agentrl_jax"

quote() {  # a word as a shell would need it: bare when safe, else in single quotes
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,~-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
run() {  # run CMD...: execute, or print it (quoted for a shell) in a dry run
  if [ "$dry" = 1 ]; then
    local out=() w
    for w in "$@"; do out+=("$(quote "$w")"); done
    echo "${out[*]}"
  else
    "$@"
  fi
}
preflight() {  # preflight CONFIG [overrides]: the ahead-of-time check on this machine
  local root py
  root="$(cd "$(dirname "$0")/.." && pwd)"
  py="$root/.venv/bin/python"; [ -x "$py" ] || py=python3
  run env JAX_PLATFORMS=cpu "$py" -m agentrl_jax.aot "--config=$1" "--topology=$(need TOPOLOGY)" "${@:2}"
}
on_all() { run "${gc[@]}" ssh "$name" --zone "$zone" "${proj[@]}" --worker=all --command "$1"; }

passed_env() {  # KEY=value words for the variables `run` passes to every host
  local out=() var
  for var in $(compgen -e | grep -E '^(AGENTRL_|JAX_)' || true) ${PASS_ENV:-}; do
    [ -n "${!var+x}" ] && out+=("$var=$(printf '%q' "${!var}")")
  done
  echo "${out[*]:-}"
}

case "$cmd" in
  create)
    run "${gc[@]}" create "$name" --zone "$zone" "${proj[@]}" --accelerator-type "$(need ACCELERATOR)" \
      --version "${RUNTIME:-tpu-ubuntu2204-base}" ;;
  setup)
    root="$(cd "$(dirname "$0")/.." && pwd)"
    tarball="${TMPDIR:-/tmp}/agentrl_jax-$$.tgz"
    run git -C "$root" archive --format=tar.gz -o "$tarball" HEAD
    run "${gc[@]}" scp "$tarball" "$name:~/agentrl_jax.tgz" --zone "$zone" "${proj[@]}" --worker=all
    jax_version="$(grep -E '^jax==' "$root/requirements.txt" | cut -d= -f3)"
    on_all "set -e; mkdir -p ~/$remote_dir && tar -xzf ~/agentrl_jax.tgz -C ~/$remote_dir && cd ~/$remote_dir && \
(command -v python3.11 >/dev/null || (sudo apt-get update -q && sudo apt-get install -y -q python3.11 python3.11-venv)) && \
(command -v bwrap >/dev/null || sudo apt-get install -y -q bubblewrap) && \
bash -c 'source launch/setup.sh runtime' && .venv/bin/pip install -q 'jax[tpu]==$jax_version'" ;;
  run)
    config="${1:?usage: tpu_vm.sh run CONFIG WORKDIR [overrides]}"; workdir="${2:?workdir}"; shift 2
    if [ -n "${TOPOLOGY:-}" ]; then preflight "$config" "$@"; fi
    on_all "cd ~/$remote_dir && env $(passed_env) AGENTRL_DISTRIBUTED=1 nohup .venv/bin/python -m agentrl_jax.main \
--config=$config --workdir=$workdir $* > run.log 2>&1 &" ;;
  preflight)
    preflight "${1:?usage: tpu_vm.sh preflight CONFIG [overrides]}" "${@:2}" ;;
  logs)
    on_all "tail -n ${1:-50} ~/$remote_dir/run.log" ;;
  copy)
    src="${1:?usage: tpu_vm.sh copy LOCAL_PATH [REMOTE_DIR]}"; dst="${2:-$remote_dir}"
    run "${gc[@]}" scp --recurse "$src" "$name:~/$dst/" --zone "$zone" "${proj[@]}" --worker=all ;;
  ssh)
    on_all "${1:?command}" ;;
  delete)
    run "${gc[@]}" delete "$name" --zone "$zone" "${proj[@]}" --quiet ;;
  *)
    echo "tpu_vm.sh: unknown command $cmd" >&2; exit 2 ;;
esac
