"""The demo path end to end, reduced: `agentsweep sweep --key demo-mini` -> 3 SUCCESS cells -> report.html."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from agentsweep.contract.receipt import read_receipt
from agentsweep.contract.resultdir import result_file

pytestmark = pytest.mark.slow


def test_demo_mini_sweep_end_to_end(repo_root, tmp_path):
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "agentsweep.cli", "sweep", "--key", "demo-mini", "--results", str(results)]
    proc = subprocess.run(
        [*cmd, "--duration", "5"], cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    key_dir = results / "demo-mini"
    report = key_dir / "aggregated" / "report.html"
    assert f"sweep: report: {report}" in out
    # The sweep ends with the headline: the verdicts, each default tier, each interactivity level.
    printed = proc.stdout.splitlines()
    tail = printed[printed.index(f"sweep: report: {report}") + 1 :]
    assert tail[0] == "sweep: simulated H200 · meta-llama/Llama-3.3-70B-Instruct: 3 cell(s): 3 SUCCESS", tail
    for tier in ("interactive", "fast", "realtime"):
        assert sum(line.startswith(f"sweep:   tier {tier} (") for line in tail) == 1, tail
    for level in (20, 50, 100):
        assert sum(line.startswith(f"sweep:     at {level} tok/s/user: ") for line in tail) == 1, tail
    assert report.stat().st_size > 10_000
    cells = {d.name: d for d in key_dir.iterdir() if d.name != "aggregated"}
    assert sorted(cells) == [
        "demo-mini-tp1-ep1-u2-noprefix",
        "demo-mini-tp1-ep1-u2-off",
        "demo-mini-tp1-ep1-u2-on",
    ]
    cached = {}
    for name, d in cells.items():
        assert (d / "status.txt").read_text() == "SUCCESS\n", name
        cached[name.rsplit("-", 1)[1]] = json.loads((d / "summary.json").read_text())["cache"][
            "cached_tokens"
        ]
    # The three offload modes really differ: no prefix reuse at all without prefix caching.
    assert cached["noprefix"] == 0 and cached["off"] > 0 and cached["on"] > 0
    with open(key_dir / "aggregated" / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 and {r["status"] for r in rows} == {"SUCCESS"}
    # Each cell's progress says what it measured, as the table reads it.
    for row in rows:
        figures = (
            f"[cell {row['exp_name']}] figures: {float(row['output_tok_per_s_per_gpu']):,.1f} output tok/s per GPU "
            f"({float(row['total_tok_per_s_per_gpu']):,.0f} total), TTFT p50 {float(row['ttft_p50_s']):.3g} s"
        )
        assert figures in out, figures
    # Every cell sealed its directory last: `agentsweep verify` passes, and the receipt covers every
    # file the cell left, each one declared by the result directory's owner.
    verified = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "verify", str(key_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verified.returncode == 0 and "3 result directories match their receipts" in verified.stderr
    for name, d in cells.items():
        receipt = read_receipt(d)
        left = sorted(
            p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file() and p.name != "receipt.json"
        )
        assert sorted(receipt.files) == left, name
        for file in receipt.files:
            result_file(file)
        assert {r["recipe_fingerprint"] for r in rows if r["exp_name"] == name} == {
            receipt.recipe_fingerprint
        }
    # A flipped byte is caught.
    first = cells["demo-mini-tp1-ep1-u2-on"] / "requests.jsonl"
    data = bytearray(first.read_bytes())
    data[0] ^= 0x01
    first.write_bytes(bytes(data))
    verified = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "verify", str(key_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verified.returncode == 2 and f"{first}: changed: sha256 differs" in verified.stderr
    data[0] ^= 0x01
    first.write_bytes(bytes(data))

    # Everything finished: --resume has nothing to do, and a plain rerun is refused.
    again = subprocess.run(
        [*cmd, "--resume", "--no-collect"], cwd=repo_root, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and "3 cells, 0 to run, 3 already SUCCESS" in again.stdout
    refused = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "use --resume" in refused.stderr
