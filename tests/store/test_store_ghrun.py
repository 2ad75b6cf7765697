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


def _big_member_zip(cells_root: Path, into: Path, name: str, size: int) -> Path:
    """One cell's artifact zip whose ``name`` is replaced by ``size`` bytes (deflated to almost nothing)."""
    (zipped,) = _zip_artifacts(cells_root, into)
    rebuilt = into / "rebuilt.zip"
    with zipfile.ZipFile(zipped) as src, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename == name:
                with dst.open(name, "w") as fh:
                    for _ in range(size >> 20):
                        fh.write(b" " * (1 << 20))
            else:
                dst.writestr(info.filename, src.read(info))
    rebuilt.replace(zipped)
    return zipped


def test_a_member_larger_than_its_receipt_says_is_refused_before_extraction(tmp_path):
    """A 64 MiB summary.json in a zip that unpacks to 64 MiB: refused by its declared size, before a
    byte is written (it used to be extracted whole, then refused by the receipt check)."""
    from agentsweep.errors import InputError
    from agentsweep.store.ingest import extract_artifact_zip

    make_sweep(tmp_path / "cells", SMALL[:1])
    zipped = _big_member_zip(tmp_path / "cells", tmp_path / "dl", "summary.json", 64 << 20)
    assert zipped.stat().st_size < 1 << 20
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(InputError) as err:
        extract_artifact_zip(zipped, into)
    assert str(err.value).startswith(f"{zipped}: member summary.json: 64 MiB, but the receipt says ")
    assert str(err.value).endswith(" bytes; refused before extraction")
    assert list(into.iterdir()) == []


def test_a_member_over_its_files_limit_or_not_in_the_receipt_is_refused_before_extraction(tmp_path):
    from agentsweep.errors import InputError
    from agentsweep.store.ingest import extract_artifact_zip

    make_sweep(tmp_path / "cells", SMALL[:1])
    (cell,) = (tmp_path / "cells").iterdir()
    (cell / "receipt.json").unlink()  # no receipt to compare with: the file's own limit (1 MiB) holds
    zipped = _big_member_zip(tmp_path / "cells", tmp_path / "dl", "status.txt", 2 << 20)
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(
        InputError, match=r"member status.txt: 2 MiB is over the 1 MiB limit of status.txt; refused"
    ):
        extract_artifact_zip(zipped, into)
    assert list(into.iterdir()) == []
    make_sweep(tmp_path / "cells2", SMALL[:1])
    (zipped,) = _zip_artifacts(tmp_path / "cells2", tmp_path / "dl2")
    with zipfile.ZipFile(zipped, "a") as zf:
        zf.writestr("extra.bin", b"\0" * 4096)
    with pytest.raises(InputError, match=r"member extra.bin: not in the receipt of the zip root"):
        extract_artifact_zip(zipped, into)
    assert list(into.iterdir()) == []


def test_a_zip_over_the_unpacked_limit_is_refused_and_a_member_lying_about_its_size_is_cut_off(
    tmp_path, monkeypatch
):
    from agentsweep.errors import InputError
    from agentsweep.store import ingest

    make_sweep(tmp_path / "cells", SMALL[:1])
    (zipped,) = _zip_artifacts(tmp_path / "cells", tmp_path / "dl")
    into = tmp_path / "into"
    into.mkdir()
    monkeypatch.setattr(ingest, "ARTIFACT_MAX_BYTES", 4096)
    with pytest.raises(InputError, match=r"unpacks to .* over the 4 KiB limit; refused before extraction"):
        ingest.extract_artifact_zip(zipped, into)
    assert list(into.iterdir()) == []
    monkeypatch.undo()
    # A member whose header declares 10 bytes and holds 4 KiB: no more than 10 bytes leave the zip.
    liar = tmp_path / "liar.zip"
    with zipfile.ZipFile(liar, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("replay.log", b"x" * 4096)
    data = bytearray(liar.read_bytes())
    for header, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # uncompressed size fields
        at = data.index(header) + offset
        data[at : at + 4] = (10).to_bytes(4, "little")
    liar.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"liar.zip: not a zip file \(Bad CRC-32"):
        ingest.extract_artifact_zip(liar, into)
    written = [p.stat().st_size for p in into.rglob("*") if p.is_file()]
    assert all(size <= 10 for size in written)
