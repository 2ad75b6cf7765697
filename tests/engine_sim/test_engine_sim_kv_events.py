"""scripts/vllm_cpu/kv_events.py, the KV-pressure comparison's count of vLLM's evicted blocks, fed by a
real ZMQ publisher sending vLLM's KV-cache event wire format (topic, 8-byte sequence, msgpack batch)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from tests.support import poll_until

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "vllm_cpu" / "kv_events.py"

pytestmark = pytest.mark.integration


def _batch(*events: dict) -> bytes:
    # vLLM's EventBatch is array-like: [ts, events, data_parallel_rank]; each event a map tagged by type.
    return msgspec.msgpack.encode([time.time(), list(events), 0])


def _stored(*hashes: int) -> dict:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None,
            "token_ids": [0] * 64 * len(hashes), "block_size": 64, "lora_id": None, "medium": "GPU"}  # fmt: skip


def _removed(*hashes: int, medium: str | None = "GPU") -> dict:
    event: dict = {"type": "BlockRemoved", "block_hashes": list(hashes)}
    if medium is not None:
        event["medium"] = medium
    return event


def _publish(endpoint: str, messages: list[tuple[int, bytes]]) -> None:
    """A PUB socket connecting to ``endpoint`` (as vLLM's publisher does to an address without "*")."""
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.connect(endpoint)
    time.sleep(0.5)  # the connection is up before the first message (vLLM publishes on requests only)
    for seq, payload in messages:
        pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
    time.sleep(0.3)
    pub.close(linger=1000)
    context.term()


def test_it_counts_stored_and_evicted_blocks_and_says_when_a_count_is_not_whole(tmp_path: Path) -> None:
    out = tmp_path / "events"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--out", str(out), "whole", "gappy"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        endpoints = json.loads(proc.stdout.readline())
        assert set(endpoints) == {"whole", "gappy"}
        assert all(e.startswith("tcp://127.0.0.1:") for e in endpoints.values())
        _publish(endpoints["whole"], [
            (0, _batch(_stored(1, 2, 3), _stored(4))),
            (1, _batch(_removed(1, 2), _removed(3, medium=None), _removed(9, medium="CPU"))),
            (2, _batch({"type": "AllBlocksCleared"})),
        ])  # fmt: skip
        _publish(endpoints["gappy"], [(0, _batch(_removed(5))), (3, _batch(_removed(6)))])
        poll_until(lambda: (out / "gappy.json").exists() and (out / "whole.json").exists(), timeout=10)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    whole = json.loads((out / "whole.json").read_text())
    assert whole["whole"] is True
    assert (whole["batches"], whole["stored_blocks"], whole["cleared"]) == (3, 4, 1)
    assert (whole["removed_blocks"], whole["removed_other_blocks"]) == (3, 1)  # GPU or unnamed / CPU
    gappy = json.loads((out / "gappy.json").read_text())
    assert (gappy["missing"], gappy["removed_blocks"], gappy["whole"]) == (2, 2, False)


def test_names_that_are_not_file_names_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "a", "a"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "distinct file names" in proc.stderr


def test_a_name_no_file_can_have_is_one_line_before_any_socket(tmp_path: Path) -> None:
    long = "n" * 300
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "events"), "ok", long],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (2, "")  # no endpoint printed: nothing was bound
    assert proc.stderr == (
        f"kv-events: NAME {'n' * 40!r}... (300 characters): its count file NAME.json is longer than a file "
        f"name in {tmp_path / 'events'} may be (255 bytes)\n"
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "events"), ".."],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.startswith("kv-events: names must be distinct file names")
