# shellcheck shell=bash
# Slurm side of the launchers: allocation arguments, job id parsing, the env export list, release.
# Reads the AS_* values printed by `python -m agentsweep.commands.allocation` (see launch.sh).

# The cell itself travels as one JSON value in AGENTSWEEP_CELL (exported with every AS_*/AGENTSWEEP_*
# name). Other names the cell may need. Secrets are in this list by name only: Slurm copies their values from
# the launcher's environment, so they never appear on a command line or in the job's record.
AS_PASS_NAMES=(
  RESULT_DIR PORT HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_HUB_CACHE HF_HUB_OFFLINE
  PATH HOME USER LANG LC_ALL TMPDIR VIRTUAL_ENV PYTHONPATH
)

# as_gres TYPE COUNT: the --gres value (typed when TYPE is set).
as_gres() {
  printf 'gpu:%s%s' "${1:+$1:}" "$2"
}

# as_salloc_args: fill the array AS_SALLOC_ARGS for this cell. A cell spanning several nodes gets
# them in one allocation, AS_NODE_GPUS GPUs (and AS_MEM_GB) on each, one task per node.
as_salloc_args() {
  local name="agentsweep-${AS_EXP_NAME:-cell}"
  AS_SALLOC_ARGS=(--no-shell "--job-name=${name:0:120}")
  if ((${AS_NODES:-1} > 1)); then
    AS_SALLOC_ARGS+=("--nodes=$AS_NODES" --ntasks-per-node=1 "--gres=$(as_gres "${AS_GRES_TYPE:-}" "$AS_NODE_GPUS")")
  else
    AS_SALLOC_ARGS+=(--nodes=1 --ntasks=1 "--gres=$(as_gres "${AS_GRES_TYPE:-}" "$AS_GPUS")")
  fi
  AS_SALLOC_ARGS+=("--time=$AS_TIME_LIMIT_MIN")
  [[ -n ${AS_PARTITION:-} ]] && AS_SALLOC_ARGS+=("--partition=$AS_PARTITION")
  [[ -n ${AS_ACCOUNT:-} ]] && AS_SALLOC_ARGS+=("--account=$AS_ACCOUNT")
  [[ -n ${AS_EXCLUDE:-} ]] && AS_SALLOC_ARGS+=("--exclude=$AS_EXCLUDE")
  if ((${AS_MEM_GB:-0} > 0)); then
    AS_SALLOC_ARGS+=("--mem=${AS_MEM_GB}G")
  fi
  if [[ -n ${AGENTSWEEP_SALLOC_ARGS:-} ]]; then
    local -a extra
    read -r -a extra <<<"$AGENTSWEEP_SALLOC_ARGS"
    AS_SALLOC_ARGS+=("${extra[@]}")
  fi
  return 0
}

# as_parse_job_id FILE: print the one job id salloc reported in FILE ("Granted job allocation N").
# Fails with a message naming what it saw when there is no such line, or more than one id.
as_parse_job_id() {
  local file=$1 ids
  ids=$(sed -nE 's/.*Granted job allocation ([0-9]+)[[:space:]]*$/\1/p' "$file" | sort -u)
  if [[ -z $ids ]]; then
    as_log "no job id in salloc's output ($(tr '\n' ' ' <"$file" | cut -c1-300))"
    return 1
  fi
  if [[ $ids == *$'\n'* ]]; then
    as_log "more than one job id in salloc's output: ${ids//$'\n'/ }"
    return 1
  fi
  printf '%s\n' "$ids"
}

# as_pending_job_id FILE: the id of a request still pending ("Pending job allocation N"), if any.
as_pending_job_id() {
  sed -nE 's/.*Pending job allocation ([0-9]+)[[:space:]]*$/\1/p' "$1" | tail -n 1
}

# Host interpreter settings that would break the image's Python inside a container (kept when the cell
# runs on the host side of its node: the engine steps leave them out themselves).
AS_HOST_ONLY_NAMES=(VIRTUAL_ENV PYTHONPATH AGENTSWEEP_PYTHON)

# as_export_list: the comma-separated names for `srun --export=`: never ALL, only names that are set.
as_export_list() {
  local -a names=() own=()
  local name
  mapfile -t own < <(compgen -e | grep -E '^(AS|AGENTSWEEP)_' || true)
  for name in "${AS_PASS_NAMES[@]}" "${own[@]}"; do
    as_is_name "$name" || continue
    if [[ ${AS_CONTAINER_RUNTIME:-none} != none && ${AS_CELL_ON_HOST:-0} != 1 &&
      " ${AS_HOST_ONLY_NAMES[*]} " == *" $name "* ]]; then
      continue
    fi
    [[ -n ${!name+set} ]] || continue
    [[ " ${names[*]} " == *" $name "* ]] && continue
    names+=("$name")
  done
  as_join , "${names[@]}"
}

# as_job_alive ID: true while squeue still lists the job (pending, running or completing).
as_job_alive() {
  [[ -n $(squeue -h -j "$1" -o %i 2>/dev/null) ]]
}

# as_release ID: scancel the job and wait (bounded) until Slurm no longer lists it.
as_release() {
  local id=$1 waited=0
  scancel "$id" 2>/dev/null || true
  while as_job_alive "$id" && ((waited < ${AGENTSWEEP_RELEASE_WAIT_S:-60} * 5)); do
    sleep 0.2
    waited=$((waited + 1))
  done
  if as_job_alive "$id"; then
    as_log "job $id is still listed by squeue after scancel"
  else
    as_log "released job $id"
  fi
}
