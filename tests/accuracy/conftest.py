"""GSM8K-format questions (scripts/accuracy/sample_questions.py: the real set is not reachable from
here), and the stand-in server answering them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

STANDIN = Path(__file__).parent / "standin.py"
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "accuracy"
sys.path.insert(0, str(SCRIPTS))

from sample_questions import write_questions  # noqa: E402

__all__ = ["write_questions"]


@pytest.fixture
def standin() -> Iterator[Callable[[Path, float], str]]:
    """Start a stand-in over a data directory answering ``rate`` right; its base URL."""
    procs: list[subprocess.Popen[str]] = []

    def start(data: Path, rate: float) -> str:
        proc = subprocess.Popen(
            [sys.executable, str(STANDIN), str(data), str(rate)], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("port "), line
        return f"http://127.0.0.1:{int(line.split()[1])}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)
