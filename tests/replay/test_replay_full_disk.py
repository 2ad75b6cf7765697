"""The replayer's writers on a disk that fills up: requests.jsonl keeps whole records, summary.json
leaves no temporary file, each failure one line naming its file (a small tmpfs, filled)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from kv_cache_tester.errors import WriteFailed
from kv_cache_tester.replay.recorder import Recorder
from kv_cache_tester.replay.results import REQUESTS_FILE, RecordReader, RequestRecord, write_summary

from tests.support import filled_tmpfs

pytestmark = pytest.mark.integration


def _record(i: int) -> RequestRecord:
    rec: dict[str, Any] = {"request_id": f"r{i}", "status": "error", "note": "x" * 700}
    return cast(RequestRecord, rec)


def test_requests_jsonl_on_a_full_disk_keeps_whole_records(tmp_path):
    with filled_tmpfs(tmp_path / "small", 1024, 20) as mount:
        recorder = Recorder(mount)
        written = 0
        with pytest.raises(WriteFailed) as err:
            for i in range(1000):
                recorder.write(_record(i), None)
                written += 1
        recorder.close()
        path = mount / REQUESTS_FILE
        assert err.value.render() == f"write error: {path}: cannot write: no space left on device"
        assert 0 < written < 1000
        assert path.read_bytes().endswith(b"}\n")  # the record that did not fit was taken back out
        assert [r["request_id"] for r in RecordReader(path, required=("request_id",))] == [
            f"r{i}" for i in range(written)
        ]


def test_summary_json_on_a_full_disk_names_the_file_and_leaves_no_temporary(tmp_path):
    with filled_tmpfs(tmp_path / "small", 1024, 8) as mount:
        with pytest.raises(OSError) as err:
            write_summary(mount, cast(Any, {"pad": "x" * (64 << 10)}))
        assert err.value.filename == str(mount / "summary.json") and err.value.errno == 28
        assert sorted(p.name for p in mount.iterdir() if p.name.endswith(".tmp")) == []
