#!/usr/bin/env bash
# Launcher for runner `local`: run one cell on this machine, no allocation, no container.
#
# Same contract as every runners/launch_<key>.sh: the cell as JSON in AGENTSWEEP_CELL, RESULT_DIR to
# fill, optional PORT; the exit status is the cell's (0 SUCCESS, 1 FAILED,
# 2 bad input). AGENTSWEEP_CELL_SCRIPT may point at another cell script (tests).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cell_script="${AGENTSWEEP_CELL_SCRIPT:-$repo/benchmarks/run_cell.sh}"

if [[ -z "${RESULT_DIR:-}" ]]; then
  echo "launch_local: input error: environment variable RESULT_DIR is required" >&2
  exit 2
fi
if [[ -z "${AGENTSWEEP_CELL:-}" ]]; then
  echo "launch_local: input error: environment variable AGENTSWEEP_CELL is required (the matrix cell's JSON)" >&2
  exit 2
fi
mkdir -p "$RESULT_DIR"
RESULT_DIR="$(cd "$RESULT_DIR" && pwd)"
export RESULT_DIR
# Relative paths in a cell (TRACES) are relative to the repository root, as in the configs.
cd "$repo"
echo "launch_local: cell -> $RESULT_DIR" >&2
# exec: signals sent to this launcher reach the cell script directly.
exec "$cell_script" "$@"
