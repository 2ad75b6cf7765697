"""One run made by several client processes (``--client-count N``, on several nodes): each writes its
own output directory, and ``merge_clients`` joins them into one requests.jsonl and one summary.json.

Every client started its lanes at one common instant (``--start-at``), ran the lanes and traces
whose index modulo N is its own (so no trace is live twice), and left ``run_meta.json`` beside its
records: the RunMeta of each of its processes (what the summary needs beyond the records), and the
node it ran on. The merge moves every client's times onto the earliest client's clock start (their
start instants differ by the clocks' and the wake-ups' spread, which the merged
``first_dispatch_spread_s`` shows), streams the records into one file, and builds the summary from
them as one run's. The self-audit then holds each client's own (``self_audit.clients``: its node,
CPU share of its core and dispatch lag), so the client-side checks are made per client node, and
``client_cpu_share`` is the busiest client's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kv_cache_tester.inputfiles import InputFileProblem, read_limited
from kv_cache_tester.replay.results import (
    REQUESTS_FILE,
    ClientAudit,
    RecordReader,
    RequestRecord,
    ResultError,
    Summary,
    load_summary,
    write_records,
    write_summary,
)
from kv_cache_tester.replay.summary import RunMeta, build_summary

RUN_META_FILE = "run_meta.json"
RUN_META_MAX_BYTES = 16 << 20  # a few KiB per process (its ITL histogram's buckets)


def write_run_metas(out: Path, index: int, metas: Sequence[RunMeta]) -> Path:
    """``out``/run_meta.json: this client's index, node and the RunMeta of each of its processes."""
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    doc = {"client_index": index, "node": node, "metas": [dataclasses.asdict(m) for m in metas]}
    path = out / RUN_META_FILE
    tmp = out / (RUN_META_FILE + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return path


@dataclasses.dataclass(frozen=True)
class ClientRun:
    """One client's output directory, read back."""

    path: Path
    index: int
    node: str
    metas: list[RunMeta]
    summary: Summary

    @property
    def t0_unix(self) -> float:
        return min(m.t0_unix for m in self.metas)


def read_client(path: Path) -> ClientRun:
    """A client's directory (run_meta.json and summary.json); ResultError naming the file and field."""
    where = f"{path.name}/{RUN_META_FILE}"
    try:
        doc = json.loads(
            read_limited(path / RUN_META_FILE, RUN_META_MAX_BYTES, follow_links=False).decode("utf-8")
        )
    except InputFileProblem as err:
        raise ResultError(f"{where}: {err}") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise ResultError(f"{where}: not JSON ({err})") from None
    try:
        names = {f.name for f in dataclasses.fields(RunMeta)}
        metas = [RunMeta(**{k: v for k, v in m.items() if k in names}) for m in doc["metas"]]
        index, node = int(doc["client_index"]), str(doc["node"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ResultError(f"{where}: not a client's run record ({type(err).__name__}: {err})") from None
    if not metas:
        raise ResultError(f"{where}: metas: empty")
    return ClientRun(path, index, node, metas, load_summary(path, where=f"{path.name}/summary.json"))


def _shifted(run: ClientRun, t0: float) -> Iterator[RequestRecord]:
    shift = run.t0_unix - t0
    for record in RecordReader(run.path / REQUESTS_FILE, where=f"{run.path.name}/{REQUESTS_FILE}"):
        record["t_dispatch"] += shift
        record["t_done"] += shift
        yield record


def _rebased(meta: RunMeta, t0: float) -> RunMeta:
    shift = meta.t0_unix - t0
    return dataclasses.replace(
        meta,
        t0_unix=t0,
        stop_rel=meta.stop_rel + shift,
        end_rel=meta.end_rel + shift,
        first_dispatch=[t + shift for t in meta.first_dispatch],
    )


def merge_clients(client_dirs: Sequence[Path], out: Path) -> Summary:
    """Join the clients' output directories into ``out``/requests.jsonl and summary.json; returns the
    summary. ResultError when a directory is not a client's finished run."""
    runs = sorted((read_client(p) for p in client_dirs), key=lambda r: r.index)
    if not runs:
        raise ResultError("merge: no client directory")
    t0 = min(r.t0_unix for r in runs)
    records = out / REQUESTS_FILE
    tmp = out / (REQUESTS_FILE + ".tmp")
    write_records(tmp, (rec for run in runs for rec in _shifted(run, t0)))
    os.replace(tmp, records)
    first = runs[0].summary
    slo = first.get("slo", {})
    options: dict[str, Any] = {**first.get("options", {}), "client_count": len(runs)}
    options.pop("client_index", None)
    summary = build_summary(
        records,
        [_rebased(m, t0) for run in runs for m in run.metas],
        users=first.get("users", 0),
        options=options,
        slo_ttft=slo.get("ttft_s"),
        slo_tpot=slo.get("tpot_s"),
    )
    audit = summary["self_audit"]
    clients: dict[str, ClientAudit] = {}
    for run in runs:
        own = run.summary.get("self_audit", {})
        clients[str(run.index)] = {
            "node": run.node,
            "client_cpu_share": own.get("client_cpu_share"),
            "dispatch_lag_p99_s": own.get("dispatch_lag_s", {}).get("p99"),
            "workers": own.get("workers", len(run.metas)),
            "requests": run.summary["counts"]["sent"] + run.summary["counts"]["warmup"],
        }
    audit["clients"] = clients
    shares = [c["client_cpu_share"] for c in clients.values() if c["client_cpu_share"] is not None]
    audit["client_cpu_share"] = max(shares) if shares else None  # of one client's core, not their sum
    write_summary(out, summary)
    return summary


__all__ = ["RUN_META_FILE", "ClientRun", "merge_clients", "read_client", "write_run_metas"]
