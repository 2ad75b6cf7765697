"""The evidence a finished cell's validity is judged on, read once from its result files.

summary.json (the replayer's counts, window and self-audit), requests.jsonl (every finished request,
in one streamed pass) and server_metrics*.csv (the engine's counters: first and last value of each).
Times in requests.jsonl are wall-clock seconds from the run's start; the window is the replayer's
steady window (``window.start_s``/``end_s``, ramp-up and drain excluded), or for an older summary
without them, the span from the last warmup request's finish lasting ``window.duration_s``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kv_cache_tester.replay import RecordReader, RequestRecord, Summary, abandoned_at_end, load_summary

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import REQUESTS_JSONL, SERVER_METRICS_CSV
from agentsweep.errors import ResultFileError
from agentsweep.metrics.scrapes import ScrapeReader

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


@dataclass(frozen=True)
class Evidence:
    """Everything the checks read of one cell, loaded once (``load``)."""

    result_dir: Path
    cell: Cell
    summary: Summary
    records: RecordFacts
    server: ServerFacts
    cached_server: ServerFacts  # the scrapes the client's cached tokens are compared with
    cached_metrics: str  # their file's name
    window_start: float  # record time
    window_end: float
    window_duration: float  # 0: the window is empty

    @property
    def counts(self) -> dict[str, Any]:
        return dict(self.summary.get("counts", {}))

    @property
    def audit(self) -> dict[str, Any]:
        return dict(self.summary.get("self_audit", {}))

    @property
    def window(self) -> dict[str, Any]:
        return dict(self.summary.get("window", {}))


def load(result_dir: Path, cell: Cell, cached_metrics: str = SERVER_METRICS_CSV) -> Evidence:
    """A finished cell's evidence; ResultError when summary.json or requests.jsonl cannot be read.

    The measurement window in record time: the steady window's own bounds where the summary holds
    them; an older summary's window started when the last warmup request finished."""
    summary: Summary = load_summary(result_dir, required=())
    records = read_records(result_dir / REQUESTS_JSONL)
    server = read_server(result_dir / SERVER_METRICS_CSV)
    cached = server if cached_metrics == SERVER_METRICS_CSV else read_server(result_dir / cached_metrics)
    window = summary.get("window", {})
    start = window.get("start_s", max(records.warmup_done, default=0.0))
    duration = window.get("duration_s", 0.0)
    return Evidence(
        result_dir, cell, summary, records, server, cached, cached_metrics,
        start, window.get("end_s", start + duration), duration,
    )  # fmt: skip
