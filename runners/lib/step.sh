#!/usr/bin/env bash
# The Slurm job step of a cell: runs on the allocated node (inside the container under pyxis), puts the
# job's GPUs into the env the vendor's runtime reads, then runs the cell script directly (runtime none,
# pyxis) or in a docker container named for this cell (docker). A cell that runs on the host side of its
# node (AS_CELL_ON_HOST=1: routed or multi-node, its engine instances in containers of their own) runs
# directly too; under docker this step then removes whatever container of the job's instances is left
# on the job's nodes when the cell ends. Its exit status is the cell's.
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

# The cell on the host under docker: its instances' containers go when it ends, on every node.
run_cell_on_host_docker() {
  local status=0 job=${SLURM_JOB_ID:-}
  # shellcheck disable=SC2329 # called from the traps below
  forward() { [[ -n ${cell_pid:-} ]] && kill -s "$1" "$cell_pid" 2>/dev/null; }
  trap 'forward TERM' TERM
  trap 'forward INT' INT
  bash "$AS_CELL_SCRIPT" &
  cell_pid=$!
  while kill -0 "$cell_pid" 2>/dev/null; do
    wait "$cell_pid" || true
  done
  wait "$cell_pid" || status=$?
  trap - TERM INT
  if [[ -n $job ]]; then
    as_log "removing the job's engine containers left on its nodes"
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 120 srun --jobid="$job" --overlap --nodes="${AS_NODES:-1}" --ntasks-per-node=1 --export=ALL \
      bash -c 'source "$1/common.sh" && source "$1/container.sh" && as_remove_job_containers "$2"' \
      cleanup "$here" "$job" >/dev/null 2>&1 || as_remove_job_containers "$job"
  fi
  exit "$status"
}

case ${AS_CONTAINER_RUNTIME:-none} in
none | pyxis)
  run_cell_here
  ;;
docker)
  : "${AS_IMAGE:?cell IMAGE is empty}"
  # What the cell compares with its pin (agentsweep.images.local): the digests of this node's copy.
  AGENTSWEEP_IMAGE_DIGEST=$(as_docker_digests "$AS_IMAGE")
  export AGENTSWEEP_IMAGE_DIGEST
  if [[ ${AS_CELL_ON_HOST:-0} == 1 ]]; then
    run_cell_on_host_docker
  fi
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
    as_remove_containers "$name"
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
