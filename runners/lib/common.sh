# shellcheck shell=bash
# Small helpers shared by the launcher library (sourced, never run).

# as_log MSG...: one line on stderr, prefixed with the launcher's name.
as_log() {
  printf '%s: %s\n' "${AS_LOG_PREFIX:-launch}" "$*" >&2
}

# as_die STATUS MSG...: log MSG and exit with STATUS (2 = bad input, 1 = the run broke).
as_die() {
  local status=$1
  shift
  as_log "$*"
  exit "$status"
}

# as_is_name STR: true when STR is a valid environment variable name.
as_is_name() {
  [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]
}

# as_join SEP ITEMS...: print ITEMS joined by SEP.
as_join() {
  local sep=$1 out="" item
  shift
  for item in "$@"; do
    out+="${out:+$sep}$item"
  done
  printf '%s' "$out"
}
