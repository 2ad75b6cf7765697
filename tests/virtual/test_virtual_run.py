"""One simulated run in this process on the virtual clock (``virtual.run.run_local``), given the flags
a cell's plan gives the engine, the collector, the power sampler and the replayer: the files are the
HTTP path's, the client's counts agree with the engine's counters, and flags it cannot honour are
refused with one line."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
from agentsweep.collect.window import window_figures
from agentsweep.errors import InputError
from agentsweep.virtual.run import LocalInstance, LocalRun, run_local

from tests.conftest import SAMPLE_TRACES

pytestmark = pytest.mark.integration

MODEL = "meta-llama/Llama-3.3-70B-Instruct"


def local_run(tmp_path: Path, *engine_extra: str, duration: int = 10, users: int = 3) -> LocalRun:
    out = tmp_path / "cell"
    spec = {
        "source": "dcgm",
        "interval_s": 0.5,
        "targets": [{"node": "vm", "count": 1, "gpus": ["0"], "endpoint": "http://127.0.0.1:1/metrics"}],
    }
    engine = LocalInstance(
        engine_flags=[
            MODEL,
            "--port",
            "8000",
            "--hardware",
            "h200",
            "--speed",
            "50",
            "--quantization",
            "fp8",
            "--num-gpu-blocks-override",
            "8192",
            *engine_extra,
        ],
        server_log=out / "server.log",
        metrics_flags=[
            "--endpoint",
            "http://127.0.0.1:8000/metrics",
            "--output",
            str(out / "server_metrics.csv"),
        ],
    )
    return LocalRun(
        instances=[engine],
        replay_flags=["--api-endpoint", "http://127.0.0.1:8000", "--model", MODEL, "--trace-directory",
                      str(SAMPLE_TRACES), "--output-dir", str(out), "--max-users", str(users), "--test-duration",
                      str(duration), "--recycle", "--api", "chat", "--time-scale", "0.02", "--no-color", "--seed", "0",
                      "--max-delay", "60", "--max-context", "24576", "--grace-period", "5", "--ignore-eos",
                      "--no-plot"],
        replay_log=out / "replay.log",
        power_flags=["--spec", json.dumps(spec), "--output", str(out / "power.csv")],
    )  # fmt: skip


def test_the_run_writes_the_http_paths_files_and_its_counts_agree(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    lines: list[str] = []
    outcome = run_local(run, lines.append)
    assert outcome.reason is None and outcome.signum is None
    out = run.instances[0].server_log.parent
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    counts = summary["counts"]
    assert counts["ok"] > 20 and counts["failed"] == 0
    assert len(records) == counts["ok"] + counts["failed"] + counts["warmup"]
    # The collector's last row: the engine finished exactly what the client recorded.
    rows = list(csv.DictReader((out / "server_metrics.csv").open()))
    assert len(rows) >= 10  # a row a second over the 10 s run, and the last one at its end
    assert float(rows[-1]["requests_finished_total"]) == len(records)
    assert sum(r["output_tokens"] for r in records) == float(rows[-1]["generation_tokens_total"])
    # Rows dated on the run's clock: one virtual second apart, inside the run's span.
    times = [float(r["time_s"]) for r in rows]
    assert times[1] - times[0] == pytest.approx(1.0)
    window = summary["window"]
    assert times[0] <= window["start_unix"] + 0.001 and times[-1] >= window["end_unix"] - 0.001
    # The simulated GPU's power, sampled twice a second.
    power = list(csv.DictReader((out / "power.csv").open()))
    samples = [p for p in power if p.get("power_w")]
    assert len(samples) >= 19 and all(float(p["power_w"]) > 0 for p in samples)
    assert "effective settings" in run.instances[0].server_log.read_text()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--crash-after", "5"), "--crash-after needs the engine in its own process"),
        (("--stall-after", "5"), "--stall-after needs the engine in its own process"),
        (("--disaggregation-mode", "prefill"), "disaggregated prefill/decode"),
    ],
)
def test_flags_it_cannot_honour_are_refused_in_one_line(
    tmp_path: Path, flags: tuple[str, ...], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        run_local(local_run(tmp_path, *flags), print)
    assert not (tmp_path / "cell" / "requests.jsonl").exists()  # refused before anything ran


def test_a_run_is_reproducible_to_the_last_digit(tmp_path: Path) -> None:
    """The same flags give the same run: nothing depends on when the process got the CPU or on the
    fraction of a second it started at (a second run in the same process also reuses the loaded
    traces). The server's and the power figures over the window included."""
    figures = []
    first = time.time()
    for k in range(2):
        if k:  # the second run starts half a second further into its second than the first
            time.sleep((first + 0.5 - time.time()) % 1.0)
        run = local_run(tmp_path / str(k), duration=6)
        assert run_local(run, print).reason is None
        out = run.instances[0].server_log.parent
        summary = json.loads((out / "summary.json").read_text())
        window = summary["window"]
        start, end = window["start_unix"], window["end_unix"]
        server, _ = window_figures(out / "server_metrics.csv", start, end)
        times = [float(r["time_s"]) for r in csv.DictReader((out / "server_metrics.csv").open())]
        power = [float(r["time_s"]) for r in csv.DictReader((out / "power.csv").open())]
        # Readings at whole fractions of a second from a whole second; none of the periodic ones on
        # the window's end, where the millisecond it is dated to would decide which side it falls
        # on. The last of each reader is taken when the replay ended, dated at the end exactly.
        assert times[0] == int(times[0]) and power[0] == int(power[0])
        assert min(abs(t - end) for t in times[:-1] + power[:-1]) >= 0.1
        assert times[-1] == power[-1] == pytest.approx(end, abs=1e-6)
        figures.append(
            (
                summary["counts"],
                summary["throughput"],
                summary["latency"],
                summary["engine_clock"],
                server,
                [round(t - start, 6) for t in times + power],
            )
        )
    assert figures[0] == figures[1]


def test_a_collector_that_cannot_write_fails_the_run_in_one_line(tmp_path: Path) -> None:
    """Its file fills a disk part way through: the run says the collector failed, as its process
    exiting would on the wall clock, and the replay's summary is still written."""
    from dataclasses import replace

    from tests.support import filled_tmpfs

    run = local_run(tmp_path, duration=60)
    with filled_tmpfs(tmp_path / "small", 1024, 4) as mount:
        csv_path = mount / "server_metrics.csv"
        flags = ["--endpoint", "http://127.0.0.1:8000/metrics", "--output", str(csv_path)]
        outcome = run_local(replace(run, instances=[replace(run.instances[0], metrics_flags=flags)]), print)
        assert outcome.reason is not None, "a run whose collector could not write must not pass"
        assert outcome.reason.startswith("metrics collector (in process): WriteError: ")
        assert "no space left on device" in outcome.reason and "\n" not in outcome.reason
        assert (
            run.instances[0].server_log.parent / "summary.json"
        ).exists()  # what the replay measured is kept
        rows = csv_path.read_text().splitlines()
        assert 2 <= len(rows) < 61 and all(r.count(",") == rows[0].count(",") for r in rows)  # whole rows


def test_a_power_sampler_that_cannot_write_is_named_as_the_sampler(tmp_path: Path) -> None:
    """power.csv fills its disk part way through: the run's reason names the power sampler, not the
    metrics collector beside it."""
    from dataclasses import replace

    from tests.support import filled_tmpfs

    run = local_run(tmp_path, duration=60)
    assert run.power_flags is not None
    with filled_tmpfs(tmp_path / "small", 1024, 4) as mount:
        flags = [*run.power_flags[:-1], str(mount / "power.csv")]
        outcome = run_local(replace(run, power_flags=flags), print)
        assert outcome.reason is not None, "a run whose power sampler could not write must not pass"
        assert outcome.reason.startswith("power sampler (in process): "), outcome.reason
        assert "no space left on device" in outcome.reason and "\n" not in outcome.reason
        assert (run.instances[0].server_log.parent / "summary.json").exists()


def test_a_stop_signal_that_lands_as_the_replay_ends_still_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal whose stop the loop no longer runs (the replay had returned, the engines were settling)
    is kept as it arrives: the run ends as stopped by it, not as a whole run (a plan or a capacity search
    would otherwise go on past Ctrl-C)."""
    import os
    import signal

    from agentsweep.virtual import run as virtual_run

    settle = virtual_run._settle

    async def settle_then_signalled(servers: list) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the replay has returned its meta already
        await settle(servers)

    monkeypatch.setattr(virtual_run, "_settle", settle_then_signalled)
    before = signal.getsignal(signal.SIGTERM)
    outcome = run_local(local_run(tmp_path, duration=4), print)
    assert outcome.signum == signal.SIGTERM
    assert outcome.reason == f"stopped by signal {int(signal.SIGTERM)}"
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back
