#!/usr/bin/env bash
# Stand-in for benchmarks/run_cell.sh in the launcher tests: records what reached the cell (the cell
# from AGENTSWEEP_CELL, the visible devices, where it ran) the way run_cell.sh does, without an engine.
# AGENTSWEEP_TEST_EXIT: exit status to return; AGENTSWEEP_TEST_SLEEP: seconds to run first;
# AGENTSWEEP_TEST_STARTED: a file written once the stand-in runs (a test's signal must not reach the
# step before its task exists: Slurm drops a signal to a step whose task has not started yet).
set -euo pipefail
: "${RESULT_DIR:?}"
[[ -z ${AGENTSWEEP_TEST_STARTED:-} ]] || : >"$AGENTSWEEP_TEST_STARTED"
sleep "${AGENTSWEEP_TEST_SLEEP:-0}"
status=SUCCESS
[[ ${AGENTSWEEP_TEST_EXIT:-0} == 0 ]] || status=FAILED
job_info=""
if [[ -n ${SLURM_JOB_ID:-} ]] && command -v scontrol >/dev/null; then
  job_info=$(scontrol show job --oneliner "$SLURM_JOB_ID" || true)
fi
JOB_INFO=$job_info python3 - "$RESULT_DIR/cell.json" <<'PY'
import json, os, sys
fields = ("exp_name", "runner", "gpus", "tp", "engine", "image")
visible = {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES") if k in os.environ}
record = {
    "schema_version": 1,
    "cell": {f: json.loads(os.environ["AGENTSWEEP_CELL"]).get(f) for f in fields},
    "visible_devices": visible,
    "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    "job_info": os.environ["JOB_INFO"],
    "cwd": os.getcwd(),
    "env_names": sorted(os.environ),
    "hf_token": os.environ.get("HF_TOKEN"),
}
json.dump(record, open(sys.argv[1], "w"), indent=1)
PY
printf '%s\n' "$status" >"$RESULT_DIR/status.txt"
exit "${AGENTSWEEP_TEST_EXIT:-0}"
