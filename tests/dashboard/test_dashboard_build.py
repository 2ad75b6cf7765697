"""The dashboard folder: every script local, one drill-down per point, the index's figures the store's."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.store import query
from agentsweep.store.db import Store

from .conftest import INVALID, SPECS


def _index(out):
    text = (out / "data" / "index.js").read_text()
    return json.loads(text[len("window.AGENTSWEEP_INDEX=") : -2])


def test_site_is_self_contained(site):
    _, out = site
    html = (out / "index.html").read_text()
    sources = re.findall(r'<script src="([^"]+)"', html) + re.findall(r'href="([^"]+)"', html)
    assert sources == ["assets/plotly.min.js", "data/index.js", "assets/app.js", "assets/app.css"]
    for src in sources:
        assert (out / src).is_file(), src
    assert "http" not in html
    app = (out / "assets" / "app.js").read_text()
    assert "fetch(" not in app and "http" not in app and "XMLHttpRequest" not in app
    assert (out / "assets" / "plotly.min.js").stat().st_size > 1_000_000


def test_index_holds_the_stores_points_and_history_flags(site):
    db, out = site
    index = _index(out)
    store = Store.open(str(db))
    with store.read() as conn:
        points = {p.id: p for p in query.load_points(conn)}
    store.dispose()
    assert len(index["points"]) == len(points) == 2 * len(SPECS) + 1
    assert [r["label"] for r in index["runs"]] == ["night1", "night2"]
    for entry in index["points"]:
        point = points[entry["id"]]
        assert entry["exp_name"] == point.exp_name and entry["status"] == point.status
        for name, value in entry["m"].items():
            assert value == point.metrics[name]
        assert (out / "data" / "points" / f"{entry['id']}.js").is_file()
    assert sum(p["status"] == "INVALID" for p in index["points"]) == 1
    assert next(p for p in index["points"] if p["status"] == "INVALID")["exp_name"] == INVALID
    # Night 2 is 30 % slower; night 1's stability block (+-5 %) flags the change.
    group = next(g for g in index["history"] if g["scope"].endswith("offload=on shape=r1"))
    entries = [e for line in group["metrics"]["ttft_p90_s"] for e in line["entries"]]
    assert any(e["flag"] is True and e["direction"] == "worse" for e in entries)
    assert index["capacity"] == []


def test_drilldown_of_a_routed_cell_has_the_router_counts(site):
    _, out = site
    index = _index(out)
    routed = next(p for p in index["points"] if p["router"])
    text = (out / "data" / "points" / f"{routed['id']}.js").read_text()
    payload = json.loads(text[text.index(",") + 1 : -3])
    assert payload["router"]["totals"]["requests_by_replica"] == [30.0, 10.0]
    over = payload["router"]["over_time"]
    assert set(over["instances"]) == {"r0", "r1"} and len(over["t"]) == 70
    assert over["t"][5] == payload["window"][0]  # the scrape at the window start sits at its start


def test_rebuilding_replaces_only_a_dashboard(site, tmp_path, capsys):
    db, out = site
    assert main(["dashboard", "--db", str(db), "-o", str(out)]) == 0
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep me")
    assert main(["dashboard", "--db", str(db), "-o", str(other)]) == 2
    assert "not empty and not a dashboard" in capsys.readouterr().err
    assert (other / "mine.txt").read_text() == "keep me"


@pytest.mark.slow
def test_serve_serves_the_site_until_terminated(site, tmp_path):
    db, _ = site
    out = tmp_path / "served"
    agentsweep = Path(sys.executable).parent / "agentsweep"
    proc = subprocess.Popen(
        [str(agentsweep), "dashboard", "--db", str(db), "-o", str(out), "--serve", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:
            found = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
            if found:
                url = found.group(1)
                break
        assert url, "no serving line"
        with urllib.request.urlopen(url + "index.html", timeout=30) as reply:
            assert b"assets/plotly.min.js" in reply.read()
        with urllib.request.urlopen(url + "data/index.js", timeout=30) as reply:
            assert reply.read().startswith(b"window.AGENTSWEEP_INDEX=")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        if proc.stderr:
            proc.stderr.close()


@pytest.mark.integration
def test_a_full_disk_is_one_line_and_leaves_nothing(site, tmp_path, capsys):
    """The dashboard onto a disk that fills up (a small tmpfs, filled): one line naming the file, exit 2,
    no half-written folder, no temporary one."""
    from tests.support import filled_tmpfs

    db, _ = site
    with filled_tmpfs(tmp_path / "small", 2048, 256) as mount:
        out = mount / "dashboard"
        assert main(["dashboard", "--db", str(db), "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"write error: {mount}/"), err
        assert err[0].endswith(": cannot write: no space left on device")
        assert sorted(p.name for p in mount.iterdir()) == [".filler"]
