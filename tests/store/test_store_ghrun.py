"""Ingest of a workflow run's artifacts: the zips GitHub serves, and `gh run download`'s layout."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.store import query
from agentsweep.store.db import Store

from .conftest import SMALL, make_sweep


def _zip_artifacts(cells_root: Path, into: Path) -> list[Path]:
    """One zip per artifact, files at the zip's root, as GitHub serves `agentic_<exp>.zip`."""
    into.mkdir(parents=True)
    zips = []
    for cell in sorted(cells_root.iterdir()):
        target = into / f"{cell.name}.zip"
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
            for file in sorted(cell.rglob("*")):
                if file.is_file():
                    zf.write(file, file.relative_to(cell).as_posix())
        zips.append(target)
    return zips


def test_ingest_artifact_zips(tmp_path, capsys):
    make_sweep(tmp_path / "cells", SMALL)
    downloads = tmp_path / "downloads"
    _zip_artifacts(tmp_path / "cells", downloads)
    with zipfile.ZipFile(downloads / "sweep_matrix.zip", "w") as zf:  # artifacts that are not cells
        zf.writestr("matrix.json", '{"include": []}')
    db = tmp_path / "store.db"
    assert main(["results", "ingest", "--db", str(db), str(downloads)]) == 0
    assert (
        main(["results", "ingest", "--db", str(db), str(downloads / "agentic_demo-tp1-ep1-u2-on.zip")]) == 0
    )
    assert "1 result(s) already in the store" in capsys.readouterr().err
    store = Store.open(str(db))
    with store.read() as conn:
        points = query.load_points(conn)
    assert sorted(p.exp_name for p in points) == sorted(s.exp_name for s in SMALL)
    store.dispose()


def test_a_zip_member_leaving_its_folder_is_refused(tmp_path, capsys):
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with zipfile.ZipFile(downloads / "agentic_evil.zip", "w") as zf:
        zf.writestr("../../outside.txt", "x")
    db = tmp_path / "store.db"
    assert main(["results", "ingest", "--db", str(db), str(downloads)]) == 2
    assert "would land outside the artifact; refused" in capsys.readouterr().err
    assert not (tmp_path / "outside.txt").exists() and not db.exists()


def test_gh_run_dry_run_prints_the_download_command(capsys):
    assert main(["results", "ingest", "--gh-run", "123456", "--repo", "acme/bench", "--dry-run"]) == 0
    words = capsys.readouterr().out.split()
    assert words[:4] == ["gh", "run", "download", "123456"]
    assert words[words.index("--repo") + 1] == "acme/bench"
    assert words[words.index("--dir") + 1].endswith("/artifacts")
    assert main(["results", "ingest", "--gh-run", "12x", "--dry-run"]) == 2
    assert "a workflow run id is a number" in capsys.readouterr().err
    assert main(["results", "ingest", "--gh-run", "1", "--repo", "no-slash", "--dry-run"]) == 2
    assert main(["results", "ingest", "some/dir", "--gh-run", "1"]) == 2


STANDIN_GH = textwrap.dedent(
    """
    # A stand-in for the GitHub CLI: `gh run download ID --dir DIR [--repo R]` extracts the test's
    # artifact zips into DIR/<artifact>/, as gh does; any other run id fails like gh.
    import sys, zipfile, pathlib
    args = sys.argv[1:]
    source = pathlib.Path({source!r})
    if args[:2] != ["run", "download"] or args[2] != "4242":
        print("could not find any artifacts to download", file=sys.stderr)
        sys.exit(1)
    into = pathlib.Path(args[args.index("--dir") + 1])
    for z in sorted(source.glob("*.zip")):
        with zipfile.ZipFile(z) as zf:
            zf.extractall(into / z.stem)
    """
)


@pytest.mark.slow
def test_gh_run_download_then_ingest(tmp_path, monkeypatch, capsys):
    make_sweep(tmp_path / "cells", SMALL)
    _zip_artifacts(tmp_path / "cells", tmp_path / "served")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    gh = bindir / "gh"
    gh.write_text(f"#!{sys.executable}\n" + STANDIN_GH.format(source=str(tmp_path / "served")))
    gh.chmod(gh.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    db = tmp_path / "store.db"
    assert main(["results", "ingest", "--db", str(db), "--gh-run", "4242", "--repo", "acme/bench"]) == 0
    assert main(["results", "ingest", "--db", str(db), "--gh-run", "4242", "--repo", "acme/bench"]) == 0
    capsys.readouterr()
    assert main(["results", "runs", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "gh run 4242" in out and "workflow run 4242 of acme/bench" in out and out.count("gh run") == 1
    assert main(["results", "ingest", "--db", str(db), "--gh-run", "777"]) == 2
    assert (
        "gh run download 777: failed with status 1: could not find any artifacts" in capsys.readouterr().err
    )
