"""Poll an engine's /metrics and append one engine-neutral row per successful scrape.

A failed scrape (refused, timeout, HTTP error, unparsable text) is counted and leaves a gap in
the CSV; it never becomes a row of zeros. The dialect is fixed by the first successful scrape.

The collector starts once the engine is healthy, so failures in a row mean the endpoint is dead,
refusing, or not a metrics endpoint: after ``max_failures`` of them it gives up with one line
(exit 2 when no scrape ever succeeded, 1 when the target went away part way) instead of scraping
forever. One reply is read for at most ``timeout`` seconds in all and MAX_REPLY_BYTES.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from agentsweep.errors import InputError, RunError, WriteError
from agentsweep.metrics.dialects import COLUMNS, Exposition, format_row, map_text_sources, parse_exposition
from agentsweep.metrics.kv_events import Listener
from agentsweep.watchdog import stop_on_signal

DEFAULT_MAX_FAILURES = 10
MAX_REPLY_BYTES = 32 << 20  # a busy vLLM's /metrics is a few hundred KiB


def append_whole(fd: int, data: bytes, path: Path) -> None:
    """``data`` appended to the ``O_APPEND`` descriptor ``fd`` in full or not at all: a short write (a
    full disk) is cut back off the file and raises the OSError naming ``path``."""
    done = 0
    try:
        while done < len(data):
            done += os.write(fd, data[done:])
    except OSError as err:
        if done:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - done))
        raise OSError(err.errno, err.strerror, str(path)) from err


@dataclass
class ScrapeStats:
    ok: int = 0
    failed: int = 0
    in_a_row: int = 0  # consecutive failures since the last success
    last_error: str | None = None


class Scraper:
    """Scrape ``endpoint`` every ``interval`` seconds into ``output`` until ``stop`` is set.

    Rows have ``columns`` (the engine-neutral server_metrics.csv columns); a subclass with other
    columns overrides ``columns`` and ``map_text``.
    """

    columns: tuple[str, ...] = COLUMNS
    name = "metrics-collector"
    file_kind = "a server_metrics.csv"

    def __init__(
        self,
        endpoint: str,
        output: Path,
        interval: float = 1.0,
        timeout: float | None = None,
        dialect: str | None = None,
        log: TextIO = sys.stderr,
        max_failures: int = DEFAULT_MAX_FAILURES,
        kv_events: Listener | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.output = output
        self.interval = interval
        self.timeout = timeout if timeout is not None else max(1.0, min(10.0, 2 * interval))
        self.dialect = dialect
        self.max_failures = max_failures
        self.stats = ScrapeStats()
        self.sources: dict[str, str] = {}
        self.stop = threading.Event()
        self._log = log
        # The engine's KV-cache events, counted beside the scrapes: evicted_tokens_total (vLLM).
        self.kv_events = kv_events

    def _fetch(self) -> str:
        """The reply body; a reply that trickles past ``timeout`` or grows past MAX_REPLY_BYTES fails."""
        deadline = time.monotonic() + self.timeout
        req = urllib.request.Request(self.endpoint, headers={"Accept": "text/plain"})
        chunks: list[bytes] = []
        size = 0
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            while chunk := resp.read1(1 << 16):
                size += len(chunk)
                if size > MAX_REPLY_BYTES:
                    raise ValueError(f"reply larger than {MAX_REPLY_BYTES >> 20} MiB")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reply not complete within {self.timeout:g} s")
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")

    def _note_failure(self, err: BaseException) -> None:
        self.stats.failed += 1
        self.stats.in_a_row += 1
        text = " ".join(f"{type(err).__name__}: {err}".split())
        self.stats.last_error = text if len(text) <= 160 else text[:157] + "..."
        # After a success: the first failure of each streak. Before any success nothing until the
        # give-up line (or every 30th, with a large --max-failures): the failure is then that line.
        if (self.stats.ok and self.stats.in_a_row == 1) or self.stats.failed % 30 == 0:
            print(
                f"{self.name}: scrape {self.endpoint} failed ({self.stats.in_a_row} in a row, "
                f"{self.stats.failed} in all): {self.stats.last_error}",
                file=self._log,
                flush=True,
            )

    def _give_up(self) -> None:
        """Raise the one-line error once ``max_failures`` scrapes in a row have failed."""
        stats = self.stats
        if stats.in_a_row < self.max_failures:
            return
        what = f"{self.endpoint}: gave up after {stats.in_a_row} failed scrapes in a row"
        if stats.ok == 0:
            raise InputError(f"{what}, none succeeded (last error: {stats.last_error})")
        raise RunError(f"{what} ({stats.ok} rows written before; last error: {stats.last_error})")

    def scrape_once(self) -> list[str] | None:
        """One scrape mapped to a CSV row, or None when it failed. Unknown dialect raises InputError."""
        try:
            text = self._fetch()
        except (urllib.error.URLError, OSError, TimeoutError, ValueError) as err:
            self._note_failure(err)
            return None
        now = time.time()
        try:
            row = self.map_text(now, text)
        except InputError:
            raise
        except ValueError as err:  # not Prometheus text (a proxy page, a truncated body)
            self._note_failure(err)
            return None
        self.stats.ok += 1
        self.stats.in_a_row = 0
        return row

    def map_text(self, now: float, text: str) -> list[str]:
        """One row from one reply (ValueError: not a metrics reply; InputError: unknown dialect)."""
        return self.map_exposition(now, parse_exposition(text))

    def map_exposition(self, now: float, expo: Exposition) -> list[str]:
        """One row from one exposition read (InputError: unknown dialect)."""
        dialect, values, sources = map_text_sources(expo, self.dialect)
        if self.kv_events is not None:
            evicted, why = self.kv_events.snapshot().evicted_tokens()
            values["evicted_tokens_total"] = evicted
            sources["evicted_tokens_total"] = (
                f"KV-cache events (BlockRemoved, GPU) received on {self.kv_events.endpoint}"
                if evicted is not None
                else f"absent: {why}"
            )
        if self.dialect is None:
            self.dialect = dialect
            print(
                f"metrics-collector: {self.endpoint} speaks the {dialect} dialect", file=self._log, flush=True
            )
        if sources != self.sources:
            self.sources = sources
            self._write_sources(dialect)
        return format_row(now, values)

    @property
    def sources_path(self) -> Path:
        return self.output.with_name(self.output.stem + ".sources.json")

    def _write_sources(self, dialect: str) -> None:
        """server_metrics.sources.json: per column, the metric it was read from or why it is absent
        (rewritten whole, atomically, when that changes; a column can appear part way)."""
        tmp = self.sources_path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"dialect": dialect, "columns": self.sources}, indent=2) + "\n")
            os.replace(tmp, self.sources_path)
        except OSError as err:
            tmp.unlink(missing_ok=True)  # a full disk leaves no temporary file
            print(f"metrics-collector: cannot write {self.sources_path}: {err}", file=self._log, flush=True)

    def _check_output(self) -> bool:
        """True for a new (absent or empty) file; an existing one must be a server_metrics.csv.

        Appending rows to some other file would both damage it and leave a CSV collect cannot read.
        """
        try:
            if not self.output.exists() or self.output.stat().st_size == 0:
                return True
            with self.output.open("rb") as fh:
                first = fh.readline(4096)
        except OSError as err:
            raise InputError(f"--output {self.output}: cannot read: {err.strerror or err}") from None
        header = ",".join(self.columns)
        if first.rstrip(b"\r\n").decode("utf-8", errors="replace") != header:
            raise InputError(
                f"--output {self.output}: exists and is not {self.file_kind} "
                f"(first line is not the {self.columns[0]},... header); refusing to append to it"
            )
        return False

    def run_until_signalled(self) -> ScrapeStats:
        """``run`` until SIGTERM or SIGINT (then one last scrape), and say what was written; stop
        signals after the first are ignored (``watchdog.stop_on_signal``)."""
        with stop_on_signal(self.stop):
            stats = self.run()
        print(
            f"{self.name}: stopped; {stats.ok} rows written to {self.output}, {stats.failed} scrapes failed",
            file=sys.stderr,
        )
        return stats

    def run(self) -> ScrapeStats:
        """Scrape until ``stop`` is set (plus one final scrape); every row is on disk as written.

        A row the disk has no room for is cut back off (the file keeps whole rows) and the scraper
        stops with one line naming the file (WriteError).
        """
        fd = self.open_output()
        if self.kv_events is not None:
            self.kv_events.start()
        try:
            next_tick = time.monotonic()
            while True:
                # Scrape once more after a stop request: the last row then holds the counters
                # as they stood when the replay ended.
                stopping = self.stop.is_set()
                row = self.scrape_once()
                if row is not None:
                    self._append(fd, row)
                if stopping:
                    break
                self._give_up()
                next_tick += self.interval
                delay = next_tick - time.monotonic()
                if delay < 0:  # a slow scrape: skip the missed ticks instead of bursting
                    next_tick = time.monotonic()
                    delay = 0.0
                self.stop.wait(delay)
        finally:
            os.close(fd)
            if self.kv_events is not None:
                counts = self.kv_events.stop()
                print(
                    f"{self.name}: KV-cache events: {counts.batches} batches, {counts.removed_blocks} GPU "
                    f"blocks evicted, {counts.missing} messages missing, first sequence {counts.first_seq}",
                    file=self._log,
                    flush=True,
                )
        return self.stats

    def open_output(self) -> int:
        """Open the CSV for appending (its header written when new); the caller closes the fd."""
        new_file = self._check_output()
        try:
            self.output.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except FileExistsError:  # mkdir met a file where the folder should be
            raise InputError(f"--output {self.output}: {self.output.parent} is not a directory") from None
        except OSError as err:
            raise InputError(f"--output {self.output}: cannot write: {err.strerror or err}") from None
        if new_file:
            try:
                self._append(fd, self.columns)
            except BaseException:
                os.close(fd)
                raise
        return fd

    def record(self, fd: int, now: float, expo: Exposition) -> None:
        """One exposition read in this process (``dialects.read_families``) at Unix time ``now``,
        appended as a row (an in-process scrape)."""
        self._append(fd, self.map_exposition(now, expo))
        self.stats.ok += 1

    def _append(self, fd: int, row: Sequence[object]) -> None:
        line = io.StringIO()
        csv.writer(line).writerow(row)
        try:
            append_whole(fd, line.getvalue().encode("utf-8"), self.output)
        except OSError as err:
            raise WriteError(self.output, err) from None
