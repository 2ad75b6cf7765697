"""A cell on a disk that fills up: a readable FAILED verdict naming the full disk, no traceback, no
temporary file (a small tmpfs, filled, as the real thing)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from agentsweep.cell.record import write_result
from agentsweep.cell.space import RESERVE_NAME
from agentsweep.contract.cell import CELL_ENV_VAR
from agentsweep.contract.resultdir import read_cell_record, read_status, write_atomic
from agentsweep.metrics.scrapes import ScrapeReader
from kv_cache_tester.replay.results import RecordReader

from tests.support import filled_tmpfs


def _left_behind(rd: Path) -> list[str]:
    return sorted(p.name for p in rd.iterdir() if p.name.endswith(".tmp") or p.name == RESERVE_NAME)


@pytest.mark.integration
def test_an_atomic_write_on_a_full_disk_names_the_file_and_leaves_no_temporary(tmp_path):
    with filled_tmpfs(tmp_path / "small", 1024, 8) as mount:
        with pytest.raises(OSError) as err:
            write_atomic(mount / "cell.json", "x" * (64 << 10))
        assert err.value.filename == str(mount / "cell.json") and err.value.errno == 28
        assert list(mount.glob("*.tmp")) == list(mount.glob(".*.tmp")) == []


@pytest.mark.slow
def test_a_cell_that_fills_its_disk_leaves_a_readable_failed_verdict(repo_root, tmp_path):
    cell = {
        "config_key": "full", "exp_name": "full-tp1-ep1-u4-off", "runner": "local", "engine": "sim", "hardware": "h200",
        "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "tp": 1, "users": 4,
        "offload": "off", "duration": 20, "traces": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "max_context": 65536, "max_delay": 1, "warmup_requests": 0, "speed": 50,
        "engine_args": "--num-gpu-blocks-override 4096",
    }  # fmt: skip
    with filled_tmpfs(tmp_path / "small", 2048, 300) as mount:
        rd = mount / "cell"
        env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
        env |= {CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(rd)}
        proc = subprocess.run(
            [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "30"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "Traceback" not in proc.stdout + proc.stderr
        status = read_status(rd)
        assert status is not None and status.verdict == "FAILED", status
        assert status.reasons[0].startswith(f"no space left on the file system of {rd} ("), status.reasons
        record = read_cell_record(rd)  # readable, whole
        assert record is not None and record.status == "FAILED" and record.reasons == status.reasons
        assert _left_behind(rd) == []
        # What was measured before the disk filled stays whole: records and scrapes, no torn line.
        reader = RecordReader(rd / "requests.jsonl")
        assert sum(1 for _ in reader) > 0 and reader.bad_lines == 0
        scrapes = ScrapeReader(rd / "server_metrics.csv")
        assert sum(1 for _ in scrapes) > 0 and scrapes.bad_rows == 0


@pytest.mark.integration
def test_a_verdict_written_on_a_full_disk_makes_room_from_the_reserve(tmp_path):
    """The cell's last write finds the disk full: the reserve and temporary files go, FAILED is written."""
    from agentsweep.cell import space
    from agentsweep.cell.lifecycle import _write_verdict
    from agentsweep.cell.plan import plan_cell
    from agentsweep.cell.port_allocation import FreePortAllocator
    from agentsweep.contract.cell import Cell

    with filled_tmpfs(tmp_path / "small", 1024, 300) as mount:
        rd = mount / "cell"
        rd.mkdir()
        space.reserve(rd)
        (rd / ".summary.json.tmp").write_bytes(b"partial")
        with open(mount / "rest", "wb", buffering=0) as fh:  # the run fills what is left
            try:
                while True:
                    fh.write(bytes(4096))
                    fh.flush()
            except OSError:
                pass
        cell = Cell.parse(
            {
                "exp_name": "x",
                "engine": "sim",
                "hardware": "h200",
                "model": "m",
                "tp": 1,
                "users": 1,
                "offload": "off",
                "duration": 5,
                "traces": "t",
            }
        )
        plan = plan_cell(cell, rd, ports=FreePortAllocator(cell_port=8000))
        status, reasons = _write_verdict(plan, {}, "2026-01-01T00:00:00Z", "SUCCESS", [], {})
        assert status == "FAILED"
        assert reasons[0].startswith(f"no space left on the file system of {rd}")
        assert f"cannot write {rd / 'cell.json'}" in reasons[0]
        on_disk = read_status(rd)
        assert on_disk is not None and on_disk.verdict == "FAILED" and on_disk.reasons == tuple(reasons)
        assert _left_behind(rd) == []
        # A later writer on the same full disk still fails in one line naming its file.
        with pytest.raises(OSError) as err:
            write_result(rd, cell=cell.to_dict(), engine_command=[], engine_env={}, replay_command=[], versions={},
                         start_utc="x", status="FAILED", reasons=["r" * 300_000])  # fmt: skip
        assert err.value.filename == str(rd / "cell.json")
