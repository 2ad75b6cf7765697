"""The router's own figures over the run: ``router_metrics.csv``, one row per scrape of its /metrics.

Columns: ``time_s``, then per engine instance (``r0``, ``p0``, ``d0``, ...) the requests the router has
sent it so far (``requests.<name>``), read by the router recipe from the program's per-worker counter.
It is started beside the engines' metrics collectors and stops the same way (SIGTERM: one last scrape,
then exit 0); a failed scrape leaves a gap, never a row of zeros.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from agentsweep.cell.routers import ROUTERS, router_recipe
from agentsweep.errors import InputError
from agentsweep.metrics.scraper import DEFAULT_MAX_FAILURES, Scraper

FILE_NAME = "router_metrics.csv"


class RouterScraper(Scraper):
    name = "router-metrics-collector"
    file_kind = "a router_metrics.csv"

    def __init__(
        self, endpoint: str, output: Path, program: str, instances: Sequence[tuple[str, str]], interval: float
    ) -> None:
        super().__init__(endpoint, output, interval, max_failures=DEFAULT_MAX_FAILURES)
        self.recipe = router_recipe(program)
        self.instances = list(instances)
        self.columns = ("time_s", *(f"requests.{name}" for name, _ in self.instances))

    def map_text(self, now: float, text: str) -> list[str]:
        if "# TYPE" not in text and "_total" not in text:
            raise ValueError("not Prometheus text")
        by_worker = self.recipe.requests_by_worker(text)
        return [f"{now:.3f}", *(f"{by_worker.get(url, 0.0):g}" for _, url in self.instances)]


def _instance(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected NAME=URL (e.g. r0=http://127.0.0.1:8001), got {text!r}")
    return name, url


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True, help="the router's metrics URL")
    parser.add_argument("--program", required=True, choices=sorted(ROUTERS), help="the router program")
    parser.add_argument(
        "--instance", dest="instances", action="append", type=_instance, required=True,
        help="NAME=URL of an engine instance behind the router (repeat, in the cell's order)",
    )  # fmt: skip
    parser.add_argument("--output", required=True, type=Path, help=f"CSV to append to ({FILE_NAME})")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes (default 1)")


def run(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise InputError(f"--interval: must be > 0, got {args.interval:g}")
    scraper = RouterScraper(args.endpoint, args.output, args.program, args.instances, args.interval)

    scraper.run_until_signalled()
    return 0
