#!/usr/bin/env bash
# Create (or reuse) the AIPerf virtualenv used by cells with `client: aiperf`.
# Usage: experimental/aiperf/setup_venv.sh [VENV_DIR]
# Default VENV_DIR: $AGENTSWEEP_AIPERF_VENV, else ~/.cache/agentsweep/aiperf-<version>.
# About 1.2 GB; takes a minute or more. Set PYTHON to pick the interpreter (>= 3.10).
set -euo pipefail

AIPERF_VERSION="${AIPERF_VERSION:-0.13.0}"
PYTHON="${PYTHON:-python3}"
VENV="${1:-${AGENTSWEEP_AIPERF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentsweep/aiperf-${AIPERF_VERSION}}}"

if [ -x "$VENV/bin/aiperf" ] && [ -f "$VENV/.agentsweep-aiperf-${AIPERF_VERSION}" ]; then
  echo "aiperf ${AIPERF_VERSION} already installed in $VENV"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "aiperf==${AIPERF_VERSION}"
"$VENV/bin/aiperf" --version >/dev/null
touch "$VENV/.agentsweep-aiperf-${AIPERF_VERSION}"
echo "aiperf ${AIPERF_VERSION} installed in $VENV"
