"""`agentsweep calibrate` is bounded and signal-safe: points beyond the stated limits, a FIFO, a huge
field or an unknown boolean are one-line errors; SIGTERM/SIGINT stop the row's engine and keep the
rows already measured in calibration.csv (written as it goes)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agentsweep.calibrate.points import LIMITS, MAX_FIELD_CHARS, read_points
from agentsweep.errors import InputError

HEADER = "hardware,precision,isl,osl,tp,ep,conc,tput_per_gpu,median_intvty,median_ttft_s,run_url"
ROW = "h200,fp8,1024,256,8,1,4,100,100,0.1,https://example.org/run/{}"


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "points.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("h200,fp8,1024,256,8,1,100000,100,100,0.1,x", f"conc: 100000 is over the limit of {LIMITS['conc']}"),
        ("h200,fp8,10000000,256,8,1,4,100,100,0.1,x", f"isl: 10000000 is over the limit of {LIMITS['isl']}"),
        ("h200,fp8,1024,999999,8,1,4,100,100,0.1,x", "osl: 999999 is over the limit"),
        ("h200,fp8,1024,256,512,1,4,100,100,0.1,x", "tp: 512 is over the limit"),
        ("h200,fp8,1024,256,8,1,4,100,100,0.1,x," + "y" * (MAX_FIELD_CHARS + 1), "more fields than columns"),
        (
            "h200,fp8,1024,256,8,1,4,100,100,0.1," + "y" * (MAX_FIELD_CHARS + 1),
            f"over {MAX_FIELD_CHARS} characters",
        ),
    ],
)
def test_points_beyond_the_limits_are_refused(tmp_path: Path, row: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle) as err:
        read_points(_csv(tmp_path, HEADER + "\n" + row + "\n"))
    assert "line 2" in str(err.value) and "\n" not in str(err.value)


def test_a_field_past_the_csv_module_limit_is_one_line(tmp_path: Path) -> None:
    path = _csv(tmp_path, HEADER + "\n" + ROW.format(1)[:-1] + '"' + "y" * 200_000 + "\n")
    with pytest.raises(InputError, match="not CSV"):
        read_points(path)


def test_unknown_boolean_is_refused(tmp_path: Path) -> None:
    ok = _csv(tmp_path, HEADER + ",dp_attn\n" + ROW.format(1) + ",False\n")
    assert read_points(ok)[1][0].row["dp_attn"] == "False"
    with pytest.raises(InputError, match="dp_attn: expected true or false, got 'maybe'"):
        read_points(_csv(tmp_path, HEADER + ",dp_attn\n" + ROW.format(1) + ",maybe\n"))


def test_a_fifo_or_a_folder_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        read_points(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        read_points(tmp_path)


def _engines(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (the row's engine: its request log is there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and "engine-sim" in cmd:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_engine_and_keeps_the_rows_done(tmp_path: Path, sig: int) -> None:
    points = _csv(tmp_path, HEADER + "\n" + "".join(ROW.format(i) + "\n" for i in range(3)))
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", "calibrate", "--points", str(points), "--out", str(out),
         "--seconds", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(work)},
    )  # fmt: skip
    table = out / "calibration.csv"
    deadline = time.monotonic() + 120
    # The first row finished (its line is on disk) and the second row's engine is up.
    while not (table.exists() and len(table.read_text().splitlines()) >= 2 and _engines(str(work))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name} after 1 of 3 rows" in err and "Traceback" not in err
    rows = list(csv.DictReader(table.open()))
    assert [r["run_url"] for r in rows] == ["https://example.org/run/0"]
    assert rows[0]["status"] == "ok" and float(rows[0]["pred_tput_per_gpu"]) > 0
    gone = time.monotonic() + 10
    while _engines(str(work)) and time.monotonic() < gone:
        time.sleep(0.05)
    assert _engines(str(work)) == [], "the row's simulated engine outlived calibrate"


def test_a_signal_whose_exception_python_dropped_still_stops_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python drops an exception a signal handler raises inside an at-fork callback (starting a row's
    replayer) and the row runs on; the row is not kept and the rows stop there, as if it had been
    raised."""
    from agentsweep.calibrate import cli as calibrate_cli
    from agentsweep.calibrate import run as calibrate_run
    from agentsweep.cli import main as agentsweep_main

    def row_that_swallows_the_stop(p: object, seconds: float, work: Path) -> calibrate_run.RowResult:
        try:  # the signal lands where its exception cannot propagate
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        except calibrate_cli.Stopped:
            pass
        return calibrate_run.RowResult("ok")

    monkeypatch.setattr(calibrate_run, "run_row", row_that_swallows_the_stop)
    points = _csv(tmp_path, HEADER + "\n" + "".join(ROW.format(i) + "\n" for i in range(3)))
    out = tmp_path / "out"
    code = agentsweep_main(["calibrate", "--points", str(points), "--out", str(out), "--seconds", "2"])
    assert code == 128 + signal.SIGTERM
    assert "stopped by SIGTERM after 0 of 3 rows" in capsys.readouterr().err
    assert len((out / "calibration.csv").read_text().splitlines()) == 1  # the header alone


SHIPPED = Path(__file__).resolve().parents[2] / "utils/agentsweep/calibrate/data/inferencex_dsr1_sglang.csv"


@pytest.mark.integration
def test_ctrl_c_stops_a_fit_and_its_worker_processes_quietly(tmp_path: Path) -> None:
    """The fit's refits run one process per core; Ctrl-C (SIGINT to the whole process group, as a
    terminal sends it) stops them with the fit: exit 130, one line, no worker's traceback, nothing left
    running, no calibration file written."""
    lines = SHIPPED.read_text().splitlines()
    rows = [line for line in lines[1:] if line.startswith(("h200,", "b200,sglang,fp4"))]
    points = _csv(tmp_path, "\n".join([lines[0], *rows]) + "\n")
    target = tmp_path / "calibration.json"
    cmd = [sys.executable, "-m", "agentsweep.cli", "calibrate", "--fit", "--points", str(points)]
    proc = subprocess.Popen(
        [*cmd, "--write", str(target), "-o", str(tmp_path / "out")],
        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_children(proc.pid)) < 2:
            time.sleep(0.1)
        assert len(_children(proc.pid)) == 2, "the fit did not start its workers"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.rstrip().endswith("interrupted"), err
    assert not target.exists()
    gone = time.monotonic() + 10
    while _session(proc.pid) and time.monotonic() < gone:
        time.sleep(0.05)
    assert _session(proc.pid) == []


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _session(sid: int) -> list[int]:
    """Processes of the session the fit started (its workers included)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,sid="], capture_output=True, text=True).stdout
    return [int(p) for p, s in (line.split() for line in out.splitlines()) if int(s) == sid]
