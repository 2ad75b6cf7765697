# shellcheck shell=bash
# Container side of the launchers: pyxis/enroot (NVIDIA), docker (ROCm), or none. Sourced by launch.sh
# on the launching host and by step.sh on the allocated node.

# as_enroot_uri IMAGE: enroot's docker:// form ("registry#repo:tag" when IMAGE names a registry host).
as_enroot_uri() {
  local image=$1 first=${1%%/*}
  if [[ $image == */* && ($first == *.* || $first == *:* || $first == localhost) ]]; then
    printf 'docker://%s#%s' "$first" "${image#*/}"
  else
    printf 'docker://%s' "$image"
  fi
}

# as_squash_path IMAGE: where the image's squash file lives (a shared directory, one file per image).
as_squash_path() {
  local dir=${AGENTSWEEP_SQUASH_DIR:-${HOME:-/tmp}/.cache/agentsweep/squash}
  printf '%s/%s.sqsh' "$dir" "$(printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_')"
}

# as_import_squash IMAGE SQSH [DIGEST]: import IMAGE into SQSH once. Concurrent cells wait on a lock
# beside the file; the one holding it imports into a temporary name and renames, so no cell sees half a
# file. DIGEST, the tag's manifest digest resolved just before, goes beside it as SQSH.digest (enroot
# keeps no digest of its own): what the cell later compares with its pin.
as_import_squash() {
  local image=$1 sqsh=$2 digest=${3:-} tmp
  mkdir -p "$(dirname "$sqsh")"
  (
    flock -w "${AGENTSWEEP_IMPORT_WAIT_S:-3600}" 9 || {
      echo "import: timed out waiting for the lock on $sqsh" >&2
      exit 1
    }
    if [[ -s $sqsh ]]; then
      echo "import: $sqsh already there" >&2
      exit 0
    fi
    tmp="$sqsh.partial.$$"
    rm -f "$tmp"
    echo "import: $image -> $sqsh" >&2
    if ! enroot import --output "$tmp" "$(as_enroot_uri "$image")"; then
      rm -f "$tmp"
      exit 1
    fi
    if [[ -n $digest ]]; then
      printf '%s\n' "$digest" >"$sqsh.digest.tmp" && mv -f "$sqsh.digest.tmp" "$sqsh.digest"
    else
      rm -f "$sqsh.digest"
    fi
    mv -f "$tmp" "$sqsh"
  ) 9>"$sqsh.lock"
}

# as_docker_digests IMAGE: the manifest digests the docker image store knows IMAGE by (its RepoDigests),
# space separated, pulling it first when the store lacks it; nothing when it has none (built or imported
# locally) or cannot get it.
as_docker_digests() {
  local image=$1 word out
  local -a digests=()
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    docker pull --quiet "$image" >/dev/null 2>&1 || return 0
  fi
  out=$(docker image inspect --format '{{range .RepoDigests}}{{.}} {{end}}' "$image" 2>/dev/null) || return 0
  for word in $out; do
    [[ ${word##*@} =~ ^sha256:[0-9a-f]{64}$ ]] && digests+=("${word##*@}")
  done
  printf '%s' "${digests[*]}"
}

# as_mount_paths: fill AS_MOUNT_PATHS with the host paths the cell needs inside a container, each
# mounted at the same path: the workspace, the result dir, the HF cache, the cell script's dir, a
# local trace path, and the accuracy gate's harness (AGENTSWEEP_LMEVAL_VENV, a virtualenv built with
# the image's own Python: docs/accuracy.md) (an array, not lines: a path may hold a newline, which
# as_check_mount_path refuses).
as_mount_paths() {
  local -a paths=("$AS_REPO" "$RESULT_DIR")
  local path seen
  [[ -n ${AS_HF_CACHE:-} ]] && paths+=("$AS_HF_CACHE")
  if [[ ${AGENTSWEEP_LMEVAL_VENV:-} == /* && -d ${AGENTSWEEP_LMEVAL_VENV} ]]; then
    paths+=("$AGENTSWEEP_LMEVAL_VENV")
  fi
  [[ $AS_CELL_SCRIPT != "$AS_REPO"/* ]] && paths+=("$(dirname "$AS_CELL_SCRIPT")")
  if [[ ${AS_TRACES:-} == /* && ${AS_TRACES} != "$AS_REPO"/* && -e ${AS_TRACES} ]]; then
    if [[ -d $AS_TRACES ]]; then paths+=("$AS_TRACES"); else paths+=("$(dirname "$AS_TRACES")"); fi
  fi
  AS_MOUNT_PATHS=()
  for path in "${paths[@]}"; do
    for seen in "${AS_MOUNT_PATHS[@]}"; do [[ $seen == "$path" ]] && continue 2; done
    AS_MOUNT_PATHS+=("$path")
  done
}

# as_check_mount_path PATH: refuse (exit 2) a path that cannot be mounted as it is: pyxis splits
# --container-mounts at commas and each mount at colons (docker --volume at colons), so such a path
# would mount something else, or more; a newline or other control character has no place in a mount.
as_check_mount_path() {
  case $1 in
  *,* | *:*)
    as_die 2 "cannot mount '$1' into the container: the path contains a comma or colon (rename it)"
    ;;
  *[[:cntrl:]]*)
    as_die 2 "cannot mount '${1//[[:cntrl:]]/?}' into the container: the path contains a newline or another control character (rename it)"
    ;;
  esac
}

# as_pyxis_args SQSH: fill AS_CONTAINER_ARGS with the srun flags pyxis needs.
as_pyxis_args() {
  local -a mounts=()
  local path
  as_mount_paths
  for path in "${AS_MOUNT_PATHS[@]}"; do
    as_check_mount_path "$path"
    mounts+=("$path:$path")
  done
  # shellcheck disable=SC2034 # read by launch.sh
  AS_CONTAINER_ARGS=(
    "--container-image=$1"
    "--container-mounts=$(as_join , "${mounts[@]}")"
    "--container-workdir=$AS_REPO"
    --no-container-mount-home
  )
}

# as_container_name: this cell's docker container name (unique per cell and job).
as_container_name() {
  local name="agentsweep-${AS_EXP_NAME:-cell}-${SLURM_JOB_ID:-${AS_JOB_ID:-0}}"
  printf '%s' "${name//[^A-Za-z0-9_.-]/_}"
}

# as_docker_opts: fill AS_DOCKER_OPTS with the `docker run` options every container of a cell gets
# (host network and IPC, the GPU devices, the mounts, the workdir); name, env and image apart.
# AGENTSWEEP_DOCKER_DEVICES lists the devices (default: ROCm's /dev/kfd /dev/dri); an empty
# AGENTSWEEP_SHM_SIZE leaves --shm-size out (with --ipc host the host's /dev/shm is used anyway, and
# podman refuses the pair).
as_docker_opts() {
  local path device
  local -a devices
  read -r -a devices <<<"${AGENTSWEEP_DOCKER_DEVICES-/dev/kfd /dev/dri}"
  AS_DOCKER_OPTS=(--network host --ipc host)
  [[ -n ${AGENTSWEEP_SHM_SIZE-64g} ]] && AS_DOCKER_OPTS+=(--shm-size "${AGENTSWEEP_SHM_SIZE-64g}")
  for device in "${devices[@]}"; do
    AS_DOCKER_OPTS+=(--device "$device")
  done
  AS_DOCKER_OPTS+=(
    --group-add video
    --cap-add SYS_PTRACE --security-opt seccomp=unconfined
    --workdir "$AS_REPO"
  )
  as_mount_paths
  for path in "${AS_MOUNT_PATHS[@]}"; do
    as_check_mount_path "$path"
    AS_DOCKER_OPTS+=(--volume "$path:$path")
  done
}

# as_docker_args NAME ENV_NAMES...: fill AS_DOCKER_ARGS (docker run options, image and command apart).
# Env values go by name only (-e NAME), so secrets never appear on the command line.
as_docker_args() {
  local name=$1 env_name
  shift
  as_docker_opts
  AS_DOCKER_ARGS=(--rm --name "$name" "${AS_DOCKER_OPTS[@]}")
  for env_name in "$@"; do
    AS_DOCKER_ARGS+=(--env "$env_name")
  done
}

# as_remove_containers NAME_OR_ID...: end the containers at once (SIGKILL), then remove them; what is
# already gone is no error. `docker rm --force` alone is not enough where `docker` is podman: it
# stops a container gracefully first (up to its stop timeout) and, when it is killed part way (a
# step's task epilog at the end of the step's KillWait, a `timeout`), leaves the container
# "stopping"; a later `rm --force` then deletes only podman's record of it, and the engine and its
# conmon run on with nothing left to find them by. (docker's own `rm --force` kills at once.)
as_remove_containers() {
  (($# > 0)) || return 0
  docker kill "$@" >/dev/null 2>&1 || true
  docker rm --force "$@" >/dev/null 2>&1 || true
}

# as_remove_job_containers JOB: remove every container this node runs for JOB's engine instances
# (a cell on the host side labels them agentsweep.job=JOB; see agentsweep.cell.placement).
as_remove_job_containers() {
  local ids
  ids=$(docker ps -aq --filter "label=agentsweep.job=$1" 2>/dev/null) || return 0
  [[ -n $ids ]] || return 0
  # shellcheck disable=SC2086 # one id per word
  as_remove_containers $ids
}
