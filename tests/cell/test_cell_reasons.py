"""A status reason is one plain line, whatever the log it was copied from held."""

from __future__ import annotations

from agentsweep.cell.record import write_result
from agentsweep.contract.resultdir import read_cell_record, read_status

ROUTER_LINE = (
    "router exited with status 1 during the replay; last line of router.log: "
    "\x1b[2m2026-01-01T00:00:00Z\x1b[0m \x1b[31mERROR\x1b[0m \x1b]8;;http://x\x1b\\worker\x1b]8;;\x1b\\ "
    "gone\x07\x1b[K\rretrying\x00"
)


def test_escape_sequences_from_a_log_never_reach_the_status(tmp_path):
    write_result(tmp_path, cell={"exp_name": "x"}, engine_command=[], engine_env={}, replay_command=[],
                 versions={}, start_utc="2026-01-01T00:00:00Z", status="FAILED", reasons=[ROUTER_LINE])  # fmt: skip
    plain = (
        "router exited with status 1 during the replay; last line of router.log: "
        "2026-01-01T00:00:00Z ERROR worker gone? retrying?"
    )
    status = read_status(tmp_path)
    assert status is not None and status.reasons == (plain,)
    record = read_cell_record(tmp_path)
    assert record is not None and record.reasons == (plain,) and record.reason == plain
    assert "\x1b" not in (tmp_path / "status.txt").read_text() + (tmp_path / "cell.json").read_text()
