"""vLLM's evictions in a cell: the scraper counts the engine's KV-cache events (a real ZMQ publisher
sending vLLM's wire format: topic, 8-byte sequence, msgpack batch) into evicted_tokens_total, and a
listener that lost events leaves the column empty with the reason; the plan wires a vLLM cell's engine
to its scraper on a loopback port of its own."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq
from agentsweep.cell.plan import plan_cell
from agentsweep.cell.port_allocation import DryRunPortAllocator
from agentsweep.contract.cell import Cell
from agentsweep.metrics.kv_events import Counts

from tests.support import canned_server, free_port, poll_until

FIXTURES = Path(__file__).parent / "fixtures"
BLOCK = 16


def _frames(seq: int, *events: dict) -> list[bytes]:
    # vLLM's EventBatch is array-like: [ts, events, data_parallel_rank]; each event a map tagged by type.
    return [b"kv", seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), list(events), 0])]


def _stored(*hashes: int, size: int = BLOCK) -> dict:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None,
            "token_ids": [0] * size * len(hashes), "block_size": size, "lora_id": None, "medium": "GPU"}  # fmt: skip


def _removed(*hashes: int, medium: str = "GPU") -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


def _counts(*messages: list[bytes]) -> Counts:
    counts = Counts()
    for frames in messages:
        counts.take(frames)
    return counts


def test_evicted_tokens_are_whole_counts_or_none_with_the_reason():
    assert Counts().evicted_tokens() == (0.0, "")  # nothing published yet
    whole = _counts(_frames(0, _stored(1, 2, 3)), _frames(1, _removed(1, 2), _removed(7, medium="CPU")))
    assert whole.evicted_tokens() == (2 * BLOCK, "")  # GPU blocks only, in tokens
    late = _counts(_frames(4, _stored(1)), _frames(5, _removed(1)))
    assert late.evicted_tokens() == (
        None,
        "the KV-event listener lost events (the first 4 messages): no partial count",
    )
    gap = _counts(_frames(0, _stored(1)), _frames(3, _removed(1)))
    assert gap.evicted_tokens()[0] is None and "2 messages" in gap.evicted_tokens()[1]
    restarted = _counts(_frames(0, _stored(1)), _frames(0, _removed(1)))
    assert restarted.evicted_tokens()[0] is None and "1 publisher restarts" in restarted.evicted_tokens()[1]
    mixed = _counts(_frames(0, _stored(1, size=16), _stored(2, size=32)), _frames(1, _removed(1)))
    assert mixed.evicted_tokens() == (
        None,
        "the engine's blocks have several sizes: evicted blocks are not tokens",
    )
    unsized = _counts(_frames(0, _removed(1)))
    assert unsized.evicted_tokens() == (None, "no BlockStored event stated the block size")


def _collector(url: str, out: Path, port: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "agentsweep.cli", "metrics-collector", "--endpoint", url]
    argv += ["--output", str(out), "--interval", "0.1", "--kv-events-port", str(port)]
    return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=os.environ.copy())


def _publish(port: int, messages: list[list[bytes]]) -> None:
    """A PUB socket connecting to the scraper's (as vLLM's publisher does to an endpoint without '*')."""
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.connect(f"tcp://127.0.0.1:{port}")
    time.sleep(0.5)  # the connection is up before the first message (vLLM publishes on requests only)
    for frames in messages:
        pub.send_multipart(frames)
    time.sleep(0.5)
    pub.close(linger=1000)
    context.term()


def _run(tmp_path: Path, messages: list[list[bytes]]) -> tuple[list[dict[str, str]], dict, str]:
    text = (FIXTURES / "vllm_by_source.prom").read_text()
    out, port = tmp_path / "server_metrics.csv", free_port()
    with canned_server() as server:
        server.serve([text])
        url = f"{server.url}/metrics"
        proc = _collector(url, out, port)
        try:
            poll_until(lambda: out.exists() and len(out.read_text().splitlines()) > 2, timeout=20)
            _publish(port, messages)
            time.sleep(0.5)  # a few scrapes after the last event
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
    rows = list(csv.DictReader(out.open()))
    return rows, json.loads(out.with_name("server_metrics.sources.json").read_text()), err


@pytest.mark.integration
def test_the_scraper_counts_the_engines_evictions_from_its_kv_events(tmp_path):
    messages = [
        _frames(0, _stored(1, 2, 3, 4)),
        _frames(1, _removed(1, 2), _removed(9, medium="CPU")),
        _frames(2, _stored(5), _removed(3)),
    ]
    rows, sources, err = _run(tmp_path, messages)
    listener = _counts(*messages)
    assert listener.evicted_tokens() == (3 * BLOCK, "")
    assert rows[0]["evicted_tokens_total"] == "0"  # before the first event: nothing evicted yet
    assert float(rows[-1]["evicted_tokens_total"]) == 3 * BLOCK  # the listener's own count, in tokens
    assert sources["columns"]["evicted_tokens_total"].startswith(
        "KV-cache events (BlockRemoved, GPU) received on tcp://127.0.0.1:"
    )
    assert "3 GPU blocks evicted, 0 messages missing, first sequence 0" in err


@pytest.mark.integration
def test_a_listener_that_lost_events_leaves_the_column_empty_with_the_reason(tmp_path):
    rows, sources, _ = _run(tmp_path, [_frames(0, _stored(1, 2)), _frames(3, _removed(1))])
    assert rows[-1]["evicted_tokens_total"] == ""  # never a partial count
    assert sources["columns"]["evicted_tokens_total"] == (
        "absent: the KV-event listener lost events (2 messages): no partial count"
    )


def _cell(**over: object) -> Cell:
    fields = {"exp_name": "v", "engine": "vllm", "model": "m", "tp": 1, "users": 1, "offload": "off",
              "duration": 60, "traces": "t", "image": "vllm/vllm-openai:v0.33.0"}  # fmt: skip
    return Cell.parse({**fields, **over})


def test_the_plan_wires_a_vllm_engine_to_its_scraper_on_a_port_of_its_own(tmp_path):
    plan = plan_cell(_cell(), tmp_path, ports=DryRunPortAllocator(), environ={})
    (engine,) = plan.instances
    flag = engine.engine.argv.index("--kv-events-config")
    config = json.loads(engine.engine.argv[flag + 1])
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:$ENGINE0_KV_EVENTS_PORT",
    }
    assert engine.scraper_argv[-2:] == ["--kv-events-port", "$ENGINE0_KV_EVENTS_PORT"]
    # Given by the cell itself: left as given, not counted; another engine's evictions are on /metrics.
    own = plan_cell(
        _cell(engine_args="--kv-events-config '{}'"), tmp_path, ports=DryRunPortAllocator(), environ={}
    )
    assert own.instances[0].engine.argv.count("--kv-events-config") == 1
    assert "--kv-events-port" not in own.instances[0].scraper_argv
    for other in (
        _cell(engine="sglang", image="lmsysorg/sglang:v0.5.23"),
        _cell(engine="sim", image="", hardware="h200"),
    ):
        (inst,) = plan_cell(other, tmp_path, ports=DryRunPortAllocator(), environ={}).instances
        assert "--kv-events-config" not in inst.engine.argv and "--kv-events-port" not in inst.scraper_argv
