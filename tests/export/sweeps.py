"""Small result directories for the export tests: collect's synthetic cells (tests/collect) of a
model InferenceX knows, single-engine, replicated behind a router or disaggregated, each with its
receipt; a cell may be given a verdict of INVALID or FAILED."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..collect.conftest import Spec, write_cell
from ..collect.routed_cells import pd_cell, routed_cell
from ..store.conftest import _with_done_times, seal

MODEL = "meta-llama/Llama-3.3-70B-Instruct"
ORDINARY = [
    Spec(tp=tp, users=u, offload=o) for tp in (1, 2) for u in (2, 8) for o in ("on", "off", "noprefix")
]


def _edit(path: Path, status: str, reason: str | None, **fields: Any) -> None:
    doc = json.loads((path / "cell.json").read_text())
    doc["cell"].update({"model": MODEL, "precision": "fp8", **fields})
    doc["status"], doc["reason"] = status, reason
    (path / "cell.json").write_text(json.dumps(doc, indent=1))
    (path / "status.txt").write_text(status + (f"\n{reason}" if reason else "") + "\n")


def _full_response_itl(path: Path) -> None:
    """The summary's full-response ITL, as the replayer writes it now: per request it is the TPOT, so
    its statistics are TPOT's (the synthetic summary has no p75 or std of it: given here)."""
    summary = json.loads((path / "summary.json").read_text())
    tpot = dict(summary["latency"]["tpot_s"])
    tpot.update(p75=(tpot["p50"] + tpot["p90"]) / 2, std=tpot["p50"] / 4)
    summary["latency"]["full_response_itl_s"] = tpot
    (path / "summary.json").write_text(json.dumps(summary))


def finish(path: Path, status: str = "SUCCESS", reason: str | None = None, **fields: Any) -> Path:
    """The cell of a known model with its verdict, its records' end times and its receipt."""
    _edit(path, status, reason, **fields)
    if (path / "requests.jsonl").is_file():
        _with_done_times(path)
        _full_response_itl(path)
    seal(path)
    return path


def sweep(
    root: Path,
    specs: Sequence[Spec] = ORDINARY,
    *,
    invalid: Sequence[str] = (),
    failed: Sequence[str] = (),
    routed: bool = False,
    disaggregated: bool = False,
    **fields: Any,
) -> list[Path]:
    """A sweep in the download-artifact layout (``agentic_<exp>``)."""
    paths = []
    for spec in specs:
        bad = spec.exp_name in failed
        path = write_cell(
            root, spec, status="FAILED" if bad else "SUCCESS", reason="engine OOM" if bad else None
        )
        if bad:
            paths.append(finish(path, "FAILED", "engine OOM", **fields))
        elif spec.exp_name in invalid:
            paths.append(finish(path, "INVALID", "dispatch lag p99 3.1 s > 2 s", **fields))
        else:
            paths.append(finish(path, **fields))
    if routed:
        paths.append(finish(routed_cell(root, Spec(tp=1, users=8, offload="off"), hits=(0.5, 0.7)), **fields))
    if disaggregated:
        paths.append(finish(pd_cell(root, Spec(tp=1, users=8, offload="off"), prefill=(1, 2)), **fields))
    return paths
