"""Is a finished cell's measurement trustworthy? Every check, with its value and limit.

Inputs are the cell's own result files: summary.json (the replayer's counts, window and self-audit),
requests.jsonl (every finished request) and server_metrics.csv (the engine's counters, the last row
scraped after the replayer stopped). Times in requests.jsonl are wall-clock seconds from the run's
start; the window is the replayer's steady window (``window.start_s``/``end_s``, ramp-up and drain
excluded), or for an older summary without them, the span from the last warmup request's finish
lasting ``window.duration_s``. The drift check judges that window.

The client/server cross-checks compare whole-run totals: every request the client saw finish (warmup
included) against the engine's counters between the first scrape (before any request) and the last.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kv_cache_tester.replay import (
    RecordReader,
    RequestRecord,
    ResultError,
    Summary,
    abandoned_at_end,
    load_summary,
)

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import REQUESTS_JSONL, SERVER_METRICS_CSV
from agentsweep.contract.verdict import Check, Validity
from agentsweep.errors import ResultFileError
from agentsweep.metrics.scrapes import ScrapeReader
from agentsweep.validity.instances import instance_checks

# Engine-neutral server columns a cell must have scraped (at least one value each).
REQUIRED_SERVER_COLUMNS = (
    "requests_finished_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "kv_cache_usage",
)
# Fewer requests than this finishing in the window make a drift figure noise: it is shown, not judged.
MIN_DRIFT_REQUESTS = 30
# Engine seconds a lane may idle beyond the entry's max_delay before it counts as stuck.
LANE_IDLE_SLACK_S = 10.0
# What the checks need of a record to place it in time; a line without them is unreadable.
RECORD_NEEDS = frozenset({"t_dispatch", "t_done"})


@dataclass
class _Lane:
    busy: list[tuple[float, float]] = field(default_factory=list)  # (dispatch, done), wall seconds


@dataclass
class RecordFacts:
    """What the checks need from requests.jsonl, in one pass."""

    warmup_done: list[float] = field(default_factory=list)
    lanes: dict[int, _Lane] = field(default_factory=lambda: defaultdict(_Lane))
    streaming: list[tuple[float, float]] = field(default_factory=list)  # first token .. done (ok)
    ok_done_out: list[tuple[float, int]] = field(default_factory=list)  # (done, output tokens), ok
    ok_requests: int = 0
    abandoned: int = 0  # requests the client gave up at the end of the run: the server may finish them
    prompt_tokens: int = 0
    prompt_reported: int = 0  # ok requests whose prompt size the server reported
    cached_tokens: int = 0
    cached_reported: int = 0
    bad_lines: int = 0


def read_records(path: Path) -> RecordFacts:
    """The facts of a requests.jsonl in one streamed pass; a line that cannot be placed in time (or is
    no record at all) counts in ``bad_lines``. A file that cannot be opened is ResultError."""
    facts = RecordFacts()
    reader = RecordReader(path, required=RECORD_NEEDS)
    for rec in reader:
        _add(facts, rec)
    facts.bad_lines = reader.bad_lines
    return facts


def _add(facts: RecordFacts, rec: RequestRecord) -> None:
    dispatch, done = rec["t_dispatch"], rec["t_done"]
    if rec.get("phase") == "warmup":
        facts.warmup_done.append(done)
    user = rec.get("user")
    if user is not None:
        facts.lanes[user].busy.append((dispatch, done))
    if rec.get("status") != "ok":
        facts.abandoned += abandoned_at_end(rec)
        return
    facts.ok_requests += 1
    ttft = rec.get("ttft_s")
    if ttft is not None:
        facts.streaming.append((dispatch + ttft, done))
    facts.ok_done_out.append((done, rec.get("output_tokens") or 0))
    prompt = rec.get("prompt_tokens")
    if rec.get("prompt_tokens_source") == "server" and prompt is not None:
        facts.prompt_tokens += prompt
        facts.prompt_reported += 1
        cached = rec.get("cached_tokens")
        if cached is not None:
            facts.cached_tokens += cached
            facts.cached_reported += 1


@dataclass
class ServerFacts:
    """The scraped counters: first and last value of each column, and which went down."""

    rows: int = 0
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    decreased: list[str] = field(default_factory=list)
    unreadable: str = ""

    def delta(self, column: str) -> float | None:
        if column not in self.first or column not in self.last:
            return None
        return self.last[column] - self.first[column]


def read_server(path: Path) -> ServerFacts:
    """First and last value of every column of a server_metrics*.csv, read through its one reader."""
    facts = ServerFacts()
    try:
        for scrape in ScrapeReader(path):
            facts.rows += 1
            if scrape.not_number is not None:
                column, text = scrape.not_number
                facts.unreadable = f"{column}={text[:40]!r} is not a number"
            for column, value in scrape.values.items():
                if value is None:
                    continue
                if column.endswith("_total") and value < facts.last.get(column, value):
                    facts.decreased.append(column)
                facts.first.setdefault(column, value)
                facts.last[column] = value
    except ResultFileError as err:
        facts.unreadable = str(err)
    return facts


def _covered_seconds(intervals: list[tuple[float, float]], start: float, end: float) -> tuple[int, int]:
    """(seconds of [start, end) that overlap any interval, all seconds), seconds counted from start.

    A last part-second shorter than half a second is not a second of its own (a 4.0001 s window has 4).
    """
    total = max(1, round(end - start))
    hit = [False] * total
    for lo, hi in intervals:
        lo, hi = max(lo, start), min(hi, end)
        if hi < lo:
            continue
        first = int((lo - start) // 1)
        last = min(total - 1, int((hi - start) // 1))
        for i in range(max(0, first), last + 1):
            hit[i] = True
    return sum(hit), total


def _longest_idle(busy: list[tuple[float, float]], start: float, end: float) -> float:
    """Longest stretch of [start, end] with none of the lane's requests in flight."""
    longest, cursor = 0.0, start
    for lo, hi in sorted(busy):
        if lo > cursor:
            longest = max(longest, min(lo, end) - cursor)
        cursor = max(cursor, hi)
        if cursor >= end:
            break
    return max(longest, end - cursor)


def _gap(client: float, server: float | None) -> float | None:
    if server is None:
        return None
    return abs(server - client) / max(client, 1.0)


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f}"


def _share_check(count: int, of: int, limit: float, what: str) -> Check:
    share = count / of
    return Check(
        share, limit, share <= limit, f"{count} of {of} requests {what} ({share:.1%}, limit {limit:.1%})"
    )


def evaluate(result_dir: Path, cell: Cell, cached_metrics: str = SERVER_METRICS_CSV) -> Validity:
    """Run every check on a cell whose replayer finished; never raises for bad file content.

    ``cached_metrics`` names the scrapes whose prefix hits the client's cached tokens are compared
    with: in a prefill/decode cell behind a router that reports the prefill's cached tokens to the
    client, the prefill instances' (``server_metrics.prefill.csv``).
    """
    validity = Validity()
    checks = validity.checks
    try:
        summary: Summary = load_summary(result_dir, required=())
        records = read_records(result_dir / REQUESTS_JSONL)
    except ResultError as err:
        checks["results_readable"] = Check(None, None, False, str(err))
        return validity
    counts = summary.get("counts", {})
    audit = summary.get("self_audit", {})
    window = summary.get("window", {})
    server = read_server(result_dir / SERVER_METRICS_CSV)
    cached_server = (
        server if cached_metrics == SERVER_METRICS_CSV else read_server(result_dir / cached_metrics)
    )

    # Requests still in flight when the run ended are failure records (class stall or timeout).
    attempted = counts.get("sent", 0)
    failed = counts.get("failed", 0)
    if attempted == 0:
        checks["failed_share"] = Check(
            None, cell.max_failed_share, False, "no request in the profiling window"
        )
    else:
        checks["failed_share"] = _share_check(
            failed, attempted, cell.max_failed_share, "failed or were abandoned in flight"
        )
        context = counts.get("failed_by_class", {}).get("context_length", 0)
        checks["context_error_share"] = _share_check(
            context, attempted, cell.max_context_error_share, "exceeded the model's context length"
        )

    ok = counts.get("ok", 0)
    checks["window_requests"] = Check(
        float(ok),
        float(cell.min_window_requests),
        ok >= cell.min_window_requests,
        f"only {ok} requests finished ok in the profiling window (limit {cell.min_window_requests}): too few "
        "for its percentiles and rates; give the cell a longer duration or more users",
    )

    # The measurement window in record time: the steady window's own bounds where the summary holds
    # them; an older summary's window started when the last warmup request finished.
    w_start = window.get("start_s", max(records.warmup_done, default=0.0))
    duration = window.get("duration_s", 0.0)
    w_end = window.get("end_s", w_start + duration)
    if duration > 0:
        covered, seconds = _covered_seconds(records.streaming, w_start, w_end)
        coverage = covered / seconds
        checks["window_coverage"] = Check(
            coverage,
            cell.min_window_coverage,
            coverage >= cell.min_window_coverage,
            f"{seconds - covered} of {seconds} window seconds saw no token arrive "
            f"(coverage {coverage:.1%}, limit {cell.min_window_coverage:.0%})",
        )
        idle_limit = cell.max_lane_idle_s or cell.max_delay + LANE_IDLE_SLACK_S  # engine clock
        idle = {
            user: _longest_idle(lane.busy, w_start, w_end) * cell.speed
            for user, lane in records.lanes.items()
        }
        missing = cell.users - len(idle)
        worst = max(idle.values(), default=duration * cell.speed)
        stuck = sorted(u for u, s in idle.items() if s > idle_limit)
        checks["lanes_active"] = Check(
            worst,
            idle_limit,
            not stuck and missing <= 0,
            f"{missing} of {cell.users} lanes sent nothing"
            if missing > 0
            else f"lane(s) {', '.join(map(str, stuck[:5]))} idle {worst:.1f} s with nothing in flight "
            f"(limit {idle_limit:g} s)",
        )
        checks["throughput_drift"] = _drift_check(records, w_start, w_end, cell.max_throughput_drift)
    else:  # the warm-up requests finished only when the run ended: nothing was measured
        checks["window_coverage"] = Check(
            0.0,
            cell.min_window_coverage,
            False,
            "the profiling window is empty: the warm-up requests finished only when the replay ended",
        )

    lag = audit.get("dispatch_lag_s", {}).get("p99")
    checks["dispatch_lag_p99"] = Check(
        lag,
        cell.max_dispatch_lag_p99_s,
        lag is not None and lag <= cell.max_dispatch_lag_p99_s,
        "the replayer measured no dispatch lag"
        if lag is None
        else f"the client dispatched {lag * 1000:.0f} ms late at p99 "
        f"(limit {cell.max_dispatch_lag_p99_s * 1000:.0f} ms): the client, not the engine, was the limit",
    )
    cpu = audit.get("client_cpu_share")
    checks["client_cpu_share"] = Check(
        cpu,
        cell.max_client_cpu_share,
        cpu is None or cpu <= cell.max_client_cpu_share,
        f"the client used {cpu:.0%} of a core (limit {cell.max_client_cpu_share:.0%}): it was the bottleneck"
        if cpu is not None
        else "",
    )
    # A run over several client processes (nodes): each client's own lag and CPU, judged alike.
    for key, client in sorted(audit.get("clients", {}).items()):
        who = f"client {key} on {client.get('node')}"
        lag_k, cpu_k = client.get("dispatch_lag_p99_s"), client.get("client_cpu_share")
        checks[f"dispatch_lag_p99.client{key}"] = Check(
            lag_k,
            cell.max_dispatch_lag_p99_s,
            lag_k is not None and lag_k <= cell.max_dispatch_lag_p99_s,
            f"{who} measured no dispatch lag"
            if lag_k is None
            else f"{who} dispatched {lag_k * 1000:.0f} ms late at p99 "
            f"(limit {cell.max_dispatch_lag_p99_s * 1000:.0f} ms): the client, not the engine, was the limit",
        )
        checks[f"client_cpu_share.client{key}"] = Check(
            cpu_k,
            cell.max_client_cpu_share,
            cpu_k is None or cpu_k <= cell.max_client_cpu_share,
            f"{who} used {cpu_k:.0%} of a core (limit {cell.max_client_cpu_share:.0%}): it was the bottleneck"
            if cpu_k is not None
            else "",
        )
    gap = summary.get("engine_clock", {}).get("gap")
    if gap is not None:  # the engine stated its own timelines (a simulated cell)
        share = gap.get("e2e_share")
        checks["client_clock_share"] = Check(
            share,
            cell.max_client_clock_share,
            share is not None and share <= cell.max_client_clock_share,
            "no request carried both clocks"
            if share is None
            else f"the client and HTTP path took {share:.1%} of the requests' time against the engine's "
            f"own timelines (limit {cell.max_client_clock_share:.0%}): the engine saw a thinner load "
            "than the lanes meant",
        )
    _server_checks(checks, server, records, cell, cached_server, cached_metrics)
    if cell.routed and "start_unix" in window and "end_unix" in window:
        # Each instance behind the router on its own (a frozen replica hidden by a healthy one).
        failures = counts.get("sent", 0) + counts.get("warmup", 0) - records.ok_requests
        checks.update(
            instance_checks(
                result_dir,
                cell,
                window["start_unix"],
                window["end_unix"],
                max(failures, 0),
                cell.max_lane_idle_s or cell.max_delay + LANE_IDLE_SLACK_S,
            )
        )
    if records.bad_lines:
        checks["records_readable"] = Check(
            float(records.bad_lines),
            0.0,
            False,
            f"{records.bad_lines} lines of requests.jsonl are unreadable",
        )
    return validity


def _drift_check(records: RecordFacts, start: float, end: float, limit: float) -> Check:
    third = (end - start) / 3
    tokens = [0.0, 0.0, 0.0]
    finished, square_sum = 0, 0.0
    for done, out in records.ok_done_out:
        if start <= done <= end:
            tokens[min(2, int((done - start) // third))] += out
            finished += 1
            square_sum += out * out
    mean = sum(tokens) / 3
    if mean <= 0:
        return Check(None, limit, False, "no output token in the window")
    drift = (max(tokens) - min(tokens)) / mean
    shown = " / ".join(f"{t / third:.0f}" for t in tokens)
    if finished < MIN_DRIFT_REQUESTS:
        return Check(drift, limit, True, f"not judged: only {finished} requests finished in the window")
    # In a steady state a third's tokens are a sum of about finished/3 request sizes: the difference
    # of two thirds has a spread of sqrt(2 * finished/3 * E[size^2]). Few large requests make a large
    # drift by chance alone; only a drift beyond three such spreads says the load changed.
    noise = 3 * math.sqrt(2 * finished / 3 * (square_sum / finished))
    if max(tokens) - min(tokens) <= noise:
        return Check(drift, limit, True, f"within the noise of {finished} requests' sizes")
    return Check(
        drift,
        limit,
        drift <= limit,
        f"output tokens/s per third of the window {shown} drift {drift:.0%} (limit {limit:.0%}): "
        "not a steady state",
    )


def _server_checks(
    checks: dict[str, Check],
    server: ServerFacts,
    records: RecordFacts,
    cell: Cell,
    cached_server: ServerFacts,
    cached_metrics: str,
) -> None:
    missing = [c for c in REQUIRED_SERVER_COLUMNS if c not in server.last]
    problem = (
        server.unreadable
        or (f"never scraped {', '.join(missing)}" if missing else "")
        or (f"counters went down: {', '.join(sorted(set(server.decreased)))}" if server.decreased else "")
    )
    if server.rows < 2 and not problem:
        problem = f"only {server.rows} scrape(s)"
    checks["server_metrics"] = Check(float(server.rows), None, not problem, problem)
    if problem:
        return
    requests = server.delta("requests_finished_total")
    # A request the client gave up at the end of the run may have finished on the server after all:
    # the server's count is right anywhere from the client's finished requests to those plus the
    # abandoned ones.
    seen = float(records.ok_requests)
    if requests is not None and records.abandoned:
        seen = min(max(requests, seen), seen + records.abandoned)
    gap = _gap(seen, requests)
    abandoned = f" (and gave up {records.abandoned} at the end)" if records.abandoned else ""
    checks["request_count_gap"] = Check(
        gap,
        cell.max_request_count_gap,
        gap is not None and gap <= cell.max_request_count_gap,
        f"the client saw {records.ok_requests} requests finish{abandoned}, the server counted {_fmt(requests)}",
    )
    if records.prompt_reported:
        prompt = server.delta("prompt_tokens_total")
        gap = _gap(records.prompt_tokens, prompt)
        checks["prompt_token_gap"] = Check(
            gap,
            cell.max_prompt_token_gap,
            gap is not None and gap <= cell.max_prompt_token_gap,
            f"the client summed {records.prompt_tokens} prompt tokens, the server counted {_fmt(prompt)}",
        )
    if records.cached_reported:
        hits = cached_server.delta("prefix_cache_hits_total")
        external = cached_server.delta("cpu_cache_hits_total")
        served = None if hits is None else hits + (external or 0.0)
        gap = _gap(records.cached_tokens, served)
        checks["cached_token_gap"] = Check(
            gap,
            cell.max_cached_token_gap,
            gap is not None and gap <= cell.max_cached_token_gap,
            f"the client summed {records.cached_tokens} cached tokens, the server counted {_fmt(served)} "
            "prefix-cache hits" + ("" if cached_metrics == SERVER_METRICS_CSV else f" ({cached_metrics})"),
        )
