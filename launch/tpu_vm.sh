#!/usr/bin/env bash
# Run agentrl_jax on a Cloud TPU VM or pod slice (every host runs the same command; JAX's multi-controller
# runtime joins them: main.py calls jax.distributed.initialize() when AGENTRL_DISTRIBUTED=1).
#
#   export TPU_NAME=my-tpu ZONE=us-central2-b ACCELERATOR=v4-32 [PROJECT=my-project] [RUNTIME=tpu-ubuntu2204-base]
#   bash launch/tpu_vm.sh create                       # create the TPU VM (slice)
#   bash launch/tpu_vm.sh setup                        # copy this checkout to every host, install, jax[tpu]
#   bash launch/tpu_vm.sh run configs/demystify_qwen3_4b.py gs://bucket/runs/x [--config.a.b=value ...]
#   bash launch/tpu_vm.sh ssh 'tail -f ~/agentrl_jax/run.log'   # any command on all hosts
#   bash launch/tpu_vm.sh delete
#
# Checkpoints and datasets should live on storage every host sees (a GCS bucket or a shared disk); model
# weights load from a local or mounted directory given in the config (nothing downloads from a model hub).
set -euo pipefail
cmd="${1:?usage: tpu_vm.sh create|setup|run|ssh|delete ...}"; shift || true
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
gc=(gcloud compute tpus tpu-vm)
proj=(); [ -n "${PROJECT:-}" ] && proj=(--project "$PROJECT")
remote_dir="agentrl_jax"
on_all() { "${gc[@]}" ssh "$TPU_NAME" --zone "$ZONE" "${proj[@]}" --worker=all --command "$1"; }

case "$cmd" in
  create)
    "${gc[@]}" create "$TPU_NAME" --zone "$ZONE" "${proj[@]}" --accelerator-type "${ACCELERATOR:?set ACCELERATOR}" \
      --version "${RUNTIME:-tpu-ubuntu2204-base}" ;;
  setup)
    root="$(cd "$(dirname "$0")/.." && pwd)"
    tarball="$(mktemp -d)/agentrl_jax.tgz"
    git -C "$root" archive --format=tar.gz -o "$tarball" HEAD
    "${gc[@]}" scp "$tarball" "$TPU_NAME:~/agentrl_jax.tgz" --zone "$ZONE" "${proj[@]}" --worker=all
    jax_version="$(grep -E '^jax==' "$root/requirements.txt" | cut -d= -f3)"
    on_all "set -e; mkdir -p ~/$remote_dir && tar -xzf ~/agentrl_jax.tgz -C ~/$remote_dir && cd ~/$remote_dir && \
      (command -v python3.11 >/dev/null || (sudo apt-get update -q && sudo apt-get install -y -q python3.11 python3.11-venv)) && \
      (command -v bwrap >/dev/null || sudo apt-get install -y -q bubblewrap) && \
      bash -c 'source launch/setup.sh runtime' && .venv/bin/pip install -q 'jax[tpu]==$jax_version'" ;;
  run)
    config="${1:?usage: tpu_vm.sh run CONFIG WORKDIR [overrides]}"; workdir="${2:?workdir}"; shift 2
    on_all "cd ~/$remote_dir && AGENTRL_DISTRIBUTED=1 nohup .venv/bin/python -m agentrl_jax.main \
      --config=$config --workdir=$workdir $* > run.log 2>&1 &" ;;
  ssh)
    on_all "${1:?command}" ;;
  delete)
    "${gc[@]}" delete "$TPU_NAME" --zone "$ZONE" "${proj[@]}" --quiet ;;
  *)
    echo "unknown command $cmd" >&2; exit 2 ;;
esac
