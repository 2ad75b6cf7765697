"""Bad `agentsweep metrics-collector` input: one line naming what and where, exit status 2.

These used to end in a traceback (an --output below a file, an infinite --interval) or, worse,
append CSV rows to whatever file --output named.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.metrics.dialects import COLUMNS

# Nothing listens there; no case below gets as far as scraping.
ENDPOINT = "http://127.0.0.1:9/metrics"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    rc = main(["metrics-collector", "--endpoint", ENDPOINT, *argv])
    return rc, capsys.readouterr().err.splitlines()


def test_output_below_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file.txt").write_text("x")
    out = tmp_path / "file.txt" / "server_metrics.csv"
    assert _run(capsys, "--output", str(out)) == (
        2,
        [f"input error: --output {out}: {tmp_path / 'file.txt'} is not a directory"],
    )


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00binary", b"time_s,other\n1,2\n", b"a,b\n"])
def test_refuses_to_append_to_a_foreign_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    out = tmp_path / "notes.csv"
    out.write_bytes(content)
    rc, err = _run(capsys, "--output", str(out))
    assert rc == 2
    assert err == [
        f"input error: --output {out}: exists and is not a server_metrics.csv "
        "(first line is not the time_s,... header); refusing to append to it"
    ]
    assert out.read_bytes() == content  # untouched


def test_an_existing_metrics_file_is_still_appended_to(tmp_path: Path) -> None:
    from agentsweep.metrics.scraper import Scraper

    out = tmp_path / "server_metrics.csv"
    out.write_text(",".join(COLUMNS) + "\n")
    assert Scraper(ENDPOINT, out)._check_output() is False
    assert Scraper(ENDPOINT, tmp_path / "new.csv")._check_output() is True


@pytest.mark.parametrize("value", ["inf", "nan", "1e12", "0", "-1"])
def test_interval_must_be_finite_and_positive(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    # argparse reports type errors (exit 2); an infinite wait used to overflow in Event.wait.
    with pytest.raises(SystemExit) as exc:
        main(["metrics-collector", "--endpoint", ENDPOINT, "--output", "x.csv", "--interval", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --interval: must be > 0 and at most 86400 seconds, got {value}" in err
    assert "Traceback" not in err
