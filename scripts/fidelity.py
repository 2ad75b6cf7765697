"""Replay fidelity: does the server cache what the traces say it should, and count what we sent?

One table row per run, from the replayer's requests.jsonl and the server's /metrics counters (taken
on a fresh server, so they hold this run alone):

- ``cached`` = server prefix-cache hit tokens / server prompt tokens (/metrics);
- ``theoretical`` = the replayer's block-weighted infinite-cache rate over every request the server
  accepted (warmup included, as the server counts those too; docs/traces.md);
- prompt tokens: the client's sum of the usage each request reported, the server's counter, and the
  per-request overhead over the trace's ``in`` (the chat template: 0 for completions).

Benchmark against the simulated engine (rerunnable)::

    .venv/bin/python scripts/fidelity.py sim --fail-rate 0.1 --duration 120 --users 4

``run_check.py`` (make test-vllm-cpu) imports ``measure`` and ``gate`` for its real-vLLM cells.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from kv_cache_tester.replay import RequestRecord, accepted, read_records

REPO = Path(__file__).resolve().parents[1]
GATE_PP = 0.5  # |cached - theoretical| in percentage points


@dataclass
class Fidelity:
    name: str
    api: str
    requests: int  # recorded
    accepted: int  # the server took them (prefill happened)
    failed: int
    retries: int
    cached: float | None  # server hit tokens / server prompt tokens
    theoretical: float | None
    client_prompt: int  # sum of usage prompt_tokens (accepted requests that reported usage)
    server_prompt: int | None
    client_cached: int  # sum of usage cached_tokens
    server_cached: int | None
    overheads: list[int]  # distinct (usage prompt_tokens - trace in) values
    unreported: int  # accepted requests without usage (cut off): their tokens are in no client sum

    @property
    def gap_pp(self) -> float | None:
        if self.cached is None or self.theoretical is None:
            return None
        return 100.0 * (self.cached - self.theoretical)


def measure(name: str, api: str, records: list[RequestRecord], server: dict[str, float | None]) -> Fidelity:
    """One row from the run's records and the server's counters (mapped /metrics columns)."""
    acc = [r for r in records if accepted(r)]
    reported = [r for r in acc if r.get("prompt_tokens_source") == "server"]
    blocks = sum(r.get("total_blocks") or 0 for r in acc)
    hits = sum(r.get("theoretical_hit_blocks") or 0 for r in acc)
    s_prompt = server.get("prompt_tokens_total")
    s_hits = server.get("prefix_cache_hits_total")
    return Fidelity(
        name=name,
        api=api,
        requests=len(records),
        accepted=len(acc),
        failed=sum(1 for r in records if r.get("status") != "ok"),
        retries=sum(r.get("retries") or 0 for r in records),
        cached=(s_hits / s_prompt) if s_hits is not None and s_prompt else None,
        theoretical=(hits / blocks) if blocks else None,
        client_prompt=sum(r["prompt_tokens"] or 0 for r in reported),
        server_prompt=int(s_prompt) if s_prompt is not None else None,
        client_cached=sum(r.get("cached_tokens") or 0 for r in reported),
        server_cached=int(s_hits) if s_hits is not None else None,
        overheads=sorted({(r["prompt_tokens"] or 0) - (r["expected_prompt_tokens"] or 0) for r in reported}),
        unreported=len(acc) - len(reported),
    )


def gate(row: Fidelity, prefix_caching: bool = True) -> list[str]:
    """Why ``row`` fails the fidelity gate (empty when it passes)."""
    problems = []
    if not row.accepted:
        problems.append("no request was accepted")
    if prefix_caching:
        if row.gap_pp is None or abs(row.gap_pp) > GATE_PP:
            problems.append(f"cached vs theoretical: {_pp(row.gap_pp)} (limit {GATE_PP} pp)")
    elif row.server_cached:
        problems.append(f"{row.server_cached} cached tokens without prefix caching")
    if row.server_prompt != row.client_prompt:
        problems.append(f"server prompt tokens {row.server_prompt} != client sum {row.client_prompt}")
    if row.server_cached is not None and prefix_caching and row.server_cached != row.client_cached:
        problems.append(f"server cached tokens {row.server_cached} != client sum {row.client_cached}")
    if row.unreported:
        problems.append(f"{row.unreported} accepted requests without usage (cut off): sums not comparable")
    if len(row.overheads) != 1 or row.overheads[0] < 0 or (row.api == "completions" and row.overheads[0]):
        problems.append(f"prompt tokens over the trace's `in`: {row.overheads} (expected one fixed value)")
    return problems


def _pp(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f} pp"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f} %"


def table(rows: list[Fidelity]) -> str:
    head = "| cell | API | accepted/sent | cached | theoretical | gap | prompt tok client / server | template tok |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.api} | {r.accepted}/{r.requests} | {_pct(r.cached)} | {_pct(r.theoretical)} | "
            f"{_pp(r.gap_pp)} | {r.client_prompt} / {r.server_prompt} | {','.join(map(str, r.overheads))} |"
        )
    return "\n".join(lines)


def scrape(url: str) -> dict[str, float | None]:
    sys.path.insert(0, str(REPO / "utils"))
    from agentsweep.metrics.dialects import map_text

    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        _, row = map_text(resp.read().decode())
    return row


# --- the simulated-engine benchmark -----------------------------------------------------------


@contextlib.contextmanager
def engine_sim(flags: list[str]) -> Iterator[str]:
    sim = Path(sys.executable).parent / "agentsweep"
    proc = subprocess.Popen(
        [str(sim), "engine-sim", "sim-model", "--host", "127.0.0.1", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"running on (http://127\.0\.0\.1:\d+)", line)
            if m:
                yield m.group(1)
                return
        raise SystemExit("fidelity: engine-sim did not start")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def sim(args: argparse.Namespace) -> int:
    flags = [
        "--speed", str(args.speed), "--num-gpu-blocks-override", str(args.gpu_blocks),
        "--fail-rate", str(args.fail_rate), "--seed", str(args.seed),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, engine_sim(flags) as url:
        out = Path(tmp) / "out"
        cmd = [
            sys.executable, "-m", "kv_cache_tester.cli", "replay", "--api-endpoint", url,
            "--trace-directory", str(args.traces), "--output-dir", str(out), "--max-users", str(args.users),
            "--test-duration", str(args.duration / args.speed), "--time-scale", str(1 / args.speed),
            "--recycle", "--api", args.api, "--no-color", "--no-plot", "--max-context", str(args.max_context),
            "--grace-period", "60", "--seed", str(args.seed),
        ]  # fmt: skip
        t0 = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr, file=sys.stderr)
            return res.returncode
        row = measure(
            f"sim fail-rate {args.fail_rate}", args.api, read_records(out / "requests.jsonl"), scrape(url)
        )
    print(table([row]))
    print(f"failed {row.failed}, retries {row.retries}; wall {time.monotonic() - t0:.0f} s")
    problems = gate(row)
    for p in problems:
        print(f"fidelity: FAIL: {p}", file=sys.stderr)
    if args.json:
        print(json.dumps(asdict(row)))
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sim", help="replay against the simulated engine (large cache) and compare")
    p.add_argument("--traces", type=Path, default=REPO / "kv-cache-tester" / "sample_traces")
    p.add_argument("--fail-rate", type=float, default=0.1)
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--duration", type=float, default=120.0, help="simulated seconds")
    p.add_argument("--speed", type=float, default=20.0)
    p.add_argument("--gpu-blocks", type=int, default=400_000, help="large: nothing is evicted")
    p.add_argument("--max-context", type=int, default=60000)
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = parser.parse_args()
    return sim(args)


if __name__ == "__main__":
    sys.exit(main())
