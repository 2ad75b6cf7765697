"""`agentsweep results {ingest,runs,curves,history,diff,migrate}`: the results store from the shell.

Every subcommand takes ``--db URL`` (default ``$AGENTSWEEP_DB``, else ``results/agentsweep.db``).
Tables go to stdout, progress to stderr. Bad input (a result without or against its receipt, a
database that is damaged, newer than this code, or does not answer) is one line and exit 2.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from agentsweep.contract.errors import printable
from agentsweep.errors import InputError
from agentsweep.store import ghrun, query
from agentsweep.store.db import DB_ENV_VAR, DEFAULT_DB, Store
from agentsweep.store.ingest import IngestReport, Source, ingest
from agentsweep.store.scope import SCOPE_FIELDS, parse_filter

DB_HELP = f"the store: a SQLAlchemy URL or a SQLite file (default ${DB_ENV_VAR}, else {DEFAULT_DB})"


def add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, metavar="URL", help=DB_HELP)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = sub.add_parser("ingest", help="add result directories (or a workflow run's artifacts) to the store")
    p.add_argument(
        "dirs", nargs="*", type=Path, metavar="DIR", help="collected sweep, cell result dir or zip"
    )
    p.add_argument(
        "--gh-run", metavar="ID", help="download this workflow run's artifacts with gh, then ingest"
    )
    p.add_argument("--repo", metavar="OWNER/NAME", help="the repository of --gh-run (default: gh's)")
    p.add_argument("--label", help="how the run reads in tables (default: the folder's name)")
    p.add_argument("--dry-run", action="store_true", help="with --gh-run: print the gh command, do nothing")
    p.add_argument(
        "--skip-without-receipt",
        action="store_true",
        help="leave out (and list) result dirs that have no receipt instead of refusing the ingest",
    )
    add_db(p)

    p = sub.add_parser("runs", help="list the runs in the store")
    add_db(p)

    p = sub.add_parser("curves", help="curves per scope: points grouped by scope and run")
    p.add_argument("--scope", action="append", metavar="FIELD=VALUE[,...]", help="only these points")
    p.add_argument("--latest", action="store_true", help="only the newest run of each scope")
    p.add_argument("--metric", default="total_tok_per_s_per_gpu", help="the figure listed per point")
    add_db(p)

    p = sub.add_parser("history", help="one metric over the runs, flagged beyond measured noise")
    p.add_argument("--scope", action="append", metavar="FIELD=VALUE[,...]", help="only these points")
    p.add_argument("--metric", required=True, help="a summary.csv column, e.g. ttft_p90_s")
    add_db(p)

    p = sub.add_parser("diff", help="two runs point by point, flagged beyond measured noise")
    p.add_argument("base", help="run id, label or 'latest'")
    p.add_argument("head", help="run id, label or 'latest'")
    p.add_argument("--metric", action="append", help=f"repeatable (default {', '.join(query.DIFF_METRICS)})")
    p.add_argument("--scope", action="append", metavar="FIELD=VALUE[,...]", help="only these points")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when any change is flagged worse, or a SUCCESS point of the base is not SUCCESS in the head",
    )
    add_db(p)

    p = sub.add_parser("migrate", help="bring the store's schema up to date")
    add_db(p)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain fixed-width table."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return printable(str(value))  # labels, names and sources come from the store: never raw control bytes


def _run(run: query.Run) -> str:
    """``<id> (<label>)`` with the label's control characters escaped."""
    return f"{run.id} ({printable(str(run.label))})"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


# --- actions ----------------------------------------------------------------------------------


def _ingest(args: argparse.Namespace, store: Store) -> int:
    if args.gh_run:
        if args.dirs:
            raise InputError("results ingest: give DIR... or --gh-run, not both")
        with tempfile.TemporaryDirectory(prefix="agentsweep-gh-") as tmp:
            into = Path(tmp) / "artifacts"
            cmd = ghrun.download_command(args.gh_run, args.repo, into)
            if args.dry_run:
                print(shlex.join(cmd))
                return 0
            print(f"results: {shlex.join(cmd)}", file=sys.stderr)
            ghrun.download(args.gh_run, args.repo, into)
            label = args.label or f"gh run {args.gh_run}"
            origin = f"workflow run {args.gh_run}" + (f" of {args.repo}" if args.repo else "")
            source = Source(into, label, origin, ghrun.run_key(args.gh_run, args.repo))
            return _report(ingest(store, [source], args.skip_without_receipt), store)
    if args.repo or args.dry_run:
        raise InputError("results ingest: --repo and --dry-run go with --gh-run")
    if not args.dirs:
        raise InputError("results ingest: give at least one DIR (or --gh-run ID)")
    if args.label and len(args.dirs) > 1:
        raise InputError("results ingest: --label names one run; give one DIR with it")
    sources = [Source(d, args.label or d.resolve().name, str(d)) for d in args.dirs]
    return _report(ingest(store, sources, args.skip_without_receipt), store)


def _report(report: IngestReport, store: Store) -> int:
    for line in report.unreceipted:
        print(f"results: {printable(line)}", file=sys.stderr)
    for label, run_id, n in report.runs:
        print(f"results: run {run_id} ({printable(label)}): {n} points added", file=sys.stderr)
    if report.skipped:
        print(f"results: {len(report.skipped)} result(s) already in the store, skipped", file=sys.stderr)
    print(f"results: {report.added} points added to {store.where}", file=sys.stderr)
    return 0


def _runs(store: Store) -> int:
    with store.read() as conn:
        runs = query.list_runs(conn)
    rows = [
        (r.id, r.label, r.started_utc, r.commit and r.commit[:12], r.points, r.success, r.source)
        for r in runs
    ]
    print(table(["run", "label", "started", "commit", "points", "success", "source"], rows))
    return 0


def _curves(args: argparse.Namespace, store: Store) -> int:
    query.check_metric(args.metric)
    where = parse_filter(args.scope)
    with store.read() as conn:
        points = query.load_points(conn, where, metrics=[args.metric])
    rows = []
    for curve in query.curves(points, latest=args.latest):
        values = ", ".join(
            f"tp{p.position['tp']}/u{p.position['users']}="
            + (_cell(p.metrics.get(args.metric)) if p.status == "SUCCESS" else p.status)
            for p in curve.points
        )
        scope = " ".join(f"{k}={curve.scope[k]}" for k in SCOPE_FIELDS if curve.scope[k])
        rows.append((scope, _run(curve.run), curve.run.started_utc, values))
    if not rows:
        print("results: no points match", file=sys.stderr)
        return 0
    print(table(["scope", "run", "started", f"{args.metric} per point"], rows))
    return 0


def _position(point: query.Point) -> str:
    varying = ("offload", "router", "shape", "config_key")
    facts = point.facts
    head = " ".join(f"{k}={facts[k]}" for k in varying if facts.get(k))
    return f"{head} tp{point.position['tp']} ep{point.position['ep']} u{point.position['users']}"


def _history(args: argparse.Namespace, store: Store) -> int:
    query.check_metric(args.metric)
    where = parse_filter(args.scope)
    with store.read() as conn:
        points = query.load_points(conn, where, metrics=[args.metric])
    rows = []
    for line in query.history([p for p in points if p.status == "SUCCESS"], args.metric):
        for point, change in zip(line.points, line.changes, strict=True):
            flag = ""
            if change is not None:
                flag = {
                    True: f"CHANGED {change.direction}".strip(),
                    False: "within noise",
                    None: "not judged",
                }[change.flagged]
            rows.append(
                (
                    _position(point),
                    _run(point.run),
                    point.run.started_utc,
                    point.scope["engine_version"],
                    point.metrics.get(args.metric),
                    _pct(change.relative) if change else "",
                    flag,
                    change.noise if change else "",
                )
            )
    if not rows:
        print("results: no SUCCESS points match", file=sys.stderr)
        return 0
    headers = ["point", "run", "started", "engine", args.metric, "change", "flag", "noise"]
    print(table(headers, rows))
    return 0


def _diff(args: argparse.Namespace, store: Store) -> int:
    metrics = args.metric or list(query.DIFF_METRICS)
    for metric in metrics:  # a misspelt one would compare nothing, and --check would pass vacuously
        query.check_metric(metric)
    where = parse_filter(args.scope)
    with store.read() as conn:
        runs = query.list_runs(conn)
        base, head = query.find_run(runs, args.base, "BASE"), query.find_run(runs, args.head, "HEAD")
        every = query.load_points(conn, where, metrics=metrics)
    pool = [p for p in every if p.status == "SUCCESS"]
    base_points = [p for p in pool if p.run.id == base.id]
    head_points = [p for p in pool if p.run.id == head.id]
    # A point of one side that the other side measured but not successfully is no "only in" point.
    unsuccessful = {(p.run.id, p.identity): p for p in query.measured(every) if p.status != "SUCCESS"}
    rows: list[tuple[object, ...]] = []
    worse = 0
    for pair in query.diff(base_points, head_points, metrics, pool):
        if not pair.changes:
            other = head if pair.head is None else base  # the side without a SUCCESS point
            failed = unsuccessful.get((other.id, pair.point.identity))
            if failed is not None:
                side = "head" if other is head else "base"
                worse += side == "head"  # a point that passed its checks and now does not
                reason = failed.reason[:120]
                rows.append((_position(pair.point), "", "", "", "", f"{failed.status} in {side}", reason))
                continue
            side = "base" if pair.head is None else "head"
            rows.append((_position(pair.point), "", "", "", "", f"only in {side}", ""))
            continue
        for change in pair.changes:
            flag = {True: f"CHANGED {change.direction}".strip(), False: "within noise", None: "not judged"}[
                change.flagged
            ]
            worse += change.direction == "worse"
            rows.append(
                (
                    _position(pair.point),
                    change.metric,
                    change.base,
                    change.head,
                    _pct(change.relative),
                    flag,
                    change.noise,
                )
            )
    print(f"base: run {_run(base)}, head: run {_run(head)}")
    print(table(["point", "metric", "base", "head", "change", "flag", "noise"], rows))
    return 1 if args.check and worse else 0


def run(args: argparse.Namespace) -> int:
    store = Store.open(args.db)
    try:
        if args.action == "ingest":
            return _ingest(args, store)
        if args.action == "runs":
            return _runs(store)
        if args.action == "curves":
            return _curves(args, store)
        if args.action == "history":
            return _history(args, store)
        if args.action == "diff":
            return _diff(args, store)
        if args.action == "migrate":
            applied = store.migrate()
            print(f"results: {store.where}: applied {applied or 'nothing (up to date)'}", file=sys.stderr)
            return 0
        raise InputError(f"results: unknown action {args.action!r}")
    finally:
        store.dispose()
