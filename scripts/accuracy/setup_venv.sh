#!/usr/bin/env bash
# Create (or reuse) the virtualenv of the accuracy gate's evaluation harness (lm-evaluation-harness with
# its API model types; no torch). Usage: scripts/accuracy/setup_venv.sh [VENV_DIR]
# Default VENV_DIR: $AGENTSWEEP_LMEVAL_VENV, else ~/.cache/agentsweep/lmeval-<version>. About 800 MB,
# a minute or two. Set PYTHON to pick the interpreter (>= 3.10).
set -euo pipefail

LMEVAL_VERSION="${LMEVAL_VERSION:-0.4.13}"
PYTHON="${PYTHON:-python3}"
VENV="${1:-${AGENTSWEEP_LMEVAL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentsweep/lmeval-${LMEVAL_VERSION}}}"

if [ -x "$VENV/bin/lm_eval" ] && [ -f "$VENV/.agentsweep-lmeval-${LMEVAL_VERSION}" ]; then
  echo "lm-eval ${LMEVAL_VERSION} already installed in $VENV"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "lm-eval[api]==${LMEVAL_VERSION}"
"$VENV/bin/lm_eval" --help >/dev/null
touch "$VENV/.agentsweep-lmeval-${LMEVAL_VERSION}"
echo "lm-eval ${LMEVAL_VERSION} installed in $VENV"
