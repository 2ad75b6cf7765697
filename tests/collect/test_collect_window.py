"""Server figures when the scrapes do not cover the whole profiling window.

A scraper that died mid-run leaves counters frozen at their last scrape; divided by the whole
window they understated the server's token rates, with no word in the notes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from agentsweep.collect.aggregate import build_rows, to_frame
from agentsweep.collect.discover import find_cells


def _keep_rows(path: Path, keep) -> float:
    """Keep the server_metrics.csv rows whose time passes ``keep(t - window_start)``; returns the start."""
    start = json.loads((path / "summary.json").read_text())["window"]["start_unix"]
    lines = (path / "server_metrics.csv").read_text().splitlines()
    rows = [line for line in lines[1:] if keep(float(line.split(",")[0]) - start)]
    (path / "server_metrics.csv").write_text("\n".join([lines[0], *rows]) + "\n")
    return start


def _row(root: Path):
    return to_frame(build_rows(find_cells(root))).iloc[0]


def test_scraper_gone_mid_window_rates_use_the_covered_part(tmp_path, cell_factory, spec_cls) -> None:
    spec = spec_cls(tp=1, users=8, offload="on", duration=60.0)
    path = cell_factory(tmp_path / "a", spec)
    _keep_rows(path, lambda dt: dt <= 30.0)  # the last scrape is 30 s into the 60 s window
    row = _row(tmp_path / "a")
    assert row["status"] == "SUCCESS"
    # The fixture's engine runs at a constant rate: over the covered half it is that rate,
    # not half of it (what dividing by the whole window gave).
    assert row["server_prompt_tok_per_s"] == pytest.approx(spec.input_tok_per_s())
    assert row["server_generation_tok_per_s"] == pytest.approx(spec.output_tok_per_s())
    assert row["gpu_hit_rate"] == pytest.approx(0.70)
    assert "scrapes cover only 30.0 s of the 60.0 s window" in row["notes"]


def test_whole_window_covered_gives_no_note(tmp_path, cell_factory, spec_cls) -> None:
    spec = spec_cls(duration=60.0)
    cell_factory(tmp_path / "a", spec)
    row = _row(tmp_path / "a")
    assert row["server_prompt_tok_per_s"] == pytest.approx(spec.input_tok_per_s())
    assert "cover only" not in str(row["notes"])


def test_scrapes_only_before_the_window_give_no_counter_figures(tmp_path, cell_factory, spec_cls) -> None:
    path = cell_factory(tmp_path / "a", spec_cls(duration=60.0))
    _keep_rows(path, lambda dt: dt < 0)  # warmup only: the scraper died as profiling began
    row = _row(tmp_path / "a")
    for column in ("gpu_hit_rate", "server_prompt_tok_per_s", "preemptions", "offload_bytes_gpu_to_cpu"):
        assert math.isnan(row[column]), column
    assert "no scrape inside the profiling window" in row["notes"]
    assert "scrapes cover only 0.0 s of the 60.0 s window" in row["notes"]
