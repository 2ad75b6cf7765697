"""Model, traces and disk checks: a hand-laid HF cache (the hub's own on-disk layout), a hub that
cannot be reached (a closed port on loopback), a full disk (a small tmpfs filled up)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.preflight.hub import disk_check, model_check, traces_check

REPO = Path(__file__).resolve().parents[2]
MODEL = "org/tiny-model"


def lay_cache(cache: Path, repo_id: str, files: dict[str, bytes], repo_type: str = "models") -> None:
    """The hub cache layout: blobs by hash, a snapshot of links, refs/main naming the revision."""
    import hashlib

    repo = cache / f"{repo_type}--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / name)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_cached_model_passes_without_asking_the_hub(tmp_path: Path) -> None:
    lay_cache(tmp_path, MODEL, {"config.json": b"{}", "model.safetensors": b"x" * 4096})
    env = {"HF_HUB_OFFLINE": "1"}
    check, download = model_check(MODEL, str(tmp_path), env)
    assert check.status == "PASS" and str(tmp_path) in check.detail and download == 0


def test_a_missing_model_offline_fails_with_the_download_command(tmp_path: Path) -> None:
    check, _ = model_check(MODEL, str(tmp_path), {"HF_HUB_OFFLINE": "1"})
    assert check.status == "FAIL" and f"hf download {MODEL} --cache-dir {tmp_path}" in check.fix


@pytest.mark.slow
def test_a_missing_model_without_a_token_fails_naming_the_token(tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    check, _ = model_check(MODEL, str(tmp_path), env)
    assert check.status == "FAIL"
    assert "not in the HF cache" in check.detail and "no HF_TOKEN is set" in check.detail
    assert "set HF_TOKEN" in check.fix and f"hf download {MODEL}" in check.fix


def test_a_missing_hf_cache_directory_fails(tmp_path: Path) -> None:
    check, _ = model_check(MODEL, str(tmp_path / "nope"), {})
    assert check.status == "FAIL" and "does not exist" in check.detail and "hf_cache" in check.fix


def test_traces_present_and_missing(tmp_path: Path) -> None:
    assert traces_check("kv-cache-tester/sample_traces", None, {}, REPO).status == "PASS"
    missing = traces_check("no/such/traces", None, {}, REPO)
    assert missing.status == "FAIL" and "does not exist" in missing.detail
    lay_cache(tmp_path, "org/traces", {"a.json": b"{}"}, repo_type="datasets")
    assert traces_check("hf:org/traces", str(tmp_path), {"HF_HUB_OFFLINE": "1"}, REPO).status == "PASS"


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, filled up (needs root to mount; skips where mounting is not allowed)."""
    mount = tmp_path / "small"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        with open(mount / "fill", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_fails(full_disk: Path) -> None:
    check = disk_check("disk.hf_cache", full_disk / "hub", 0, "the model downloads")
    assert check.status == "FAIL" and "0.0 GiB free" in check.detail and str(full_disk) in check.fix


def test_the_command_reports_json_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", "--key", "demo-mini", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["subject"] == "demo-mini"
    assert {c["name"] for c in report["checks"]} >= {"config", "traces", "disk.results", "node.ports"}


def test_a_bad_cell_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", "--cell", "{not json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("input error: --cell")


@pytest.mark.integration
def test_a_cell_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    import sys

    fifo = tmp_path / "cell.json"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "preflight", "--cell", f"@{fifo}"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (
        2,
        f"input error: --cell @{fifo}: not a regular file (a FIFO)\n",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "preflight", "--cell", "@/dev/zero"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (
        2,
        "input error: --cell @/dev/zero: not a regular file (a character device)\n",
    )


def test_a_context_cut_that_leaves_no_request_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """max_context 1 leaves the replayer no request: preflight says NOT ready instead of ready."""
    config = (REPO / "configs" / "agentic.yaml").read_text()
    entry = config[config.index("demo-mini:") : config.index("\n\n", config.index("demo-mini:"))]
    (tmp_path / "c.yaml").write_text(
        entry.replace("demo-mini:", "mc1:").replace("max_context: 131072", "max_context: 1")
    )
    assert main(["preflight", "--key", "mc1", "--config", str(tmp_path / "c.yaml"), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"]
    assert [c["status"] for c in report["checks"] if c["name"] == "traces.max_context"] == ["FAIL"]

    from agentsweep.preflight.hub import traces_fit_check

    check = traces_fit_check("kv-cache-tester/sample_traces", 1, REPO)
    assert check.status == "FAIL" and check.name == "traces.max_context"
    assert check.detail.startswith("max_context 1: ") and "no traces left after filters" in check.detail
    fits = traces_fit_check("kv-cache-tester/sample_traces", 65536, REPO)
    assert fits.status == "PASS" and fits.detail.endswith("fit max_context 65536")
    assert traces_fit_check("hf:org/traces", 1, REPO).status == "SKIP"
