"""A stand-in `amd-smi` for the sampler's tests (no AMD GPU here): `amd-smi metric -g IDS ... --json`
prints the documented document (``../fixtures/amd-smi-metric.from-amd-docs.json``) for the GPUs asked,
their energy counters growing with time at their power. $STANDIN_MODE: ok | fail | garbage.
"""

import json
import os
import sys
import time
from pathlib import Path

DOC = json.loads(
    (Path(__file__).resolve().parent.parent / "fixtures" / "amd-smi-metric.from-amd-docs.json").read_text()
)


def main() -> int:
    args = sys.argv[1:]
    mode = os.environ.get("STANDIN_MODE", "ok")
    if mode == "fail":
        print(
            "ERROR:root:Unable to detect any GPU devices, check amdgpu version and module status (sudo modprobe amdgpu)"
        )
        return 1
    if mode == "garbage":
        print("Traceback (most recent call last):\n  amdsmi_exception.AmdSmiLibraryException: Error code: 8")
        return 0
    ids = args[args.index("-g") + 1 : args.index("--power")] if "-g" in args else ["0", "1"]
    out = []
    for gpu in ids:
        item = json.loads(json.dumps(DOC[int(gpu) % 2]))
        item["gpu"] = int(gpu)
        watts = item["power"]["socket_power"]["value"]
        item["energy"] = {
            "total_energy_consumption": {"value": round(watts * (time.time() - 1.7e9), 3), "unit": "J"}
        }
        out.append(item)
    print(json.dumps(out, indent=4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
