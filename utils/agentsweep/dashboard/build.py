"""Write the dashboard: a folder that opens from file:// with nothing fetched from the network.

Layout of the folder::

    index.html              the page (links the three scripts below, in order)
    assets/plotly.min.js    plotly.js as the plotly Python package ships it for offline use
    assets/app.js           the explorer (assets/app.css its style)
    data/index.js           runs, points, figures, history flags and each run's headline
                            (dashboard.headline): ``window.AGENTSWEEP_INDEX = {...}``
    data/points/<id>.js     one point's drill-down, loaded on demand by a <script> tag (file:// pages
                            cannot fetch() files, but may load scripts): ``agentsweepPoint(id, {...})``

The site is written into a temporary folder beside the target and moved into place at the end, so a
failure leaves the previous dashboard (or nothing) rather than half a site. The move replaces the
target whole: it must be absent, empty, or a dashboard this command wrote holding nothing else (a
file of the user's beside the marker is refused, never deleted).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from kv_cache_tester.replay.jsonfast import loads

from agentsweep.contract.slo import statistic_label
from agentsweep.dashboard import data
from agentsweep.dashboard.headline import HEADLINE_METRICS, headlines
from agentsweep.errors import InputError, WriteError
from agentsweep.store import query
from agentsweep.store.db import DamagedStore, Store

MARKER = ".agentsweep-dashboard"
ASSETS = ("index.html", "app.js", "app.css")


def plotly_js() -> bytes:
    """plotly.min.js from the installed plotly package (its bundle for offline embedding)."""
    try:
        return (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as err:
        raise InputError(
            f"the dashboard needs plotly's bundled plotly.min.js ({err}): pip install 'agentsweep[dashboard]'"
        ) from None


def _js(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _drilldown(point_id: int, raw: bytes) -> dict[str, Any]:
    """A stored drill-down payload, decoded: it goes into its script only as one JSON object (data,
    never code, whatever the store holds); DamagedStore otherwise."""
    try:
        payload = loads(raw)
    except (ValueError, RecursionError):
        raise DamagedStore(
            f"point {point_id}: drilldown.json is not a JSON object (it does not decode)"
        ) from None
    if not isinstance(payload, dict):
        raise DamagedStore(f"point {point_id}: drilldown.json is not a JSON object")
    return payload


# Everything a dashboard folder holds (see the module docstring). A rebuild replaces the whole folder,
# so a folder holding anything else, even beside the marker, is the user's and is refused.
SITE_FOLDERS = frozenset({"assets", "data", "data/points"})
SITE_FILES = frozenset(
    {MARKER, "index.html", "data/index.js", "assets/plotly.min.js"}
    | {f"assets/{name}" for name in ASSETS if name != "index.html"}
)
POINT_FILE = re.compile(r"data/points/[0-9]+\.js")


def _foreign_entry(out: Path) -> str | None:
    """The first entry of ``out`` a dashboard does not hold (links are never followed), or None."""
    for dirpath, dirnames, filenames in os.walk(out):
        here = Path(dirpath)
        for name in sorted(dirnames + filenames):
            rel = (here / name).relative_to(out).as_posix()
            mode = (here / name).lstat().st_mode
            if stat.S_ISDIR(mode) and rel in SITE_FOLDERS:
                continue
            if stat.S_ISREG(mode) and (rel in SITE_FILES or POINT_FILE.fullmatch(rel)):
                continue
            return rel
    return None


def _check_target(out: Path) -> None:
    """``out`` is absent, an empty folder, or a dashboard this command wrote and nothing else."""
    try:
        st = out.lstat()
    except FileNotFoundError:
        return
    except OSError as err:  # a name too long, a parent that is a file
        raise InputError(f"{out}: cannot write there: {(err.strerror or str(err)).lower()}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{out}: exists and is not a folder")
    try:
        if not any(out.iterdir()):
            return
        marker = (out / MARKER).lstat() if (out / MARKER).is_symlink() or (out / MARKER).exists() else None
        if marker is None or not stat.S_ISREG(marker.st_mode):
            raise InputError(f"{out}: not empty and not a dashboard this command wrote; give an empty folder")
        foreign = _foreign_entry(out)
    except OSError as err:
        raise InputError(f"{out}: cannot read: {(err.strerror or str(err)).lower()}") from None
    if foreign is not None:
        raise InputError(
            f"{out}: holds {foreign}, which this command did not write; a rebuild replaces the whole "
            "folder, so give an empty folder or move it out"
        )


def _statistic_keys(capacity: list[dict[str, Any]]) -> list[str]:
    """The SLO statistics the capacity cells' steps measured (``ttft:p90``...), in order of appearance."""
    keys: dict[str, None] = {}
    for entry in capacity:
        found = entry["capacity"]
        steps = found.get("steps") if isinstance(found, dict) else None
        for step in steps if isinstance(steps, list) else []:
            statistics = step.get("statistics") if isinstance(step, dict) else None
            if isinstance(statistics, dict):
                keys.update(dict.fromkeys(str(k) for k in statistics))
    return list(keys)


def build(store: Store, out: Path) -> dict[str, int]:
    """Write the dashboard of ``store`` into ``out``; returns counts of what it holds."""
    _check_target(out)
    bundle = plotly_js()  # first: a missing extra is said before anything is written
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".agentsweep-dashboard-", dir=out.parent))
    except OSError as err:
        raise WriteError(err.filename or out, err) from None
    work.chmod(0o755)  # a site to share, not a private temporary folder
    try:
        (work / "assets").mkdir()
        (work / "data" / "points").mkdir(parents=True)
        capacity = []
        by_point: dict[int, dict[str, Any]] = {}
        drilled = 0
        with store.read() as conn:
            idx = data.index(conn)
            exp_names = {p["id"]: p["exp_name"] for p in idx["points"]}
            for point_id, raw in data.drilldowns(conn):
                # The payload as ingest wrote it, written as it is once it decodes as one JSON object
                # (the decoder takes exactly one value, so what goes into the script is data, never
                # code, whatever the store holds); read for its capacity results.
                payload = _drilldown(point_id, raw)
                with (work / "data" / "points" / f"{point_id}.js").open("wb") as fh:
                    fh.write(b"agentsweepPoint(%d," % point_id + raw + b");\n")
                drilled += 1
                found = payload.get("capacity")
                if found is not None:
                    capacity.append(
                        {"point": point_id, "exp_name": exp_names.get(point_id), "capacity": found}
                    )
                    if isinstance(found, dict):
                        by_point[point_id] = found
            idx["headlines"] = headlines(query.load_points(conn, metrics=HEADLINE_METRICS), by_point)
        idx["capacity"] = capacity
        idx["statistic_labels"] = {key: statistic_label(key) for key in _statistic_keys(capacity)}
        (work / "data" / "index.js").write_text(f"window.AGENTSWEEP_INDEX={_js(idx)};\n", encoding="utf-8")
        (work / "assets" / "plotly.min.js").write_bytes(bundle)
        package = resources.files("agentsweep.dashboard") / "assets"
        for name in ASSETS:
            target = work / name if name == "index.html" else work / "assets" / name
            target.write_bytes((package / name).read_bytes())
        (work / MARKER).write_text("written by agentsweep dashboard\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    except OSError as err:  # a full disk: nothing half-written stays, one line naming the file
        shutil.rmtree(work, ignore_errors=True)
        raise WriteError(err.filename or out, err) from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return {"runs": len(idx["runs"]), "points": len(idx["points"]), "drilldowns": drilled}
