#!/usr/bin/env bash
# Create (or reuse) a virtualenv that holds one pinned tool, beside the project's own (the accuracy
# gate's lm-eval, the experimental AIPerf client).
# Usage: scripts/tool_venv.sh NAME VERSION VENV_DIR PIP_SPEC EXECUTABLE [CHECK_ARG...]
# A finished install leaves VENV_DIR/.agentsweep-<NAME without dashes>-<VERSION>; with it and the
# executable present, nothing is done. EXECUTABLE CHECK_ARG... must succeed after the install.
# Set PYTHON to pick the interpreter (>= 3.10).
set -euo pipefail

if (($# < 5)); then
  echo "usage: $0 NAME VERSION VENV_DIR PIP_SPEC EXECUTABLE [CHECK_ARG...]" >&2
  exit 2
fi
name=$1 version=$2 venv=$3 spec=$4 exe=$5
shift 5
PYTHON="${PYTHON:-python3}"
marker="$venv/.agentsweep-${name//-/}-${version}"

if [ -x "$venv/bin/$exe" ] && [ -f "$marker" ]; then
  echo "$name $version already installed in $venv"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
"$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
"$venv/bin/$exe" "$@" >/dev/null
touch "$marker"
echo "$name $version installed in $venv"
