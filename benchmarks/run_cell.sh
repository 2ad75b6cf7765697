#!/usr/bin/env bash
# Run one matrix cell: engine -> health wait -> metrics scraper -> trace replay -> stop -> verdict.
#
# Input: the matrix cell as one JSON value in AGENTSWEEP_CELL (or `--cell JSON|@FILE`; it carries its
# runner's facts), RESULT_DIR, optional PORT.
# Output: RESULT_DIR/{cell.json,status.txt,requests.jsonl,summary.json,server_metrics.csv,*.log}.
# Exit status: 0 SUCCESS, 1 FAILED, 2 bad input. The work is done by `agentsweep cell`; this wrapper
# forwards SIGTERM/SIGINT/SIGHUP to it and writes a FAILED status.txt if it died without writing one.
# AGENTSWEEP_PYTHON picks the interpreter (default: the repo's .venv, else python3).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${RESULT_DIR:-}" ]]; then
  echo "input error: environment variable RESULT_DIR is required (the directory this cell fills)" >&2
  exit 2
fi

python="${AGENTSWEEP_PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python="python3"; fi
fi
# Runs from a plain checkout too (inside an engine container nothing is installed).
export PYTHONPATH="$repo/utils:$repo/kv-cache-tester${PYTHONPATH:+:$PYTHONPATH}"

had_status=0
[[ -e "$RESULT_DIR/status.txt" ]] && had_status=1

child=""
# shellcheck disable=SC2329  # invoked by the traps below
forward() {
  [[ -n "$child" ]] && kill -s "$1" "$child" 2>/dev/null
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward HUP' HUP

"$python" -m agentsweep.cli cell "$@" &
child=$!
# `wait` returns early when a trapped signal interrupts it: keep waiting while the child lives,
# then ask once more for its real exit status (bash remembers it).
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
done
wait "$child"
rc=$?

# A cell process that died outright leaves a watchdog stopping its engine, scraper and replayer; it
# holds a lock on RESULT_DIR until the last of them is gone, so the verdict below is written last.
if ((had_status == 0)) && [[ ! -e "$RESULT_DIR/status.txt" && -d "$RESULT_DIR" ]] && command -v flock >/dev/null; then
  flock -w "${AGENTSWEEP_WATCHDOG_WAIT_S:-300}" "$RESULT_DIR" true || true
fi
if ((had_status == 0)) && [[ ! -e "$RESULT_DIR/status.txt" ]] && mkdir -p "$RESULT_DIR" 2>/dev/null; then
  # What the cell held for its verdict, and its writers' temporary files, make room on a full disk.
  rm -f -- "$RESULT_DIR/.verdict.reserve" "$RESULT_DIR"/*.tmp "$RESULT_DIR"/.*.tmp
  printf 'FAILED\nthe cell process exited with status %s without writing its result\n' "$rc" >"$RESULT_DIR/status.txt"
  ((rc == 0)) && rc=1
fi
exit "$rc"
