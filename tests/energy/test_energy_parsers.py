"""The power sources' parsers on recorded output (fixtures/README.md says where each file comes from):
nvidia-smi's query lines and error forms from an H100, amd-smi's JSON in its documented format, and
the DCGM exporter's metrics."""

from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import pytest
from agentsweep.energy import amd_smi, dcgm, nvidia_smi
from agentsweep.energy.powercsv import GpuReading

FIXTURES = Path(__file__).parent / "fixtures"
LOOP = (FIXTURES / "nvidia-smi-loop-load.h100.csv").read_text().splitlines()
HELP = (FIXTURES / "nvidia-smi-help-query-gpu.h100.txt").read_text()
FACTS = (FIXTURES / "nvidia-smi-facts.h100.txt").read_text()
# The recording's query (fixtures/README.md).
LOOP_FIELDS = (
    "timestamp", "index", "uuid", "power.draw", "power.draw.instant", "temperature.gpu",
    "utilization.gpu", "memory.used", "memory.total",
)  # fmt: skip


def valid_fields() -> set[str]:
    """Every field name (and alias) the recorded driver's --help-query-gpu lists."""
    pairs = re.findall(r'^"([^"]+)"(?: or "([^"]+)")?', HELP, flags=re.M)
    return {name for pair in pairs for name in pair if name}


def test_every_queried_field_is_valid_in_the_recorded_driver_and_none_is_an_energy_counter():
    fields = valid_fields()
    assert set(nvidia_smi.QUERY_FIELDS) <= fields, set(nvidia_smi.QUERY_FIELDS) - fields
    assert not any("energy" in name for name in fields)  # nvidia-smi's query has no energy counter
    assert 'Field "total_energy_consumption" is not a valid field to query.' in FACTS


def test_the_loop_command_asks_for_the_cells_gpus_at_the_interval():
    argv = nvidia_smi.command(["0", "3"], 0.5)
    assert argv == [
        "nvidia-smi",
        "--query-gpu=timestamp,index,uuid,power.draw,temperature.gpu,utilization.gpu,memory.used",
        "--format=csv,noheader,nounits",
        "--id=0,3",
        "--loop-ms=500",
    ]


def test_every_recorded_line_parses_with_its_figures():
    lines = [nvidia_smi.parse_line(line, LOOP_FIELDS) for line in LOOP]
    assert len(lines) == 114
    assert {ln.reading.gpu for ln in lines} == {"0"}
    assert {ln.uuid for ln in lines} == {"GPU-3560572e-d4f9-3a22-8e1a-8204cd87d52b"}
    first, peak = lines[0], max(lines, key=lambda ln: ln.reading.power_w or 0)
    assert first.stamp == "2026/11/25 21:23:43.882"
    assert first.reading == GpuReading("0", power_w=71.18, temp_c=36.0, util_pct=0.0, mem_used_mib=0.0)
    assert peak.reading.power_w == 713.21 and peak.reading.util_pct == 100.0 and peak.reading.temp_c == 52.0
    assert all(ln.reading.energy_j is None for ln in lines)


def test_the_samplers_own_query_parses():
    line = "2026/11/25 21:23:52.398, 0, GPU-3560572e-d4f9-3a22-8e1a-8204cd87d52b, 432.68, 56, 100, 1139"
    parsed = nvidia_smi.parse_line(line)
    assert parsed.reading == GpuReading("0", power_w=432.68, temp_c=56.0, util_pct=100.0, mem_used_mib=1139.0)


@pytest.mark.parametrize("na", ["[N/A]", "[Not Supported]"])
def test_a_figure_the_gpu_does_not_report_is_empty_not_zero(na):
    line = f"2026/11/25 21:23:52.398, 2, GPU-x, {na}, 56, {na}, 1139"
    reading = nvidia_smi.parse_line(line).reading
    assert reading.power_w is None and reading.util_pct is None and reading.temp_c == 56.0


def test_a_lost_gpu_is_a_fault_of_that_gpu():
    with pytest.raises(nvidia_smi.GpuFault, match=r"GPU 1 reports power.draw as \[GPU is lost\]") as err:
        nvidia_smi.parse_line("2026/11/25 21:23:52.398, 1, GPU-x, [GPU is lost], [GPU is lost], 0, 0")
    assert err.value.gpu == "1"


@pytest.mark.parametrize(
    "line",
    [
        'Field "bogus.field" is not a valid field to query.',  # recorded: an unknown field
        "No devices were found",  # recorded: a GPU id that does not exist
        "2026/11/25 21:23:52.398, 0, GPU-x, 43",  # a cut line
        "2026/11/25 21:23:52.398, 0, GPU-x, 71.16 W, 36, 0, 0",  # units: not the nounits format
    ],
)
def test_anything_else_is_unexpected_output_naming_the_line(line):
    with pytest.raises(nvidia_smi.UnexpectedOutput) as err:
        nvidia_smi.parse_line(line)
    assert line[:20] in str(err.value)


def test_the_recorded_error_forms_are_what_the_parser_meets():
    assert "No devices were found\nrc=6" in FACTS
    assert 'Field "bogus.field" is not a valid field to query.\n\nrc=2' in FACTS


def test_zone_less_timestamps_become_unix_time_whatever_the_nodes_zone():
    stamp = "2026/11/25 21:23:43.882"
    utc = calendar.timegm(time.strptime("2026/11/25 21:23:43", "%Y/%m/%d %H:%M:%S")) + 0.882
    for zone_h in (0, -5, 5.5, 9):
        clock = nvidia_smi.NodeClock()
        arrived = utc + 0.4  # the line reaches the sampler a little later
        local = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(utc + zone_h * 3600)) + ".882"
        assert clock.unix(local, arrived) == pytest.approx(utc)
        # Later lines keep the offset even when they arrive in a burst (a pipe's buffer).
        later = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(utc + zone_h * 3600 + 10)) + ".882"
        assert clock.unix(later, arrived + 30) == pytest.approx(utc + 10)
    assert nvidia_smi.NodeClock().unix(None, 123.0) == 123.0
    assert stamp in LOOP[0]


def test_amd_smi_document_in_the_rocm6_list_form():
    readings = amd_smi.parse_document((FIXTURES / "amd-smi-metric.from-amd-docs.json").read_text())
    assert readings == [
        GpuReading(
            "0", power_w=1187.0, energy_j=183245.342, temp_c=71.0, util_pct=97.0, mem_used_mib=253108.0
        ),
        GpuReading("1", power_w=213.0, energy_j=None, temp_c=38.0, util_pct=0.0, mem_used_mib=283.0),
    ]


def test_amd_smi_document_in_the_rocm7_gpu_data_form_with_na_figures():
    (reading,) = amd_smi.parse_document((FIXTURES / "amd-smi-metric-gpu-data.from-amd-docs.json").read_text())
    assert reading == GpuReading(
        "0", power_w=None, energy_j=5021.119, temp_c=44.0, util_pct=None, mem_used_mib=283.0
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("amd-smi: command not found", "not JSON"),
        ('{"error": "AMDSMI_STATUS_NO_PERM"}', "not a list of GPUs"),
        ('[{"power": {}}]', "without 'gpu'"),
        ('[{"gpu": 0, "power": {"socket_power": {"value": "high", "unit": "W"}}}]', "socket_power is"),
        ('[{"gpu": 0, "power": {"socket_power": {"value": 3, "unit": "BTU"}}}]', "unit 'BTU'"),
        ('[{"gpu": 0, "power": 7}]', "power is 7"),
    ],
)
def test_an_unexpected_amd_smi_document_says_what_is_wrong(text, message):
    with pytest.raises(amd_smi.UnexpectedDocument, match=re.escape(message)):
        amd_smi.parse_document(text)


def test_amd_smi_command_and_loop():
    assert amd_smi.command(["0", "5"]) == [
        "amd-smi", "metric", "-g", "0", "5", "--power", "--temperature", "--usage", "--mem-usage", "--energy",
        "--json",
    ]  # fmt: skip
    script = amd_smi.loop_script(["0"], 1.0)
    assert script.startswith("while :; do amd-smi metric -g 0 --power") and 'echo "#fail $?"' in script
    assert script.endswith('echo "#end"; sleep 1; done')


DCGM_TEXT = """\
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="n1"} 44
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H200",Hostname="n1"} 61
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="n1"} 118.25
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H200",Hostname="n1"} 652.5
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="n1"} 2220779
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H200",Hostname="n1"} 98311000
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H200",Hostname="n1"} 100
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="n1"} 0
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H200",Hostname="n1"} 130221
"""


def test_dcgm_metrics_per_gpu_in_watts_joules_celsius_percent_mib():
    readings = dcgm.parse_metrics(DCGM_TEXT)
    assert readings == {
        "0": GpuReading("0", power_w=118.25, energy_j=2220.779, temp_c=44.0, util_pct=None, mem_used_mib=0.0),
        "1": GpuReading(
            "1", power_w=652.5, energy_j=98311.0, temp_c=61.0, util_pct=100.0, mem_used_mib=130221.0
        ),
    }
    found, absent = dcgm.pick(readings, ["1", "5"])
    assert [r.gpu for r in found] == ["1"] and absent == ["5"]


def test_a_reply_without_dcgm_power_is_not_dcgm():
    with pytest.raises(dcgm.NotDcgm):
        dcgm.parse_metrics(
            '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 3\n'
        )
    with pytest.raises(ValueError):
        dcgm.parse_metrics("<html>proxy error</html>\n{")


H200_LOOP = (FIXTURES / "nvidia-smi-loop-load.h200.csv").read_text().splitlines()
H200_FACTS = (FIXTURES / "nvidia-smi-facts.h200.txt").read_text()


def test_the_samplers_own_query_recorded_on_an_h200_parses():
    lines = [nvidia_smi.parse_line(line) for line in H200_LOOP]
    assert len(lines) == 135 and {ln.reading.gpu for ln in lines} == {"0"}
    assert {ln.uuid for ln in lines} == {"GPU-b1617fa7-dffa-120d-5c20-f60919430823"}
    watts = [ln.reading.power_w or 0.0 for ln in lines]
    assert 80 < min(watts) < 81 and 690 < max(watts) < 700  # idle, and the 700 W limit under the matmuls
    assert (
        max(ln.reading.temp_c or 0 for ln in lines) == 64.0
        and max(ln.reading.mem_used_mib or 0 for ln in lines) == 3443.0
    )


def test_recorded_h200_lines_through_a_pipe_arrive_at_their_timestamp():
    """The zone offset found from the first line holds: every line's time equals its arrival."""
    piped = H200_FACTS.split("### stdout is a pipe: arrival time (Unix) of each line, then the line\n")[1]
    clock = nvidia_smi.NodeClock()
    lines = [line.split(" ", 1) for line in piped.splitlines() if line[:1].isdigit() and ", 0, GPU-" in line]
    assert len(lines) == 7
    for arrived, text in lines:
        assert clock.unix(nvidia_smi.parse_line(text).stamp, float(arrived)) == pytest.approx(
            float(arrived), abs=0.02
        )
    assert clock.offset_s == 0.0  # that node keeps UTC


def test_recorded_h200_error_forms():
    assert "### --id=0,1 on a one-GPU machine\n2026/11/26 00:17:30.460, 0, GPU-" in H200_FACTS  # no error
    assert 'Field "total_energy_consumption" is not a valid field to query.\n\nrc=2' in H200_FACTS
    assert "#gpus 0\n2026/11/26 00:17:29.184, 0," in H200_FACTS  # the job-step script's first line


@pytest.mark.parametrize("figure", ["nan", "inf", "-inf"])
def test_a_non_finite_figure_is_unexpected_output(figure):
    with pytest.raises(nvidia_smi.UnexpectedOutput, match=f"power.draw is '{figure}'"):
        nvidia_smi.parse_line(f"2026/11/25 21:23:52.398, 0, GPU-x, {figure}, 56, 100, 1139")
