#!/usr/bin/env bash
# The Slurm job step of a cell: runs on the allocated node (inside the container under pyxis), puts the
# job's GPUs into the env the vendor's runtime reads, then runs the cell script directly (runtime none,
# pyxis) or in a docker container named for this cell (docker). Its exit status is the cell's.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=runners/lib/common.sh
source "$here/common.sh"
# shellcheck source=runners/lib/slurm.sh
source "$here/slurm.sh"
# shellcheck source=runners/lib/container.sh
source "$here/container.sh"
AS_LOG_PREFIX="step[${AS_RUNNER:-?}]"

# Slurm sets CUDA_VISIBLE_DEVICES for a gpu GRES (and, without knowing the vendor, ROCR_VISIBLE_DEVICES
# and ZE_AFFINITY_MASK too). Keep only the variable the vendor's runtime reads. ROCm filters devices
# with ROCR_VISIBLE_DEVICES and then applies CUDA/HIP_VISIBLE_DEVICES again on top of what is left, so
# on AMD the job's list lives in ROCR_VISIBLE_DEVICES alone (a second filter can hide every GPU).
unset ZE_AFFINITY_MASK
if [[ ${AS_VENDOR:-} == amd ]]; then
  if [[ -z ${ROCR_VISIBLE_DEVICES:-} && -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    export ROCR_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES
  fi
  unset CUDA_VISIBLE_DEVICES HIP_VISIBLE_DEVICES GPU_DEVICE_ORDINAL
else
  unset ROCR_VISIBLE_DEVICES
fi
as_log "node ${SLURMD_NODENAME:-$(hostname)} job ${SLURM_JOB_ID:-?}:" \
  "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} ROCR_VISIBLE_DEVICES=${ROCR_VISIBLE_DEVICES:-}"

# Relative cell paths (TRACES) mean the repository, in every runtime.
cd "$AS_REPO"

run_cell_here() {
  if [[ -x $AS_CELL_SCRIPT ]]; then
    exec "$AS_CELL_SCRIPT"
  fi
  exec bash "$AS_CELL_SCRIPT"
}

case ${AS_CONTAINER_RUNTIME:-none} in
none | pyxis)
  run_cell_here
  ;;
docker)
  : "${AS_IMAGE:?cell IMAGE is empty}"
  name=$(as_container_name)
  # The container gets the cell's env by name, without the host's PATH/HOME/venv.
  env_names=()
  IFS=, read -r -a exported <<<"$(as_export_list)"
  for n in "${exported[@]}" ROCR_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES; do
    case $n in PATH | HOME | USER | LANG | LC_ALL | TMPDIR | VIRTUAL_ENV | PYTHONPATH) continue ;; esac
    [[ -n ${!n+set} ]] && env_names+=("$n")
  done
  as_docker_args "$name" "${env_names[@]}"
  # shellcheck disable=SC2329 # called from the traps below
  stop_container() {
    as_log "stopping container $name"
    docker stop --time "${AGENTSWEEP_DOCKER_STOP_S:-30}" "$name" >/dev/null 2>&1 || true
    docker rm --force "$name" >/dev/null 2>&1 || true
  }
  trap 'stop_container; exit 143' TERM
  trap 'stop_container; exit 130' INT
  as_log "docker run --name $name $AS_IMAGE"
  docker run "${AS_DOCKER_ARGS[@]}" "$AS_IMAGE" bash "$AS_CELL_SCRIPT" &
  status=0
  wait "$!" || status=$?
  trap - TERM INT
  exit "$status"
  ;;
*)
  as_die 2 "unknown container runtime '${AS_CONTAINER_RUNTIME}'"
  ;;
esac
