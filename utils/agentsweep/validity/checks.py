"""Is a finished cell's measurement trustworthy? Every check, with its value and limit.

Validity is a tuple of small checks (``CHECKS``), each a function of the cell's loaded evidence
(``validity.evidence``) that gives its named checks, each with its value, its limit and its reason.
The per-client checks of a run over several client processes are the same lag and CPU checks over
each client's slice of the self-audit.

The client/server cross-checks compare whole-run totals: every request the client saw finish (warmup
included) against the engine's counters between the first scrape (before any request) and the last.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from kv_cache_tester.replay import ResultError

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import SERVER_METRICS_CSV
from agentsweep.contract.verdict import Check, Validity
from agentsweep.validity.evidence import Evidence, RecordFacts, load
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

Checks = dict[str, Check]


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


def _lane_idle_limit(cell: Cell) -> float:
    return cell.limits.max_lane_idle_s or cell.replay.max_delay + LANE_IDLE_SLACK_S  # engine clock


# --- the checks, each over the evidence -------------------------------------------------------------


def failed_shares(ev: Evidence) -> Checks:
    """Requests that failed (those still in flight when the run ended included: class stall or
    timeout), and those that exceeded the model's context, as shares of those sent."""
    attempted, failed = ev.counts.get("sent", 0), ev.counts.get("failed", 0)
    limit = ev.cell.limits.max_failed_share
    if attempted == 0:
        return {"failed_share": Check(None, limit, False, "no request in the profiling window")}
    context = ev.counts.get("failed_by_class", {}).get("context_length", 0)
    return {
        "failed_share": _share_check(failed, attempted, limit, "failed or were abandoned in flight"),
        "context_error_share": _share_check(
            context, attempted, ev.cell.limits.max_context_error_share, "exceeded the model's context length"
        ),
    }


def window_requests(ev: Evidence) -> Checks:
    ok, limit = ev.counts.get("ok", 0), ev.cell.limits.min_window_requests
    return {
        "window_requests": Check(
            float(ok),
            float(limit),
            ok >= limit,
            f"only {ok} requests finished ok in the profiling window (limit {limit}): too few "
            "for its percentiles and rates; give the cell a longer duration or more users",
        )
    }


def window_steadiness(ev: Evidence) -> Checks:
    """Tokens arriving through the window, every lane busy, and a steady output rate."""
    cell, start, end = ev.cell, ev.window_start, ev.window_end
    if ev.window_duration <= 0:  # the warm-up requests finished only when the run ended
        return {
            "window_coverage": Check(
                0.0,
                cell.limits.min_window_coverage,
                False,
                "the profiling window is empty: the warm-up requests finished only when the replay ended",
            )
        }
    covered, seconds = _covered_seconds(ev.records.streaming, start, end)
    coverage = covered / seconds
    idle_limit = _lane_idle_limit(cell)
    idle = {
        user: _longest_idle(lane.busy, start, end) * cell.speed for user, lane in ev.records.lanes.items()
    }
    missing = cell.users - len(idle)
    worst = max(idle.values(), default=ev.window_duration * cell.speed)
    stuck = sorted(u for u, s in idle.items() if s > idle_limit)
    return {
        "window_coverage": Check(
            coverage,
            cell.limits.min_window_coverage,
            coverage >= cell.limits.min_window_coverage,
            f"{seconds - covered} of {seconds} window seconds saw no token arrive "
            f"(coverage {coverage:.1%}, limit {cell.limits.min_window_coverage:.0%})",
        ),
        "lanes_active": Check(
            worst,
            idle_limit,
            not stuck and missing <= 0,
            f"{missing} of {cell.users} lanes sent nothing"
            if missing > 0
            else f"lane(s) {', '.join(map(str, stuck[:5]))} idle {worst:.1f} s with nothing in flight "
            f"(limit {idle_limit:g} s)",
        ),
        "throughput_drift": _drift_check(ev.records, start, end, cell.limits.max_throughput_drift),
    }


def _lag_check(lag: float | None, limit: float, who: str, measurer: str) -> Check:
    return Check(
        lag,
        limit,
        lag is not None and lag <= limit,
        f"{measurer} measured no dispatch lag"
        if lag is None
        else f"{who} dispatched {lag * 1000:.0f} ms late at p99 "
        f"(limit {limit * 1000:.0f} ms): the client, not the engine, was the limit",
    )


def _cpu_check(cpu: float | None, limit: float, who: str) -> Check:
    return Check(
        cpu,
        limit,
        cpu is None or cpu <= limit,
        f"{who} used {cpu:.0%} of a core (limit {limit:.0%}): it was the bottleneck"
        if cpu is not None
        else "",
    )


def client_limits(ev: Evidence) -> Checks:
    """The client was not the limit: its dispatch lag and CPU share, and over several client
    processes (nodes) the same two checks over each client's own figures."""
    lag_limit, cpu_limit = ev.cell.limits.max_dispatch_lag_p99_s, ev.cell.limits.max_client_cpu_share
    if ev.cell.clock == "virtual":  # the clock stands still while the client works: it cannot lag
        why = "not judged: on the virtual clock the client's work takes no simulated time"
        return {
            "dispatch_lag_p99": Check(None, lag_limit, True, note=why),
            "client_cpu_share": Check(None, cpu_limit, True, note=why),
        }
    out = {
        "dispatch_lag_p99": _lag_check(
            ev.audit.get("dispatch_lag_s", {}).get("p99"), lag_limit, "the client", "the replayer"
        ),
        "client_cpu_share": _cpu_check(ev.audit.get("client_cpu_share"), cpu_limit, "the client"),
    }
    for key, client in sorted(ev.audit.get("clients", {}).items()):
        who = f"client {key} on {client.get('node')}"
        out[f"dispatch_lag_p99.client{key}"] = _lag_check(
            client.get("dispatch_lag_p99_s"), lag_limit, who, who
        )
        out[f"client_cpu_share.client{key}"] = _cpu_check(client.get("client_cpu_share"), cpu_limit, who)
    return out


def client_clock_share(ev: Evidence) -> Checks:
    """Where the engine stated its own timelines (a simulated cell): the client and HTTP path's
    share of the requests' time."""
    gap = ev.summary.get("engine_clock", {}).get("gap")
    if gap is None:
        return {}
    share, limit = gap.get("e2e_share"), ev.cell.limits.max_client_clock_share
    return {
        "client_clock_share": Check(
            share,
            limit,
            share is not None and share <= limit,
            "no request carried both clocks"
            if share is None
            else f"the client and HTTP path took {share:.1%} of the requests' time against the engine's "
            f"own timelines (limit {limit:.0%}): the engine saw a thinner load than the lanes meant",
        )
    }


def server_agreement(ev: Evidence) -> Checks:
    """The scrapes are whole, and the server's request, prompt-token and cached-token counts agree
    with the client's sums."""
    server, records, cell = ev.server, ev.records, ev.cell
    missing = [c for c in REQUIRED_SERVER_COLUMNS if c not in server.last]
    problem = (
        server.unreadable
        or (f"never scraped {', '.join(missing)}" if missing else "")
        or (f"counters went down: {', '.join(sorted(set(server.decreased)))}" if server.decreased else "")
    )
    if server.rows < 2 and not problem:
        problem = f"only {server.rows} scrape(s)"
    out = {"server_metrics": Check(float(server.rows), None, not problem, problem)}
    if problem:
        return out
    requests = server.delta("requests_finished_total")
    # A request the client gave up at the end of the run may have finished on the server after all:
    # the server's count is right anywhere from the client's finished requests to those plus the
    # abandoned ones.
    seen = float(records.ok_requests)
    if requests is not None and records.abandoned:
        seen = min(max(requests, seen), seen + records.abandoned)
    gap = _gap(seen, requests)
    abandoned = f" (and gave up {records.abandoned} at the end)" if records.abandoned else ""
    out["request_count_gap"] = Check(
        gap,
        cell.limits.max_request_count_gap,
        gap is not None and gap <= cell.limits.max_request_count_gap,
        f"the client saw {records.ok_requests} requests finish{abandoned}, the server counted {_fmt(requests)}",
    )
    if records.prompt_reported:
        prompt = server.delta("prompt_tokens_total")
        gap = _gap(records.prompt_tokens, prompt)
        out["prompt_token_gap"] = Check(
            gap,
            cell.limits.max_prompt_token_gap,
            gap is not None and gap <= cell.limits.max_prompt_token_gap,
            f"the client summed {records.prompt_tokens} prompt tokens, the server counted {_fmt(prompt)}",
        )
    if records.cached_reported:
        hits = ev.cached_server.delta("prefix_cache_hits_total")
        external = ev.cached_server.delta("cpu_cache_hits_total")
        served = None if hits is None else hits + (external or 0.0)
        gap = _gap(records.cached_tokens, served)
        out["cached_token_gap"] = Check(
            gap,
            cell.limits.max_cached_token_gap,
            gap is not None and gap <= cell.limits.max_cached_token_gap,
            f"the client summed {records.cached_tokens} cached tokens, the server counted {_fmt(served)} "
            "prefix-cache hits"
            + ("" if ev.cached_metrics == SERVER_METRICS_CSV else f" ({ev.cached_metrics})"),
        )
    return out


def instances(ev: Evidence) -> Checks:
    """Each instance behind the router on its own (a frozen replica hidden by a healthy one)."""
    window = ev.window
    if not ev.cell.routed or "start_unix" not in window or "end_unix" not in window:
        return {}
    failures = ev.counts.get("sent", 0) + ev.counts.get("warmup", 0) - ev.records.ok_requests
    return instance_checks(
        ev.result_dir,
        ev.cell,
        window["start_unix"],
        window["end_unix"],
        max(failures, 0),
        _lane_idle_limit(ev.cell),
    )


def records_readable(ev: Evidence) -> Checks:
    bad = ev.records.bad_lines
    if not bad:
        return {}
    return {
        "records_readable": Check(float(bad), 0.0, False, f"{bad} lines of requests.jsonl are unreadable")
    }


# Every check, in the order the verdict lists them.
CHECKS: tuple[Callable[[Evidence], Checks], ...] = (
    failed_shares,
    window_requests,
    window_steadiness,
    client_limits,
    client_clock_share,
    server_agreement,
    instances,
    records_readable,
)


def evaluate(result_dir: Path, cell: Cell, cached_metrics: str = SERVER_METRICS_CSV) -> Validity:
    """Run every check on a cell whose replayer finished; never raises for bad file content.

    ``cached_metrics`` names the scrapes whose prefix hits the client's cached tokens are compared
    with: in a prefill/decode cell behind a router that reports the prefill's cached tokens to the
    client, the prefill instances' (``server_metrics.prefill.csv``).
    """
    validity = Validity()
    try:
        evidence = load(result_dir, cell, cached_metrics)
    except ResultError as err:
        validity.checks["results_readable"] = Check(None, None, False, str(err))
        return validity
    for check in CHECKS:
        validity.checks.update(check(evidence))
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
        return Check(drift, limit, True, note=f"not judged: only {finished} requests finished in the window")
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
