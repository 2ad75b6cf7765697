"""GSM8K-format questions written by the tests (the real set is not reachable from here), and the
stand-in server answering them."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

STANDIN = Path(__file__).parent / "standin.py"


def write_questions(directory: Path, test: int, train: int = 10, seed: int = 7) -> Path:
    """``train.jsonl`` and ``test.jsonl`` in GSM8K's fields: a worked answer ending ``#### N``."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("test", test)):
        with (directory / f"{split}.jsonl").open("w") as fh:
            for i in range(count):
                a, b, c = rng.randint(2, 90), rng.randint(2, 90), rng.randint(2, 9)
                question = (
                    f"A crate holds {a} apples and a second crate {b}. Each apple is cut into {c} slices. "
                    f"How many slices are there? ({split} {i})"
                )
                answer = f"{a} + {b} = {a + b} apples, so {a + b} * {c} = {(a + b) * c} slices.\n#### {(a + b) * c}"
                fh.write(json.dumps({"question": question, "answer": answer}) + "\n")
    return directory


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
