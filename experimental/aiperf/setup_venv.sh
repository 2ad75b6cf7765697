#!/usr/bin/env bash
# Create (or reuse) the AIPerf virtualenv used by cells with `client: aiperf`.
# Usage: experimental/aiperf/setup_venv.sh [VENV_DIR]
# Default VENV_DIR: $AGENTSWEEP_AIPERF_VENV, else ~/.cache/agentsweep/aiperf-<version>.
# About 1.2 GB; takes a minute or more. Set PYTHON to pick the interpreter (>= 3.10).
set -euo pipefail

AIPERF_VERSION="${AIPERF_VERSION:-0.13.0}"
VENV="${1:-${AGENTSWEEP_AIPERF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentsweep/aiperf-${AIPERF_VERSION}}}"

exec "$(dirname "$0")/../../scripts/tool_venv.sh" aiperf "$AIPERF_VERSION" "$VENV" "aiperf==${AIPERF_VERSION}" aiperf --version
