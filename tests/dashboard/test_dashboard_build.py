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


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_rebuild_never_deletes_files_beside_the_marker(site, tmp_path, capsys):
    """A dashboard folder the user also keeps files in is refused, not replaced with their files."""
    import shutil

    db, out = site
    mine = tmp_path / "site"
    shutil.copytree(out, mine)
    (mine / "notes.txt").write_text("keep me")
    assert main(["dashboard", "--db", str(db), "-o", str(mine)]) == 2
    assert _one_line(capsys) == (
        f"input error: {mine}: holds notes.txt, which this command did not write; a rebuild replaces the "
        "whole folder, so give an empty folder or move it out"
    )
    assert (mine / "notes.txt").read_text() == "keep me"
    (mine / "notes.txt").unlink()
    (mine / "data" / "points" / "mine.csv").write_text("1,2\n")
    assert main(["dashboard", "--db", str(db), "-o", str(mine)]) == 2
    assert "holds data/points/mine.csv, which this command did not write" in _one_line(capsys)
    (mine / "data" / "points" / "mine.csv").unlink()
    (mine / "assets" / "linked").symlink_to(tmp_path)
    assert main(["dashboard", "--db", str(db), "-o", str(mine)]) == 2
    assert "holds assets/linked, which" in _one_line(capsys)
    assert (tmp_path / "site").is_dir() and (mine / "assets" / "linked").is_symlink()
    (mine / "assets" / "linked").unlink()
    assert main(["dashboard", "--db", str(db), "-o", str(mine)]) == 0  # only its own files: rebuilt


def test_an_output_that_is_a_link_or_too_long_is_one_line(site, tmp_path, capsys):
    db, out = site
    link = tmp_path / "link"
    link.symlink_to(out)
    assert main(["dashboard", "--db", str(db), "-o", str(link)]) == 2
    assert _one_line(capsys) == f"input error: {link}: exists and is not a folder"
    long = tmp_path / ("d" * 300)
    assert main(["dashboard", "--db", str(db), "-o", str(long)]) == 2
    assert _one_line(capsys) == f"input error: {long}: cannot write there: file name too long"
    just_fits = tmp_path / ("d" * 250)  # the temporary folder beside it must fit too
    assert main(["dashboard", "--db", str(db), "-o", str(just_fits)]) == 0
    assert (just_fits / "index.html").is_file()


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_that_is_no_port_is_one_line(site, tmp_path, capsys, port):
    db, _ = site
    with pytest.raises(SystemExit) as stop:
        main(["dashboard", "--db", str(db), "-o", str(tmp_path / "s"), "--serve", "--port", port])
    assert stop.value.code == 2
    assert _one_line(capsys).startswith("usage error: agentsweep dashboard: argument --port: ")
    assert not (tmp_path / "s").exists()


@pytest.mark.integration
def test_a_port_in_use_is_one_line_and_writes_nothing(site, tmp_path, capsys):
    import socket

    db, _ = site
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = tmp_path / "s"
        assert main(["dashboard", "--db", str(db), "-o", str(out), "--serve", "--port", str(port)]) == 2
    assert _one_line(capsys) == (
        f"input error: --port {port}: cannot serve on 127.0.0.1:{port}: address already in use"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("tamper", "damage"),
    [
        (
            "UPDATE blobs SET data = x'00112233' WHERE name = 'drilldown.json'",
            "drilldown.json does not decompress",
        ),
        (
            "UPDATE metrics SET value = 'abc' WHERE name = 'ttft_p90_s'",
            "metric ttft_p90_s: 'abc' is not a number",
        ),
        ("UPDATE points SET stability_json = '{bad'", "stability_json does not decode"),
        ("UPDATE points SET stability_json = '[1]'", "stability_json does not decode"),
        (
            'UPDATE points SET stability_json = \'{"ranges": {"ttft_p90_s": 5}}\'',
            "stability_json does not decode",
        ),
    ],
)
def test_a_tampered_store_is_one_line(site, tmp_path, capsys, tamper, damage):
    import shutil
    import sqlite3

    db, _ = site
    copy = tmp_path / "store.db"
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as conn:
        conn.execute(tamper)
    assert main(["dashboard", "--db", str(copy), "-o", str(tmp_path / "s")]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"store error: {copy}: damaged: point ") and damage in line, line
    assert line.endswith("; re-create the store from the results")
    assert not (tmp_path / "s").exists() and [p.name for p in tmp_path.iterdir()] == ["store.db"]
    if "drilldown" not in tamper:  # the store's own readers say the same
        assert main(["results", "history", "--db", str(copy), "--metric", "ttft_p90_s"]) == 2
        assert damage in _one_line(capsys)


def test_a_drilldown_that_is_not_json_is_one_line(site, tmp_path, capsys):
    import shutil
    import sqlite3
    import zlib

    db, _ = site
    copy = tmp_path / "store.db"
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as conn:
        conn.execute(
            "UPDATE blobs SET data = ? WHERE name = 'drilldown.json'", (zlib.compress(b"{not json"),)
        )
    assert main(["dashboard", "--db", str(copy), "-o", str(tmp_path / "s")]) == 2
    assert "drilldown.json is not a JSON object" in _one_line(capsys)
