"""The power sampler against its sources: stand-ins for nvidia-smi and amd-smi that answer in the
recorded and documented formats (neither tool runs here), a DCGM endpoint on loopback; each fault
becomes a fault row (the sampler runs on) and the power summary's one reason."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agentsweep.cell.engine_process import ManagedProcess
from agentsweep.energy.powercsv import PowerRow, read_power
from agentsweep.energy.sampler import sample
from agentsweep.energy.spec import PowerTarget, SamplerSpec
from agentsweep.energy.summary import Window, Work, summarize

from tests.support import pid_running, wait_for_file, wait_until

pytestmark = pytest.mark.integration

STANDIN = Path(__file__).parent / "standin"


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bin directory holding the stand-in tools, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, script in (("nvidia-smi", "nvidia_smi.py"), ("amd-smi", "amd_smi.py")):
        path = bin_dir / tool
        path.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN / script} "$@"\n')
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def spec(
    source: str, gpus: tuple[str, ...] = ("0", "1"), endpoint: str = "", interval: float = 0.1
) -> SamplerSpec:
    target = PowerTarget(node="n1", count=len(gpus), gpus=gpus, endpoint=endpoint)
    return SamplerSpec(source=source, interval_s=interval, targets=(target,))  # type: ignore[arg-type]


def run_for(tmp_path: Path, s: SamplerSpec, seconds: float) -> tuple[list[PowerRow], float, float]:
    start = time.time()
    sample(s, tmp_path / "power.csv", seconds)
    return read_power(tmp_path / "power.csv"), start, time.time()


def faults(rows: list[PowerRow]) -> list[str]:
    return [r.fault for r in rows if r.fault]


def judge(rows: list[PowerRow], start: float, end: float, gpus: int = 2, interval: float = 0.1):  # type: ignore[no-untyped-def]
    return summarize(
        rows,
        window=Window(start + 0.5, end - 0.3),
        expected_gpus=gpus,
        interval_s=interval,
        work=Work(),
        source="t",
    )


def test_nvidia_smi_loop_samples_exactly_the_cells_gpus_at_now(tools, tmp_path):
    rows, start, end = run_for(tmp_path, spec("nvidia-smi", ("0", "3")), 2.0)
    assert faults(rows) == []
    assert {r.gpu for r in rows} == {"0", "3"} and {r.node for r in rows} == {"n1"}
    assert all(start - 1 < r.time_s < end + 1 for r in rows)  # the node's local stamps, as Unix time
    assert len(rows) >= 2 * 10
    assert rows[0].power_w == 71.18 and rows[0].energy_j is None  # the recording's first figures
    summary = judge(rows, start, end)
    assert summary.power_valid, summary.reasons
    assert summary.audit.energy_from == "power integral"


def test_a_missing_tool_is_one_fault_and_the_sampler_runs_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    rows, start, end = run_for(tmp_path, spec("nvidia-smi"), 1.0)
    assert faults(rows) == ["nvidia-smi on n1: cannot run nvidia-smi: No such file or directory"]
    summary = judge(rows, start, end)
    assert not summary.power_valid
    assert summary.reasons[0].endswith(
        "window: nvidia-smi on n1: cannot run nvidia-smi: No such file or directory"
    )


def test_a_gpu_id_the_node_lacks_is_left_out_and_found_missing(tools, tmp_path):
    """nvidia-smi prints nothing and no error for an id it lacks when others exist (recorded on an H200)."""
    rows, start, end = run_for(tmp_path, spec("nvidia-smi", ("0", "9")), 4.5)
    assert faults(rows) == ["nvidia-smi on n1: GPU 9 never reported"]
    assert {r.gpu for r in rows if not r.fault} == {"0"}
    summary = judge(rows, start, end)
    assert not summary.power_valid and "GPU 9 never reported" in summary.reasons[0]


def test_no_gpu_id_the_node_has_is_the_recorded_error_and_exit_status(tools, tmp_path):
    rows, start, end = run_for(tmp_path, spec("nvidia-smi", ("9",)), 1.5)
    assert faults(rows) == [
        "nvidia-smi on n1: output line 1: unexpected output (1 fields, the query asks for 7): 'No devices were found'",
        "nvidia-smi on n1: the tool exited with status 6; last line: 'No devices were found'",
    ]
    assert "No devices were found" in judge(rows, start, end, gpus=1).reasons[0]


def test_unexpected_output_names_the_line_and_sampling_goes_on(tools, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "garbage-after:5")
    rows, start, end = run_for(tmp_path, spec("nvidia-smi"), 2.0)
    (fault,) = faults(rows)
    assert fault == (
        "nvidia-smi on n1: output line 11: unexpected output (1 fields, the query asks for 7): "
        "'Unable to determine the device handle for GPU0000:18:00.0: Unknown Error'"
    )
    # Both GPUs went on being sampled after the bad line (how many times depends on the machine's load).
    after = rows[[r.fault for r in rows].index(fault) + 1 :]
    assert {r.gpu for r in after if not r.fault} == {"0", "1"}
    summary = judge(rows, start, end)
    assert not summary.power_valid and "output line 11" in summary.reasons[0]


def test_a_gpu_lost_part_way(tools, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "lost-after:5:1")
    rows, _start, _end = run_for(tmp_path, spec("nvidia-smi"), 2.0)
    (fault,) = faults(rows)
    assert fault.endswith("GPU 1 reports power.draw as [GPU is lost]")
    assert [r.gpu for r in rows if r.fault] == ["1"]
    assert max(r.time_s for r in rows if r.gpu == "1" and not r.fault) < max(
        r.time_s for r in rows if r.gpu == "0"
    )


def test_a_gpu_that_goes_silent(tools, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "vanish-after:3:1")
    s = spec("nvidia-smi", interval=0.1)
    rows, start, end = run_for(tmp_path, s, 4.5)
    assert any(f.startswith("nvidia-smi on n1: GPU 1 stopped reporting") for f in faults(rows)), faults(rows)
    summary = judge(rows, start, end)
    assert not summary.power_valid and "GPU 1 stopped reporting" in summary.reasons[0]


def test_a_tool_that_fails_part_way(tools, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "exit-after:4")
    rows, _start, _end = run_for(tmp_path, spec("nvidia-smi"), 2.0)
    assert faults(rows)[-1] == (
        "nvidia-smi on n1: the tool exited with status 9; last line: "
        "'Failed to initialize NVML: Driver/library version mismatch'"
    )


def test_an_unknown_field_is_refused_as_the_recorded_driver_does(tools, tmp_path):
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,total_energy_consumption"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stdout.startswith(
        'Field "total_energy_consumption" is not a valid field'
    )


def test_amd_smi_documents_with_their_energy_counter(tools, tmp_path):
    rows, start, end = run_for(tmp_path, spec("amd-smi", ("0", "1"), interval=0.2), 2.5)
    assert faults(rows) == []
    assert {r.gpu for r in rows} == {"0", "1"}
    assert {r.power_w for r in rows} == {1187.0, 213.0}
    summary = judge(rows, start, end, interval=0.2)
    assert summary.power_valid, summary.reasons
    assert summary.audit.energy_from == "counter"
    # Judged over the span every GPU was sampled in (a busy machine starts the tool late): the counters
    # there hold 1187 W + 213 W times that span.
    first = max(min(r.time_s for r in rows if r.gpu == g) for g in ("0", "1"))
    last = min(max(r.time_s for r in rows if r.gpu == g) for g in ("0", "1"))
    assert last - first > 1.0
    sampled = judge(rows, first - 0.5, last + 0.3, interval=0.2)
    assert sampled.audit.energy_from == "counter"
    assert sampled.total_gpu_energy_j == pytest.approx(1400.0 * (last - first), rel=0.05)


@pytest.mark.parametrize(
    ("mode", "fault"),
    [
        ("fail", "amd-smi on n1: amd-smi exited with status 1; output: 'ERROR:root:Unable to detect any GPU"),
        ("garbage", "amd-smi on n1: output up to line 3: not JSON: 'Traceback (most recent call last):"),
    ],
)
def test_amd_smi_failing_or_printing_something_else(tools, tmp_path, monkeypatch, mode, fault):
    monkeypatch.setenv("STANDIN_MODE", mode)
    rows, start, end = run_for(tmp_path, spec("amd-smi", interval=0.2), 1.0)
    assert len(faults(rows)) == 1 and faults(rows)[0].startswith(fault), faults(rows)
    assert not judge(rows, start, end, interval=0.2).power_valid


class _Exporter:
    """A DCGM endpoint on loopback whose text ``body(scrape_number)`` gives."""

    def __init__(self, body: Callable[[int], str]) -> None:
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                exporter.scrapes += 1
                data = body(exporter.scrapes).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.scrapes = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def dcgm_text(
    n: int, gpus: tuple[str, ...] = ("0", "1"), energy: Callable[[int], float] = lambda n: 1000.0 * n
) -> str:
    lines = ["# TYPE DCGM_FI_DEV_POWER_USAGE gauge", "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter"]
    for g in gpus:
        lines.append(f'DCGM_FI_DEV_POWER_USAGE{{gpu="{g}",UUID="GPU-{g}"}} 400')
        lines.append(f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="{g}",UUID="GPU-{g}"}} {energy(n)}')
    return "\n".join(lines) + "\n"


@pytest.fixture
def exporter() -> Iterator[Callable[[Callable[[int], str]], _Exporter]]:
    made: list[_Exporter] = []

    def make(body: Callable[[int], str]) -> _Exporter:
        made.append(_Exporter(body))
        return made[-1]

    yield make
    for e in made:
        e.close()


def test_dcgm_endpoint_samples_the_cells_gpus(tmp_path, exporter):
    e = exporter(lambda n: dcgm_text(n, gpus=("0", "1", "2")))
    rows, _start, _end = run_for(tmp_path, spec("dcgm", ("0", "2"), endpoint=e.url), 1.5)
    assert faults(rows) == [] and {r.gpu for r in rows} == {"0", "2"}
    assert all(r.energy_j is not None for r in rows)


def test_dcgm_counter_going_backwards(tmp_path, exporter):
    e = exporter(lambda n: dcgm_text(n, energy=lambda n: 1000.0 * n - (5e5 if n > 10 else 0)))
    rows, start, end = run_for(tmp_path, spec("dcgm", endpoint=e.url), 2.5)
    summary = judge(rows, start, end)
    assert not summary.power_valid
    assert any("energy counter of GPU n1/0 went backwards" in r for r in summary.reasons), summary.reasons


def test_dcgm_gpu_disappearing_and_endpoint_going_away(tmp_path, exporter):
    e = exporter(lambda n: dcgm_text(n, gpus=("0", "1") if n < 8 else ("0",)))
    rows, _, _ = run_for(tmp_path, spec("dcgm", endpoint=e.url), 1.5)
    assert f"dcgm on n1: GPU 1 is absent from {e.url}" in faults(rows)
    e.close()
    (tmp_path / "gone").mkdir()
    rows, _, _ = run_for(tmp_path / "gone", spec("dcgm", endpoint=e.url), 0.6)
    assert any("failed: URLError" in f for f in faults(rows)), faults(rows)


def test_a_reply_that_is_not_dcgm(tmp_path, exporter):
    e = exporter(
        lambda n: '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 1\n'
    )
    rows, _start, _end = run_for(tmp_path, spec("dcgm", endpoint=e.url), 0.6)
    assert faults(rows) == [
        f"dcgm on n1: GET {e.url} failed: NotDcgm: no DCGM_FI_DEV_POWER_USAGE in the reply"
    ]


def test_the_sampler_never_outlives_its_stop_nor_do_its_tools(tools, tmp_path, monkeypatch):
    """Started as the cell starts it (its own process group), stopped as the cell stops it: the tool it
    runs is gone too, even one that ignores everything but the group's end."""
    monkeypatch.setenv("STANDIN_MODE", "hang")
    pid_file = tmp_path / "tool.pid"
    monkeypatch.setenv("STANDIN_PID_FILE", str(pid_file))
    argv = [
        sys.executable, "-m", "agentsweep.cli", "power-sampler", "--spec", spec("nvidia-smi").to_json(),
        "--output", str(tmp_path / "power.csv"),
    ]  # fmt: skip
    proc = ManagedProcess(
        argv, log_path=tmp_path / "power-sampler.log", name="power sampler", stop_grace_s=5.0
    )
    proc.start()
    wait_for_file(pid_file, timeout=30)
    tool = int(pid_file.read_text())
    assert pid_running(tool)
    proc.signal_group(signal.SIGTERM)
    assert proc.stop() == 0
    wait_until(lambda: not pid_running(tool), timeout=10, what="the tool to end with its sampler")
    assert "power-sampler: stopped" in (tmp_path / "power-sampler.log").read_text()


@pytest.mark.parametrize(
    ("source", "visible", "count", "expected"),
    [
        ("nvidia-smi", "CUDA_VISIBLE_DEVICES=2,5", 2, {"2", "5"}),
        ("amd-smi", "ROCR_VISIBLE_DEVICES=4,5,6", 2, {"4", "5"}),
    ],
)
def test_a_node_whose_gpus_are_named_inside_its_step(tools, tmp_path, source, visible, count, expected):
    """Another node's tool runs under its job step's prefix (here `env`, standing for srun and the GPU
    selector): the step names the GPUs it holds and only the cell's are sampled."""
    target = PowerTarget(node="n2", count=count, prefix=("env", visible))
    s = SamplerSpec(source=source, interval_s=0.2, targets=(target,))  # type: ignore[arg-type]
    rows, start, end = run_for(tmp_path, s, 2.0)
    assert faults(rows) == []
    assert {r.gpu for r in rows} == expected and {r.node for r in rows} == {"n2"}
    assert judge(rows, start, end, gpus=count, interval=0.2).power_valid


def test_a_step_showing_fewer_gpus_than_the_cell_has_there(tools, tmp_path):
    target = PowerTarget(node="n2", count=2, prefix=("env", "CUDA_VISIBLE_DEVICES=3"))
    rows, _start, _end = run_for(
        tmp_path, SamplerSpec(source="nvidia-smi", interval_s=0.2, targets=(target,)), 1.0
    )
    assert faults(rows) == ["nvidia-smi on n2: the job step shows 1 GPUs ('#gpus 3'), the cell has 2 here"]
