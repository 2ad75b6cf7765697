#!/usr/bin/env bash
# Create (or reuse) one virtualenv per engine holding that engine's release at the version the shipped
# configs pin (scripts/engine_parsers/pinned.py), for `make test-engine-parsers`. Large download
# (about 2.5 GB per engine, once): run on demand, never from the project's .venv.
#
# ENGINE_PARSERS_DIR (default ~/.cache/agentsweep/engine-parsers, outside the work tree) holds
# <engine>-<version>/ virtualenvs; PYTHON (default python3) creates them; AGENTSWEEP_PYTHON (default
# .venv/bin/python) reads the pins.
#
# Only what importing the engine's argument parser needs is installed: the engine's wheel without its
# dependencies, a CPU build of torch, then the engine's declared dependencies less the GPU kernels,
# CUDA libraries and media stacks that its parser never imports (listed below per engine). A package
# the parser does import and that was left out fails the check with the module named.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="${ENGINE_PARSERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentsweep/engine-parsers}"
python="${PYTHON:-python3}"
project_python="${AGENTSWEEP_PYTHON:-.venv/bin/python}"
# torch: a CPU build where one is at hand (a local wheel directory pip already searches), else PyPI's.
torch_spec="${ENGINE_PARSERS_TORCH:-torch==2.13.0+cpu}"

# Distributions an engine declares but its parser never imports (regular expression on the name).
declare -A LEAVE_OUT=(
  [vllm]='^(torch|torchaudio|torchvision|torchcodec|pynvvideocodec|flashinfer-python|tilelang|nvidia-.*|nvtx|fastsafetensors|instanttensor|quack-kernels|tokenspeed-mla|humming-kernels|numba|opencv-python-headless|xgrammar)$'
  [sglang]='^(torch|torchaudio|torchvision|torchcodec|flash-.*|flashinfer-python|humming-kernels|nvidia-.*|nvshmem.*|cuda-python|quack-kernels|sgl-.*|sglang-kernel|tilelang|xgrammar|numba|deepseek-recipe|tml-renderers|timm|soundfile|py-spy|modelscope|datasets|smg-grpc-servicer|kernels|outlines)$'
)
# Imported by the parser but declared with a heavy dependency it does not need there: installed alone.
declare -A ALONE=(
  [vllm]='xgrammar apache-tvm-ffi'
  [sglang]='xgrammar apache-tvm-ffi triton ipython traitlets'
)

pins=$("$project_python" scripts/engine_parsers/pinned.py)
while read -r engine version; do
  venv="$root/$engine-$version"
  stamp="$venv/.installed"
  if [[ -f $stamp ]]; then
    echo "engine parsers: $engine $version in $venv ($(cat "$stamp"))"
    continue
  fi
  start=$(date +%s)
  rm -rf "$venv"
  mkdir -p "$root"
  "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
  "${pip[@]}" install --upgrade pip packaging
  "${pip[@]}" install "$torch_spec" || "${pip[@]}" install 'torch<=2.14.1'
  "${pip[@]}" install --no-deps "$engine==$version"
  # The engine's own pins of the packages installed alone (xgrammar==0.2.8, ...), else the latest.
  mapfile -t lines < <("$venv/bin/python" - "$engine" "${LEAVE_OUT[$engine]}" "${ALONE[$engine]}" <<'PY'
import importlib.metadata as m
import re
import sys

from packaging.requirements import Requirement

engine, leave_out, alone = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3].split()
pins = {}
for text in m.requires(engine) or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = req.name.lower().replace("_", "-")
    req.marker = None
    if name in alone:
        pins[name] = str(req)
    elif not leave_out.match(name):
        print("dep", req)
for name in alone:
    print("alone", pins.get(name, name))
PY
  )
  deps=() single=()
  for line in "${lines[@]}"; do
    case $line in
    "dep "*) deps+=("${line#dep }") ;;
    "alone "*) single+=("${line#alone }") ;;
    esac
  done
  "${pip[@]}" install "${deps[@]}"
  "${pip[@]}" install --no-deps "${single[@]}"
  size=$(du -sh "$venv" | cut -f1)
  echo "$engine $version, $size, installed in $(($(date +%s) - start)) s" | tee "$stamp"
done <<<"$pins"
