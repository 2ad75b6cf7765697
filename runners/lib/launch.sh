# shellcheck shell=bash
# The launcher flow shared by runners/launch_<hardware>.sh (sourced; call `as_launch RUNNER VENDOR`).
#
# In: the cell as JSON in AGENTSWEEP_CELL (it carries its runner's node facts: GRES type, GPUs per
# node...), RESULT_DIR, optional PORT and AGENTSWEEP_RUNNERS from the environment; the runner's site
# settings (partition, account, container runtime...) from configs/runners.yaml. Out: RESULT_DIR
# filled by the cell script, and the cell's exit status. The allocation is always released (scancel)
# on the way out.
#
# Knobs (environment): AGENTSWEEP_CELL_SCRIPT (default benchmarks/run_cell.sh), AGENTSWEEP_PYTHON,
# AGENTSWEEP_DRY_RUN=1 (print the commands, run nothing), AGENTSWEEP_SALLOC_ARGS (extra salloc words),
# AGENTSWEEP_SQUASH_DIR (enroot squash files), AGENTSWEEP_STARTUP_MARGIN_S / AGENTSWEEP_DRAIN_MARGIN_S
# (time limit margins), AGENTSWEEP_MEM_OVERHEAD_GB, AGENTSWEEP_RELEASE_WAIT_S.

AS_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=runners/lib/common.sh
source "$AS_LIB/common.sh"
# shellcheck source=runners/lib/slurm.sh
source "$AS_LIB/slurm.sh"
# shellcheck source=runners/lib/container.sh
source "$AS_LIB/container.sh"

AS_JOB_ID=""
AS_SALLOC_PID=""
AS_SALLOC_LOG=""
AS_STEP_PID=""

# as_python: the interpreter that has the agentsweep package.
as_python() {
  if [[ -n ${AGENTSWEEP_PYTHON:-} ]]; then
    printf '%s' "$AGENTSWEEP_PYTHON"
  elif [[ -x $AS_REPO/.venv/bin/python ]]; then
    printf '%s' "$AS_REPO/.venv/bin/python"
  else
    printf 'python3'
  fi
}

# as_load_runner RUNNER: check the cell and set the AS_* runner values, the cell's exp_name, image and
# traces, and its derived Slurm figures.
as_load_runner() {
  local out status=0
  out=$(PYTHONPATH="$AS_REPO/utils${PYTHONPATH:+:$PYTHONPATH}" "$(as_python)" -m agentsweep.commands.allocation "$1") ||
    status=$?
  ((status == 0)) || exit "$status" # the helper already printed one line saying why
  eval "$out"
}

# as_print_cmd WORDS...: a command line, shell-quoted, on stdout (dry run).
as_print_cmd() {
  local out
  printf -v out '%q ' "$@"
  printf '%s\n' "${out% }"
}

# as_mark_failed REASON: leave status.txt saying why when the cell script never ran (written by its
# owner, agentsweep.contract.resultdir; one the cell wrote itself is kept).
as_mark_failed() {
  PYTHONPATH="$AS_REPO/utils${PYTHONPATH:+:$PYTHONPATH}" "$(as_python)" -m agentsweep.commands.mark_failed \
    "$RESULT_DIR" "$1" || true
}

# as_allocate: salloc --no-shell for the cell; sets AS_JOB_ID. Slurm's own messages go to stderr as
# they come (a refusal is surfaced verbatim).
as_allocate() {
  local status=0
  AS_SALLOC_LOG=$(mktemp "${TMPDIR:-/tmp}/agentsweep-salloc.XXXXXX")
  as_log "salloc ${AS_SALLOC_ARGS[*]}"
  salloc "${AS_SALLOC_ARGS[@]}" 2>"$AS_SALLOC_LOG" &
  AS_SALLOC_PID=$!
  tail -s 0.2 -n +1 -f --pid="$AS_SALLOC_PID" "$AS_SALLOC_LOG" >&2 &
  local tail_pid=$!
  wait "$AS_SALLOC_PID" || status=$?
  AS_SALLOC_PID=""
  wait "$tail_pid" || true
  if ((status != 0)); then
    local why
    why=$(grep -m1 -i 'error' "$AS_SALLOC_LOG" | sed 's/^salloc: //') || true
    as_mark_failed "allocation refused: ${why:-salloc exited with $status}"
    as_die 1 "salloc failed (exit $status): ${why:-see above}"
  fi
  if ! AS_JOB_ID=$(as_parse_job_id "$AS_SALLOC_LOG"); then
    AS_JOB_ID=""
    scancel --name="${AS_SALLOC_ARGS[1]#--job-name=}" --user="$(id -un)" 2>/dev/null || true
    as_mark_failed "allocation: no single job id in salloc's output"
    as_die 1 "could not tell which job salloc allocated; cancelled jobs named after this cell"
  fi
  export AS_JOB_ID
  as_log "job $AS_JOB_ID allocated"
}

# as_tag_digest IMAGE: the manifest digest IMAGE's tag has now (agentsweep images resolve); nothing
# when the registry cannot be asked from here.
as_tag_digest() {
  PYTHONPATH="$AS_REPO/utils:$AS_REPO/kv-cache-tester${PYTHONPATH:+:$PYTHONPATH}" \
    "$(as_python)" -m agentsweep.cli images resolve "$1" 2>/dev/null || true
}

# as_import_image: import the cell's image into its squash file on the node, once (pyxis), and give
# the cell the digest recorded beside it (AGENTSWEEP_IMAGE_DIGEST). A pinned cell whose tag has moved
# away from its pin imports nothing.
as_import_image() {
  local status=0 digest=""
  if [[ ! -s $AS_SQSH ]]; then
    digest=$(as_tag_digest "$AS_IMAGE")
    if [[ -n $digest && -n ${AS_IMAGE_PIN:-} && $digest != "$AS_IMAGE_PIN" ]]; then
      as_mark_failed "image refused: $AS_IMAGE: the registry gives $digest, configs/images.lock.yaml pins $AS_IMAGE_PIN"
      as_die 1 "$AS_IMAGE: the registry gives $digest, the pin is $AS_IMAGE_PIN: not imported (move the pin with agentsweep images lock)"
    fi
  fi
  # shellcheck disable=SC2016 # expanded by the inner bash
  srun --jobid="$AS_JOB_ID" --nodes=1 --ntasks=1 --export="$(as_export_list)" \
    bash -c 'source "$1/common.sh" && source "$1/container.sh" && as_import_squash "$2" "$3" "$4"' \
    import "$AS_LIB" "$AS_IMAGE" "$AS_SQSH" "$digest" || status=$?
  if ((status != 0)); then
    as_mark_failed "enroot import of $AS_IMAGE failed"
    as_die 1 "enroot import of $AS_IMAGE into $AS_SQSH failed (exit $status)"
  fi
  AGENTSWEEP_IMAGE_DIGEST=$(head -c 100 "$AS_SQSH.digest" 2>/dev/null || true)
  export AGENTSWEEP_IMAGE_DIGEST
}

# as_run_step: the cell's job step; returns the cell's exit status.
as_run_step() {
  local status=0
  srun --jobid="$AS_JOB_ID" --nodes=1 --ntasks=1 --export="$(as_export_list)" \
    "${AS_CELL_CONTAINER_ARGS[@]}" bash "$AS_LIB/step.sh" &
  AS_STEP_PID=$!
  wait "$AS_STEP_PID" || status=$?
  AS_STEP_PID=""
  return "$status"
}

# as_stop_step: end a step still running (the launcher was interrupted). SIGTERM goes to the step's
# processes through Slurm (a signal to srun itself would make it SIGKILL the step), so the cell can
# write what it has and step.sh can stop this cell's container; then srun goes, and for docker what is
# left of this cell's container (by name), or of its engine instances' (by the job's label), is ended
# and removed on the node (as_remove_containers).
as_stop_step() {
  local waited=0
  if [[ -n $AS_JOB_ID ]]; then
    as_log "stopping the cell (SIGTERM to job $AS_JOB_ID's steps)"
    scancel --signal=TERM "$AS_JOB_ID" 2>/dev/null || true
  fi
  while kill -0 "$AS_STEP_PID" 2>/dev/null && ((waited < ${AGENTSWEEP_STOP_WAIT_S:-60} * 5)); do
    sleep 0.2
    waited=$((waited + 1))
  done
  kill -TERM "$AS_STEP_PID" 2>/dev/null && wait "$AS_STEP_PID" 2>/dev/null
  if [[ $AS_CONTAINER_RUNTIME == docker && -n $AS_JOB_ID ]]; then
    if [[ $AS_CELL_ON_HOST == 1 ]]; then # the engine instances' containers, on every node
      # shellcheck disable=SC2016 # expanded by the inner bash
      timeout 120 srun --jobid="$AS_JOB_ID" --overlap --nodes="$AS_NODES" --ntasks-per-node=1 \
        --export="$(as_export_list)" bash -c 'source "$1/common.sh" && source "$1/container.sh" &&
          as_remove_job_containers "$2"' cleanup "$AS_LIB" "$AS_JOB_ID" >/dev/null 2>&1 || true
    else
      # shellcheck disable=SC2016 # expanded by the inner bash
      timeout 120 srun --jobid="$AS_JOB_ID" --overlap --nodes=1 --ntasks=1 --export="$(as_export_list)" \
        bash -c 'source "$1/common.sh" && source "$1/container.sh" && as_remove_containers "$2"' \
        cleanup "$AS_LIB" "$(as_container_name)" >/dev/null 2>&1 || true
    fi
  fi
}

# as_on_exit: always runs last; releases everything and keeps the exit status it was called with.
as_on_exit() {
  local status=$?
  trap - EXIT INT TERM
  set +e
  if [[ -n $AS_SALLOC_PID ]] && kill -0 "$AS_SALLOC_PID" 2>/dev/null; then
    kill -TERM "$AS_SALLOC_PID" 2>/dev/null # salloc withdraws a pending request itself
    wait "$AS_SALLOC_PID" 2>/dev/null
    [[ -z $AS_JOB_ID && -n $AS_SALLOC_LOG ]] && AS_JOB_ID=$(as_pending_job_id "$AS_SALLOC_LOG")
  fi
  [[ -n $AS_STEP_PID ]] && as_stop_step
  [[ -n $AS_JOB_ID ]] && as_release "$AS_JOB_ID"
  [[ -n $AS_SALLOC_LOG ]] && rm -f "$AS_SALLOC_LOG"
  exit "$status"
}

# as_launch RUNNER VENDOR: run the cell from the environment on RUNNER (nvidia|amd); exits.
as_launch() {
  local runner=$1 vendor=$2 status=0
  AS_LOG_PREFIX="launch[$runner]"
  AS_REPO=$(cd "$AS_LIB/../.." && pwd)
  export AS_REPO AS_RUNNER=$runner AS_VENDOR=$vendor
  as_load_runner "$runner"
  export AS_CONTAINER_RUNTIME AS_HF_CACHE AS_EXP_NAME AS_IMAGE AS_TRACES AS_NODES AS_CELL_ON_HOST

  mkdir -p "$RESULT_DIR" || as_die 2 "cannot create RESULT_DIR=$RESULT_DIR"
  RESULT_DIR=$(cd "$RESULT_DIR" && pwd)
  export RESULT_DIR
  AS_CELL_SCRIPT=${AGENTSWEEP_CELL_SCRIPT:-$AS_REPO/benchmarks/run_cell.sh}
  [[ $AS_CELL_SCRIPT == /* ]] || AS_CELL_SCRIPT=$PWD/$AS_CELL_SCRIPT
  [[ -f $AS_CELL_SCRIPT ]] || as_die 2 "cell script $AS_CELL_SCRIPT not found (AGENTSWEEP_CELL_SCRIPT)"
  export AS_CELL_SCRIPT
  if [[ -n $AS_HF_CACHE && -z ${HF_HUB_CACHE:-} ]]; then
    export HF_HUB_CACHE=$AS_HF_CACHE
  fi

  AS_CONTAINER_ARGS=()
  case $AS_CONTAINER_RUNTIME in
  pyxis | docker)
    [[ -n ${AS_IMAGE:-} ]] || as_die 2 "cell IMAGE is empty but runner $runner runs cells in $AS_CONTAINER_RUNTIME"
    local path
    as_mount_paths
    for path in "${AS_MOUNT_PATHS[@]}"; do
      as_check_mount_path "$path" # before any allocation: one line, exit 2
    done
    ;;
  esac
  if [[ $AS_CONTAINER_RUNTIME == pyxis ]]; then
    AS_SQSH=$(as_squash_path "$AS_IMAGE")
    as_pyxis_args "$AS_SQSH"
  fi
  # The cell's own step: in the container, unless it runs on the host side of node 0 (a routed or
  # multi-node cell: its router and the Slurm client are on the host), starting each engine instance
  # as a step of its own in the container: pyxis with these flags, docker with these run options.
  AS_CELL_CONTAINER_ARGS=("${AS_CONTAINER_ARGS[@]}")
  if [[ $AS_CELL_ON_HOST == 1 ]]; then
    AS_CELL_CONTAINER_ARGS=()
    if [[ $AS_CONTAINER_RUNTIME == pyxis ]]; then
      printf -v AS_STEP_CONTAINER_ARGS '%q ' "${AS_CONTAINER_ARGS[@]}"
      export AS_STEP_CONTAINER_ARGS
    else
      as_docker_opts
      printf -v AS_DOCKER_RUN_ARGS '%q ' "${AS_DOCKER_OPTS[@]}"
      export AS_DOCKER_RUN_ARGS
    fi
  fi
  as_salloc_args

  if [[ ${AGENTSWEEP_DRY_RUN:-0} == 1 ]]; then
    if [[ -n ${AS_STEP_BUDGET:-} ]]; then
      echo "# capacity search: $AS_STEP_BUDGET"
    fi
    as_print_cmd salloc "${AS_SALLOC_ARGS[@]}"
    if [[ $AS_CONTAINER_RUNTIME == pyxis ]]; then
      echo "# once per image, on the node, under flock $AS_SQSH.lock:"
      as_print_cmd enroot import --output "$AS_SQSH" "$(as_enroot_uri "$AS_IMAGE")"
    fi
    as_print_cmd srun --jobid=JOBID --nodes=1 --ntasks=1 "--export=$(as_export_list)" \
      "${AS_CELL_CONTAINER_ARGS[@]}" bash "$AS_LIB/step.sh"
    if [[ $AS_CELL_ON_HOST == 1 ]]; then
      echo "# the cell runs on the host side of node 0 (its router, scrapers and replayer with $(as_python));"
      echo "# each engine instance is a step of its own on its node, in the $AS_CONTAINER_RUNTIME container:"
      local -a step_words=(srun --jobid=JOBID --nodes=1 --ntasks=1 --nodelist=NODE --overlap --kill-on-bad-exit=1
        ${AS_GRES_TYPE:+"--gres=gpu:$AS_GRES_TYPE:$AS_NODE_GPUS"})
      if [[ $AS_CONTAINER_RUNTIME == pyxis ]]; then
        as_print_cmd "${step_words[@]}" "${AS_CONTAINER_ARGS[@]}" --export=ALL ENGINE...
      else
        as_print_cmd "${step_words[@]}" "--task-epilog=$AS_LIB/docker_epilog.sh" \
          "--export=ALL,AS_DOCKER_CONTAINER=agentsweep-$AS_EXP_NAME-JOBID-K" docker run --rm \
          --name "agentsweep-$AS_EXP_NAME-JOBID-K" --label agentsweep.job=JOBID "${AS_DOCKER_OPTS[@]}" \
          --env NAME... "$AS_IMAGE" ENGINE...
      fi
    elif ((AS_NODES > 1)); then
      echo "# the cell runs on node 0 and starts each engine instance as a step on its node:"
      as_print_cmd srun --jobid=JOBID --nodes=1 --ntasks=1 --nodelist=NODE --overlap --kill-on-bad-exit=1 \
        ${AS_GRES_TYPE:+"--gres=gpu:$AS_GRES_TYPE:$AS_NODE_GPUS"} --export=ALL ENGINE...
    fi
    if [[ $AS_CONTAINER_RUNTIME == docker && $AS_CELL_ON_HOST != 1 ]]; then
      echo "# on the node, step.sh runs:"
      AS_JOB_ID=JOBID as_docker_args "$(AS_JOB_ID=JOBID as_container_name)" CELL_ENV_NAMES
      as_print_cmd docker run "${AS_DOCKER_ARGS[@]}" "$AS_IMAGE" bash "$AS_CELL_SCRIPT"
    fi
    exit 0
  fi

  trap as_on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  as_allocate
  [[ $AS_CONTAINER_RUNTIME == pyxis ]] && as_import_image
  as_run_step || status=$?
  if ((status != 0)); then
    as_log "cell $AS_EXP_NAME failed with exit status $status"
  else
    as_log "cell $AS_EXP_NAME finished"
  fi
  exit "$status"
}
