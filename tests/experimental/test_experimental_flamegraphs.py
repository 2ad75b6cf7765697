"""Cache flamegraphs from a cell's requests.jsonl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agentsweep.errors import InputError
from agentsweep.experimental.flamegraphs.render import load_requests, render

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def rec(
    trace: str,
    session: str,
    turn: int,
    t: float,
    prompt: int,
    cached: int | None,
    hit: int,
    blocks: int,
    **kw,
):
    base = {
        "trace_id": trace,
        "session_id": session,
        "user": 0,
        "turn": turn,
        "phase": "profile",
        "t_dispatch": t,
        "t_done": t + 0.5,
        "e2e_s": 0.5,
        "prompt_tokens": prompt,
        "prompt_tokens_source": "server" if cached is not None else "synthesized",
        "cached_tokens": cached,
        "theoretical_hit_blocks": hit,
        "total_blocks": blocks,
        "status": "ok",
        "error": None,
    }
    base.update(kw)
    return base


def write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


RECORDS = [
    # trace A: the second turn could reuse 90% but the engine held only 10%: 800 tokens lost
    rec("A", "A", 0, 0.0, 1000, 0, 0, 10),
    rec("A", "A", 1, 1.0, 1000, 100, 9, 10),
    rec("A", "A:agent_1", 0, 1.2, 500, 400, 4, 5),
    rec("A", "A", 2, 2.0, 1200, None, 10, 12, status="error", error={"class": "http_400", "message": "x"}),
    # trace B: perfect reuse
    rec("B", "B", 0, 0.1, 640, 0, 0, 10, phase="warmup"),
    rec("B", "B", 1, 1.1, 640, 576, 9, 10),
]


def test_totals_measure_lost_reuse(tmp_path):
    views = load_requests(write(tmp_path / "requests.jsonl", RECORDS, tail='{"trace_id": "A", "t_disp'))
    a, b = views["A"], views["B"]
    assert a.lanes == ["A", "A:agent_1"]  # parent on top, sub-agents below
    ta = a.totals()
    assert ta["requests"] == 4 and ta["failed"] == 1
    assert ta["lost_tokens"] == pytest.approx(800.0)  # (0.9 - 0.1) * 1000; the sub-agent held 80% of 80%
    assert ta["server_hit"] == pytest.approx(500 / 2500)
    assert b.totals()["lost_tokens"] == pytest.approx(0.0)


def test_render_writes_pngs_and_index_worst_first(tmp_path):
    src = write(tmp_path / "requests.jsonl", RECORDS)
    index, pngs = render(src, tmp_path / "fg")
    assert [p.name for p in pngs] == ["A.png", "B.png"]
    for p in pngs:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    page = index.read_text()
    assert page.index('href="A.png"') < page.index('href="B.png"')
    assert "800" in page and "20.0%" in page  # lost tokens and server hit of trace A


def test_render_limits_trace_count(tmp_path):
    records = [rec(f"T{k}", f"T{k}", 0, 0.0, 100 * (k + 1), 0, 1, 1) for k in range(5)]
    index, pngs = render(write(tmp_path / "requests.jsonl", records), tmp_path / "fg", max_traces=2)
    assert [p.name for p in pngs] == ["T4.png", "T3.png"]  # most lost tokens first
    assert "T0" in index.read_text()  # listed, not drawn


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentsweep.experimental.flamegraphs", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.integration
def test_cli_on_result_dir(tmp_path):
    write(tmp_path / "requests.jsonl", RECORDS)
    res = run_cli(str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "flamegraphs" / "index.html").is_file()
    assert "2 flamegraphs" in res.stdout


@pytest.mark.integration
@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (None, "no such file"),
        ("", "no requests"),
        (
            '{"trace_id": "A", "t_dispatch": 0}\nnot json\n{"trace_id": "A", "t_dispatch": 1}\n',
            "line 2: bad JSON",
        ),
        ('{"t_dispatch": 0}\n', "trace_id: missing"),
        ('{"trace_id": "A", "t_dispatch": "soon"}\n', "t_dispatch: must be a number"),
    ],
)
def test_cli_bad_input_one_line_exit_2(tmp_path, content, expect):
    if content is not None:
        (tmp_path / "requests.jsonl").write_text(content)
    res = run_cli(str(tmp_path / "requests.jsonl"), "--output", str(tmp_path / "out"))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], res.stderr


def test_max_traces_must_be_positive(tmp_path):
    with pytest.raises(InputError, match="--max-traces"):
        render(write(tmp_path / "requests.jsonl", RECORDS), tmp_path / "fg", max_traces=0)
