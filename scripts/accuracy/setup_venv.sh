#!/usr/bin/env bash
# Create (or reuse) the virtualenv of the accuracy gate's evaluation harness (lm-evaluation-harness with
# its API model types; no torch). Usage: scripts/accuracy/setup_venv.sh [VENV_DIR]
# Default VENV_DIR: $AGENTSWEEP_LMEVAL_VENV, else ~/.cache/agentsweep/lmeval-<version>. About 800 MB,
# a minute or two. Set PYTHON to pick the interpreter (>= 3.10).
set -euo pipefail

LMEVAL_VERSION="${LMEVAL_VERSION:-0.4.13}"
VENV="${1:-${AGENTSWEEP_LMEVAL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentsweep/lmeval-${LMEVAL_VERSION}}}"

exec "$(dirname "$0")/../tool_venv.sh" lm-eval "$LMEVAL_VERSION" "$VENV" "lm-eval[api]==${LMEVAL_VERSION}" lm_eval --help
