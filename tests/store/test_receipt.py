"""receipt.json: written over a result directory, read back, and verified (flipped byte, added and
removed file, non-finite numbers); `agentsweep verify` exits 2 naming each difference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.contract.cell import Cell
from agentsweep.contract.receipt import (
    RECEIPT_FILE,
    ReceiptError,
    build_receipt,
    read_receipt,
    recipe_fingerprint,
    verify,
    write_receipt,
)

from ..collect.conftest import Spec, write_cell
from .conftest import COMMIT, seal


@pytest.fixture
def cell_dir(tmp_path: Path) -> Path:
    path = write_cell(tmp_path / "art", Spec(users=4))
    seal(path)
    return path


def test_receipt_lists_every_file_with_its_hash_and_size(cell_dir):
    receipt = read_receipt(cell_dir)
    on_disk = sorted(p.name for p in cell_dir.iterdir() if p.name != RECEIPT_FILE)
    assert sorted(receipt.files) == on_disk
    import hashlib

    data = (cell_dir / "requests.jsonl").read_bytes()
    assert receipt.files["requests.jsonl"].sha256 == hashlib.sha256(data).hexdigest()
    assert receipt.files["requests.jsonl"].size == len(data)
    assert receipt.commit == COMMIT and receipt.replayer_version
    assert receipt.recipe.engine_version == "sim-1.0" and receipt.recipe.client == "replay"
    assert verify(cell_dir) == []


def test_sub_folders_are_covered(cell_dir):
    (cell_dir / "steps" / "0").mkdir(parents=True)
    (cell_dir / "steps" / "0" / "summary.json").write_text("{}")
    seal(cell_dir)
    assert "steps/0/summary.json" in read_receipt(cell_dir).files
    (cell_dir / "steps" / "0" / "summary.json").write_text("{ }")
    assert [(p.kind, p.path) for p in verify(cell_dir)] == [("changed", "steps/0/summary.json")]


def test_verify_names_a_flipped_byte_an_added_and_a_removed_file(cell_dir):
    data = bytearray((cell_dir / "requests.jsonl").read_bytes())
    data[10] ^= 0x01
    (cell_dir / "requests.jsonl").write_bytes(bytes(data))
    (cell_dir / "extra.txt").write_text("added later")
    (cell_dir / "server_metrics.csv").unlink()
    found = {(p.kind, p.path) for p in verify(cell_dir)}
    assert found == {
        ("changed", "requests.jsonl"),
        ("extra", "extra.txt"),
        ("missing", "server_metrics.csv"),
    }


def test_verify_names_non_finite_numbers(tmp_path):
    path = write_cell(tmp_path, Spec(users=2))
    summary = (path / "summary.json").read_text().replace('"requests_per_s": 2.0', '"requests_per_s": NaN')
    (path / "summary.json").write_text(summary)
    lines = (path / "server_metrics.csv").read_text().splitlines()
    cells = lines[3].split(",")
    cells[1] = "inf"
    lines[3] = ",".join(cells)
    (path / "server_metrics.csv").write_text("\n".join(lines) + "\n")
    with (path / "requests.jsonl").open("a") as fh:
        fh.write('{"trace_id": "x", "t_dispatch": Infinity}\n')
    seal(path)  # the receipt matches: these numbers were written by the cell itself
    found = {(p.kind, p.path): p.detail for p in verify(path)}
    assert set(found) == {
        ("non-finite", "summary.json"),
        ("non-finite", "server_metrics.csv"),
        ("non-finite", "requests.jsonl"),
    }
    assert "NaN" in found[("non-finite", "summary.json")]
    assert found[("non-finite", "server_metrics.csv")] == "line 4, kv_cache_usage: inf"
    assert "line 41" in found[("non-finite", "requests.jsonl")]


def test_a_string_holding_nan_is_not_a_number(cell_dir):
    with (cell_dir / "requests.jsonl").open("a") as fh:
        fh.write('{"trace_id": "NaN-trace", "t_dispatch": 1.0, "error": "Infinity loop"}\n')
    seal(cell_dir)
    assert verify(cell_dir) == []


def test_fingerprint_leaves_out_users_and_name_only(cell_dir):
    cell = Cell.parse(json.loads((cell_dir / "cell.json").read_text())["cell"])
    base = recipe_fingerprint(cell, engine_version="1.0", client_version="0.1")
    other_load = cell.replace(users=64, exp_name="other-name")
    assert recipe_fingerprint(other_load, engine_version="1.0", client_version="0.1") == base
    assert recipe_fingerprint(cell, engine_version="1.1", client_version="0.1") != base
    assert recipe_fingerprint(cell, engine_version="1.0", client_version="0.2") != base
    assert recipe_fingerprint(cell.replace(image="img:2"), engine_version="1.0", client_version="0.1") != base
    assert recipe_fingerprint(cell.replace(tp=2, gpus=2), engine_version="1.0", client_version="0.1") != base


def test_receipt_id_is_stable_over_rewrites_and_follows_content(cell_dir):
    cell = Cell.parse(json.loads((cell_dir / "cell.json").read_text())["cell"])
    first = read_receipt(cell_dir).id
    again = write_receipt(cell_dir, cell, engine_version="sim-1.0", commit=COMMIT)
    assert again.id == first
    (cell_dir / "status.txt").write_text("SUCCESS\n\n")
    assert build_receipt(cell_dir, cell, engine_version="sim-1.0", commit=COMMIT).id != first


def test_unreadable_receipts_are_refused_by_name(cell_dir):
    (cell_dir / RECEIPT_FILE).write_text("{not json")
    with pytest.raises(ReceiptError, match=r"receipt\.json: not JSON"):
        read_receipt(cell_dir)
    (cell_dir / RECEIPT_FILE).write_text(json.dumps({"schema_version": 9}))
    with pytest.raises(ReceiptError, match="schema_version 9"):
        read_receipt(cell_dir)
    (cell_dir / RECEIPT_FILE).unlink()
    with pytest.raises(ReceiptError, match="no receipt"):
        read_receipt(cell_dir)


def test_verify_command(cell_dir, capsys):
    root = cell_dir.parent
    assert main(["verify", str(root)]) == 0
    assert "1 result directories match" in capsys.readouterr().err
    (cell_dir / "status.txt").write_text("INVALID\n")
    assert main(["verify", str(cell_dir)]) == 2
    err = capsys.readouterr().err
    assert f"{cell_dir / 'status.txt'}: changed: sha256 differs" in err
    (cell_dir / RECEIPT_FILE).unlink()
    assert main(["verify", str(cell_dir.parent)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].endswith("no receipt (the cell did not finish writing its result)")
    assert main(["verify", str(cell_dir / "nowhere")]) == 2


def test_the_commit_is_read_from_the_repositorys_files(tmp_path, monkeypatch):
    """HEAD through a symbolic ref, a worktree's gitdir file, packed refs: no git process."""
    from agentsweep.contract import receipt as module

    main_git = tmp_path / "main" / ".git"
    (main_git / "refs" / "heads").mkdir(parents=True)
    (main_git / "HEAD").write_text("ref: refs/heads/main\n")
    (main_git / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    assert module._head_commit(main_git) == "a" * 40
    # A worktree: .git is a file naming its folder, whose refs live in the main repository.
    wt_git = main_git / "worktrees" / "wt"
    wt_git.mkdir(parents=True)
    (wt_git / "HEAD").write_text("ref: refs/heads/topic\n")
    (wt_git / "commondir").write_text("../..\n")
    (main_git / "packed-refs").write_text(f"# pack-refs with: peeled\n{'b' * 40} refs/heads/topic\n")
    checkout = tmp_path / "wt"
    checkout.mkdir()
    (checkout / ".git").write_text(f"gitdir: {wt_git}\n")
    assert module._head_commit(checkout / ".git") == "b" * 40
    (wt_git / "HEAD").write_text("C" * 40 + "\n")  # a detached HEAD
    assert module._head_commit(checkout / ".git") == "c" * 40
    (wt_git / "HEAD").write_text("ref: refs/heads/gone\n")
    assert module._head_commit(checkout / ".git") is None
    monkeypatch.setenv("GITHUB_SHA", "d" * 40)
    assert module.project_commit() == "d" * 40


@pytest.mark.integration
def test_the_commit_is_gits_own(repo_root, monkeypatch):
    import subprocess

    from agentsweep.contract.receipt import project_commit

    monkeypatch.delenv("GITHUB_SHA", raising=False)
    head = subprocess.run(["git", "-C", str(repo_root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert project_commit() == head.stdout.strip()


def _agentsweep(*argv: str) -> subprocess.CompletedProcess[str]:
    """The real command in a child process: a hang is a failure (TimeoutExpired), not a stuck run."""
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "AGENTSWEEP_INGEST_WORKERS")}
    return subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.mark.integration
@pytest.mark.parametrize("name", ["requests.jsonl", "summary.json", "server_metrics.csv", "status.txt"])
def test_a_fifo_named_in_the_receipt_is_refused_not_waited_on(cell_dir, tmp_path, name):
    (cell_dir / name).unlink()
    os.mkfifo(cell_dir / name)
    proc = _agentsweep("verify", str(cell_dir))
    assert proc.returncode == 2
    assert f"{cell_dir / name}: not a file: not a regular file (a FIFO); not read" in proc.stderr
    found = [(p.kind, p.path, p.detail) for p in verify(cell_dir)]  # the child did not hang: nor will this
    assert found == [("not a file", name, "not a regular file (a FIFO); not read")]
    proc = _agentsweep("results", "ingest", "--db", str(tmp_path / "store.db"), str(cell_dir))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"receipt error: {cell_dir / name}: not a file: not a regular file (a FIFO); not read; refused: "
        "the result no longer matches its receipt"
    )
    assert not (tmp_path / "store.db").exists()
