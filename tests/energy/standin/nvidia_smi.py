"""A stand-in `nvidia-smi` for the sampler's tests (no NVIDIA GPU here): it accepts only the fields the
recorded driver lists (``../fixtures/nvidia-smi-help-query-gpu.h100.txt``) and answers the loop query
with the recorded H100 series' figures (``../fixtures/nvidia-smi-loop-load.h100.csv``), stamped now, in
the recorded formats. $STANDIN_MODE picks a fault:

  ok | no-devices | exit-after:N | garbage-after:N | lost-after:N:GPU | vanish-after:N:GPU | hang
"""

import os
import re
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
HELP = (FIXTURES / "nvidia-smi-help-query-gpu.h100.txt").read_text()
VALID = {n for pair in re.findall(r'^"([^"]+)"(?: or "([^"]+)")?', HELP, flags=re.M) for n in pair if n}
RECORDED = [
    line.split(", ") for line in (FIXTURES / "nvidia-smi-loop-load.h100.csv").read_text().splitlines()
]


def main() -> int:
    opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    pid_file = os.environ.get("STANDIN_PID_FILE")
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    fields = opts.get("--query-gpu", "").split(",")
    for field in fields:
        if field not in VALID:
            print(f'Field "{field}" is not a valid field to query.\n', flush=True)
            return 2
    mode, *arg = os.environ.get("STANDIN_MODE", "ok").split(":")
    # The node has GPUs 0-7. As the real tool (recorded on an H200): ids it lacks are left out of the
    # output without an error, and only when none is there does it say so and exit with status 6.
    ids = [i for i in opts.get("--id", "0").split(",") if i.isdigit() and int(i) <= 7]
    if mode == "no-devices" or not ids:
        print("No devices were found", flush=True)
        return 6
    loop = "--loop-ms" in opts  # without it, one sample and done (as the real tool)
    interval = int(opts.get("--loop-ms", "1000")) / 1000
    tick = 0
    while True:
        if mode == "hang":
            time.sleep(3600)
        row = RECORDED[tick % len(RECORDED)]
        now = time.time()
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        if mode == "exit-after" and tick >= int(arg[0]):
            print("Failed to initialize NVML: Driver/library version mismatch", flush=True)
            return 9
        if mode == "garbage-after" and tick == int(arg[0]):
            print("Unable to determine the device handle for GPU0000:18:00.0: Unknown Error", flush=True)
        for gpu in ids:
            if mode == "vanish-after" and tick >= int(arg[0]) and gpu == arg[1]:
                continue
            lost = mode == "lost-after" and tick >= int(arg[0]) and gpu == arg[1]
            values = {
                "timestamp": stamp,
                "index": gpu,
                "uuid": f"GPU-3560572e-d4f9-3a22-8e1a-8204cd87d5{int(gpu):02d}",
                "power.draw": "[GPU is lost]" if lost else row[3],
                "power.draw.instant": row[4],
                "temperature.gpu": row[5],
                "utilization.gpu": row[6],
                "memory.used": row[7],
                "memory.total": row[8],
            }
            print(", ".join(values.get(f, "[N/A]") for f in fields), flush=True)
        tick += 1
        if not loop:
            return 0
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
