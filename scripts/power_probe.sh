#!/usr/bin/env bash
# The power sampler against this machine's real nvidia-smi: sample every GPU for ~40 s while a torch
# matmul loop loads GPU 0 for 30 s, then print the power summary of the loaded stretch and of the idle
# one before it. Needs nvidia-smi, python3 with torch, pydantic and prometheus_client (no network).
#
#   scripts/power_probe.sh [OUT_DIR]        (PYTHON=... to pick the interpreter)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$repo/utils:$repo/kv-cache-tester${PYTHONPATH:+:$PYTHONPATH}"

gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
count=$(awk -F, '{print NF}' <<<"$gpus")
echo "power probe: GPUs $gpus, samples into $out/power.csv"
"$py" -m agentsweep.cli power-sampler --source nvidia-smi --gpus "$gpus" --interval 0.25 --seconds 42 \
  --output "$out/power.csv" 2>"$out/power-sampler.log" &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT
sleep 5
idle_end=$(date +%s.%N)
load_start=$(date +%s.%N)
"$py" - <<'LOAD'
import time

import torch

a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
b = torch.randn_like(a)
end = time.time() + 30
n = 0
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    n += 20
print(f"power probe: {n} matmuls of 8192x8192 bf16 on {torch.cuda.get_device_name(0)}")
LOAD
load_end=$(date +%s.%N)
wait "$sampler" || true
trap - EXIT
cat "$out/power-sampler.log"
summary() {
  "$py" -m agentsweep.cli power-summary --power-csv "$out/power.csv" --expected-gpus "$count" \
    --interval 0.25 --start "$1" --end "$2"
}
echo "== idle, before the load =="
summary "$(awk -v t="$idle_end" 'BEGIN {printf "%.3f", t - 3.5}')" "$idle_end"
echo "== under load (GPU 0), its first 2 s left out =="
summary "$(awk -v t="$load_start" 'BEGIN {printf "%.3f", t + 2}')" "$load_end"
