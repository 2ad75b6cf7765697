"""Disaggregated prefill/decode cells: the resolved commands (what --dry-run prints), the files, the
DRAM shares, refusals, and the router's per-role figures from a real router in its PD mode."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from agentsweep.cell.plan import plan_cell
from agentsweep.cell.port_allocation import DryRunPortAllocator
from agentsweep.cli import main
from agentsweep.config import load_runners
from agentsweep.contract.cell import Cell

NIXL = """'{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""
BASE = {
    "config_key": "k", "exp_name": "k-tp2-ep1-u4-off-p1x2-d1x2-round_robin", "users": 4, "offload": "off",
    "model": "m", "precision": "fp8", "duration": 60, "traces": "t", "tp": 2,
    "prefill": {"replicas": 1, "tp": 2}, "decode": {"replicas": 1, "tp": 2}, "router": "round_robin",
}  # fmt: skip


def _dry_run(
    cell: dict[str, object],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    devices: str | None = None,
) -> tuple[int, list[str]]:
    """`agentsweep cell --dry-run` of ``cell`` with the project's runners; (exit status, lines)."""
    for name in ("PORT", "CUDA_VISIBLE_DEVICES", "AGENTSWEEP_RUNNERS"):
        monkeypatch.delenv(name, raising=False)
    if devices is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", devices)
    monkeypatch.setenv("RESULT_DIR", str(tmp_path / "rd"))
    rc = main(["cell", "--cell", json.dumps(cell), "--dry-run"])
    out = capsys.readouterr()
    text = (out.out + out.err).replace(sys.executable, "PY").replace(str(tmp_path), "TMP")
    return rc, text.splitlines()


def kv_events(tag: str) -> str:
    """The flag that makes an instance publish its KV-cache events to its scraper (shell-quoted)."""
    endpoint = f"tcp://127.0.0.1:${tag}_KV_EVENTS_PORT"
    return f"""--kv-events-config '{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"{endpoint}"}}'"""


@pytest.mark.parametrize(
    ("hardware", "devices", "slices"),
    [
        ("h200", "4,5,6,7", ("CUDA_VISIBLE_DEVICES=4,5", "CUDA_VISIBLE_DEVICES=6,7")),
        ("b200", None, ("CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=2,3")),
        ("mi355x", None, ("HIP_VISIBLE_DEVICES=0,1", "HIP_VISIBLE_DEVICES=2,3")),
    ],
)
def test_vllm_prefill_decode_commands(
    hardware: str,
    devices: str | None,
    slices: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    rc, lines = _dry_run(
        {**BASE, "runner": hardware, "engine": "vllm"}, monkeypatch, capsys, tmp_path, devices
    )
    assert rc == 0, lines
    assert lines[0] == "disaggregated: prefill p0; decode d0"
    assert lines[1] == (
        f"prefill 0: {slices[0]} VLLM_NIXL_SIDE_CHANNEL_PORT='$PREFILL0_NIXL_PORT' vllm serve m --host 127.0.0.1 "
        f"--port '$PREFILL0_PORT' --tensor-parallel-size 2 --enable-prompt-tokens-details "
        f"--kv-transfer-config {NIXL} {kv_events('PREFILL0')}"
    )
    decode = lines.index("  log:     server.p0.log") + 1
    assert lines[decode] == (
        f"decode 0: {slices[1]} VLLM_NIXL_SIDE_CHANNEL_PORT='$DECODE0_NIXL_PORT' vllm serve m --host 127.0.0.1 "
        f"--port '$DECODE0_PORT' --tensor-parallel-size 2 --enable-prompt-tokens-details "
        f"--kv-transfer-config {NIXL} {kv_events('DECODE0')}"
    )
    router = next(line for line in lines if line.startswith("router:"))
    assert router == (
        "router:  PY -m vllm_router.launch_router --host 127.0.0.1 --port '$PORT' --vllm-pd-disaggregation "
        "--prefill 'http://127.0.0.1:$PREFILL0_PORT' --decode 'http://127.0.0.1:$DECODE0_PORT' "
        "--policy round_robin --prometheus-host 127.0.0.1 --prometheus-port '$ROUTER_METRICS_PORT' "
        "--worker-startup-check-interval 1 --log-level warning"
    )
    assert "bootstrap port" not in "\n".join(lines)  # NIXL pulls; vllm-router is given no bootstrap port


@pytest.mark.parametrize(
    ("hardware", "backend", "slices"),
    [
        (
            "h200",
            "mooncake",
            ("CUDA_VISIBLE_DEVICES=4", "CUDA_VISIBLE_DEVICES=5", "CUDA_VISIBLE_DEVICES=6,7"),
        ),
        (
            "b200",
            "mooncake",
            ("CUDA_VISIBLE_DEVICES=4", "CUDA_VISIBLE_DEVICES=5", "CUDA_VISIBLE_DEVICES=6,7"),
        ),
        ("mi355x", "mori", ("HIP_VISIBLE_DEVICES=0", "HIP_VISIBLE_DEVICES=1", "HIP_VISIBLE_DEVICES=2,3")),
    ],
)
def test_sglang_prefill_decode_commands(
    hardware: str,
    backend: str,
    slices: tuple[str, str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    cell = {**BASE, "runner": hardware, "engine": "sglang", "prefill": {"replicas": 2, "tp": 1}}
    devices = None if hardware == "mi355x" else "4,5,6,7"
    rc, lines = _dry_run(cell, monkeypatch, capsys, tmp_path, devices)
    assert rc == 0, lines
    assert lines[0] == "disaggregated: prefill p0, p1; decode d0"
    engines = [line for line in lines if line.startswith(("prefill ", "decode "))]
    common = "python3 -m sglang.launch_server --model-path m --host 127.0.0.1"
    assert engines == [
        f"prefill 0: {slices[0]} {common} --port '$PREFILL0_PORT' --tp-size 1 --enable-metrics "
        f"--enable-cache-report --disaggregation-mode prefill --disaggregation-transfer-backend {backend} "
        "--disaggregation-bootstrap-port '$PREFILL0_BOOTSTRAP_PORT'",
        f"prefill 1: {slices[1]} {common} --port '$PREFILL1_PORT' --tp-size 1 --enable-metrics "
        f"--enable-cache-report --disaggregation-mode prefill --disaggregation-transfer-backend {backend} "
        "--disaggregation-bootstrap-port '$PREFILL1_BOOTSTRAP_PORT'",
        f"decode 0: {slices[2]} {common} --port '$DECODE0_PORT' --tp-size 2 --enable-metrics "
        f"--enable-cache-report --disaggregation-mode decode --disaggregation-transfer-backend {backend}",
    ]
    router = next(line for line in lines if line.startswith("router:"))
    assert router == (
        "router:  PY -m smg launch --host 127.0.0.1 --port '$PORT' --pd-disaggregation "
        "--prefill 'http://127.0.0.1:$PREFILL0_PORT' '$PREFILL0_BOOTSTRAP_PORT' "
        "--prefill 'http://127.0.0.1:$PREFILL1_PORT' '$PREFILL1_BOOTSTRAP_PORT' "
        "--decode 'http://127.0.0.1:$DECODE0_PORT' --policy round_robin --prometheus-host 127.0.0.1 "
        "--prometheus-port '$ROUTER_METRICS_PORT' --worker-startup-check-interval 1 --log-level warn"
    )
    assert next(line for line in lines if line.startswith("  ready:")).endswith("/readiness")


def _sim_plan(tmp_path: Path, program: str, **over: object):
    cell = Cell.parse(
        {**BASE, "runner": "local", "hardware": "h200", "engine": "sim", "router_program": program, **over}
    )
    assert cell.kv_transfer_gbs == 450.0  # a local runner's: inside one node
    return plan_cell(cell, tmp_path, ports=DryRunPortAllocator(), python="py", environ={})


@pytest.mark.parametrize("program", ["vllm-router", "smg"])
def test_simulated_prefill_decode_commands(tmp_path: Path, program: str) -> None:
    so = plan = _sim_plan(tmp_path, program, prefill={"replicas": 2, "tp": 1})
    assert so.router is not None and so.mode == "pd"
    sim = "py -m agentsweep.cli engine-sim m --host 127.0.0.1"
    common = "--hardware h200 --speed 1 --quantization fp8"
    assert [" ".join(r.engine.argv) for r in so.instances] == [
        f"{sim} --port $PREFILL0_PORT --tensor-parallel-size 1 {common} --disaggregation-mode prefill "
        "--disaggregation-bootstrap-port $PREFILL0_BOOTSTRAP_PORT --kv-transfer-gbs 450",
        f"{sim} --port $PREFILL1_PORT --tensor-parallel-size 1 {common} --disaggregation-mode prefill "
        "--disaggregation-bootstrap-port $PREFILL1_BOOTSTRAP_PORT --kv-transfer-gbs 450",
        f"{sim} --port $DECODE0_PORT --tensor-parallel-size 2 {common} --disaggregation-mode decode "
        "--kv-transfer-gbs 450",
    ]
    assert all(r.engine.env == {} for r in so.instances)
    argv = so.router.argv
    prefill = argv[argv.index("--prefill") : argv.index("--decode")]
    if program == "smg":  # the simulated engine answers SGLang's rendezvous: smg is told the port
        assert prefill == [
            "--prefill", "http://127.0.0.1:$PREFILL0_PORT", "$PREFILL0_BOOTSTRAP_PORT",
            "--prefill", "http://127.0.0.1:$PREFILL1_PORT", "$PREFILL1_BOOTSTRAP_PORT",
        ]  # fmt: skip
    else:
        assert prefill == [
            "--prefill", "http://127.0.0.1:$PREFILL0_PORT", "--prefill", "http://127.0.0.1:$PREFILL1_PORT",
        ]  # fmt: skip
    assert argv[argv.index("--decode") : argv.index("--policy")] == [
        "--decode",
        "http://127.0.0.1:$DECODE0_PORT",
    ]
    # The replayer talks to the router; the plan's engine is the client-facing decode instance.
    assert plan.replay_argv[plan.replay_argv.index("--api-endpoint") + 1] == "http://127.0.0.1:$PORT"
    assert plan.engine is so.decode[0].engine


def test_file_names_and_record(tmp_path: Path) -> None:
    so = _sim_plan(tmp_path, "smg", prefill={"replicas": 2, "tp": 1}, decode={"replicas": 2, "tp": 1}, tp=1)
    assert so.router is not None
    assert [(r.name, r.log_name, r.metrics_name) for r in so.instances] == [
        ("p0", "server.p0.log", "server_metrics.p0.csv"),
        ("p1", "server.p1.log", "server_metrics.p1.csv"),
        ("d0", "server.log", "server_metrics.d0.csv"),
        ("d1", "server.d1.log", "server_metrics.d1.csv"),
    ]
    assert [r.name for r in so.answering] == ["d0", "d1"] and so.client.name == "d0"
    assert so.instances[0].scraper_argv[so.instances[0].scraper_argv.index("--output") + 1] == str(
        tmp_path / "server_metrics.p0.csv"
    )
    rec = so.scaleout_record()
    assert rec["mode"] == "pd"
    assert rec["prefill"] == ["http://127.0.0.1:$PREFILL0_PORT", "http://127.0.0.1:$PREFILL1_PORT"]
    assert rec["decode"] == ["http://127.0.0.1:$DECODE0_PORT", "http://127.0.0.1:$DECODE1_PORT"]
    assert [(r["name"], r["role"], r.get("bootstrap_port")) for r in rec["replicas"]] == [
        ("p0", "prefill", "$PREFILL0_BOOTSTRAP_PORT"),
        ("p1", "prefill", "$PREFILL1_BOOTSTRAP_PORT"),
        ("d0", "decode", None),
        ("d1", "decode", None),
    ]
    assert rec["router"]["program"] == "smg"


def test_data_parallel_cells_keep_their_replica_names(tmp_path: Path) -> None:
    cell = Cell.parse(
        {**BASE, "engine": "sim", "hardware": "h200", "prefill": None, "decode": None, "replicas": 2, "tp": 1}
    )
    so = plan_cell(cell, tmp_path, ports=DryRunPortAllocator(), python="py", environ={})
    assert so.router is not None and so.mode == "dp"
    assert [(r.name, r.log_name, r.metrics_name) for r in so.instances] == [
        ("r0", "server.log", "server_metrics.r0.csv"),
        ("r1", "server.r1.log", "server_metrics.r1.csv"),
    ]
    assert "--disaggregation-mode" not in so.instances[0].engine.argv
    assert "--worker-urls" in so.router.argv and "--prefill" not in so.router.argv


def test_each_instance_gets_its_gpus_share_of_the_offload_budget(tmp_path: Path) -> None:
    over = {"offload": "on", "cpu_dram_gb": 100.0, "tp": 2, "prefill": {"replicas": 1, "tp": 1}}
    so = _sim_plan(tmp_path, "smg", **over)
    assert so.router is not None
    sizes = [r.engine.argv[r.engine.argv.index("--kv-offloading-size") + 1] for r in so.instances]
    assert sizes == ["33.3", "66.6"]  # 100 GiB x 1/3 and x 2/3, floored to 0.1
    cell = Cell.parse({**BASE, "runner": "h200", "engine": "sglang", **over})
    so = plan_cell(cell, tmp_path, ports=DryRunPortAllocator(), python="py", environ={})
    assert so.router is not None
    per_rank = [r.engine.argv[r.engine.argv.index("--hicache-size") + 1] for r in so.instances]
    assert per_rank == ["33", "33"]  # 33.3 GiB on one rank; 66.6 GiB over two


def test_kv_transfer_bandwidth_follows_the_nodes_the_cell_spans(tmp_path: Path) -> None:
    runners = tmp_path / "runners.yaml"
    runners.write_text(
        "two:\n  runs_on: [self-hosted]\n  launcher: runners/launch_local.sh\n  gpus_per_node: 2\n"
        "  cpu_dram_gb: 400\n  container_runtime: none\n  max_nodes: 2\n"
        "  intra_node_gbs: 300\n  inter_node_gbs: 25\n"
    )
    facts = load_runners(runners)["two"].facts().model_dump()  # what the matrix copies into a cell
    one = Cell.parse(
        {
            **BASE,
            "runner": "two",
            "engine": "sim",
            "tp": 1,
            "prefill": {"tp": 1},
            "decode": {"tp": 1},
            **facts,
        }
    )
    assert one.kv_transfer_gbs == 300.0
    assert one.replace(nodes=2).kv_transfer_gbs == 25.0
    plain = one.replace(prefill=None, decode=None)
    assert plain.kv_transfer_gbs is None


def test_too_few_visible_gpus_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, lines = _dry_run({**BASE, "runner": "h200", "engine": "vllm"}, monkeypatch, capsys, tmp_path, "0,1")
    assert rc == 2
    assert lines == [
        "input error: cell k-tp2-ep1-u4-off-p1x2-d1x2-round_robin: prefill 1x2 + decode 1x2 need 4 GPUs "
        "but CUDA_VISIBLE_DEVICES=0,1 shows 2"
    ]


def _transfer_config(argv: list[str]) -> dict[str, object]:
    assert argv.count("--kv-transfer-config") == 1, argv
    config: dict[str, object] = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    return config


@pytest.mark.parametrize(
    ("hardware", "connector_field", "child"),
    [
        ("h200", "native", "OffloadingConnector"),
        ("b200", "simple", "SimpleCPUOffloadConnector"),
        ("mi355x", "simple", "OffloadingConnector"),  # MI355X never gets the simple connector
    ],
)
def test_vllm_offload_in_a_disaggregated_cell_is_composed_with_nixl(
    hardware: str,
    connector_field: str,
    child: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Each instance gets one --kv-transfer-config: MultiConnector, NIXL first (the decode loads the
    prefill's blocks through it), then the offloading connector with the instance's share of the DRAM
    budget in bytes; no --kv-offloading-size, which would replace NIXL. The dry run says so."""
    cell = Cell.parse(
        {**BASE, "runner": hardware, "hardware": hardware, "engine": "vllm", "offload": "on",
         "cpu_dram_gb": 400.0, "offload_connector": connector_field,
         "exp_name": "k-tp2-ep1-u4-on-p1x2-d1x2-round_robin"}
    )  # fmt: skip
    plan = plan_cell(cell, tmp_path, ports=DryRunPortAllocator(), python="py", environ={})
    for inst in plan.instances:  # prefill 1x2 + decode 1x2: each half of the 400 GiB
        argv = inst.engine.argv
        assert "--kv-offloading-size" not in argv and "--kv-offloading-backend" not in argv
        assert "VLLM_USE_SIMPLE_KV_OFFLOAD" not in inst.engine.env
        assert inst.engine.env["VLLM_NIXL_SIDE_CHANNEL_PORT"].endswith("_NIXL_PORT")
        assert _transfer_config(argv) == {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "connectors": [
                    {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                    {
                        "kv_connector": child,
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": 200 * 2**30},
                    },
                ]
            },
        }
        assert ("--disable-hybrid-kv-cache-manager" in argv) == (hardware == "mi355x")
    rc, lines = _dry_run(cell.to_dict(), monkeypatch, capsys, tmp_path)
    assert rc == 0, lines
    notes = [line for line in lines if line.startswith("  note:")]
    assert (
        notes
        == [f"  note:    CPU offload composed with NIXL: MultiConnector [NixlConnector, {child} 200 GiB]"] * 2
    )


def test_vllm_offload_outside_a_disaggregated_cell_keeps_the_offloading_flags(tmp_path: Path) -> None:
    cell = Cell.parse(
        {**BASE, "runner": "h200", "hardware": "h200", "engine": "vllm", "offload": "on",
         "cpu_dram_gb": 400.0, "prefill": None, "decode": None, "replicas": 2,
         "exp_name": "k-tp2-ep1-u4-on-r2-round_robin"}
    )  # fmt: skip
    plan = plan_cell(cell, tmp_path, ports=DryRunPortAllocator(), python="py", environ={})
    for inst in plan.instances:
        argv = inst.engine.argv
        assert argv[argv.index("--kv-offloading-size") + 1] == "200" and "--kv-transfer-config" not in argv
        assert not inst.engine.notes
