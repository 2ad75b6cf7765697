"""`agentsweep accuracy`: score an OpenAI-compatible endpoint's model on a task with the evaluation
harness, write every scored question (accuracy.jsonl) and the score (accuracy.json), and judge it
against the threshold: exit 0 at or above it, 3 below it (as a sweep with INVALID cells), 1 when the
step could not run, 2 for bad input."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from agentsweep.accuracy.harness import run_harness, write_answers
from agentsweep.contract.accuracy import DEFAULT_TIMEOUT_S, TASKS, AccuracySpec
from agentsweep.contract.errors import validation_message
from agentsweep.errors import InputError

BELOW_THRESHOLD = 3
FLAGS = {"timeout_s": "--timeout", "num_fewshot": "--num-fewshot"}  # spec field -> its option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model name the server answers to")
    parser.add_argument(
        "--task", default="gsm8k", help=f"the task ({', '.join(sorted(TASKS))}; default gsm8k)"
    )
    parser.add_argument("--limit", type=int, help="a seeded subset of this many questions (default: all)")
    parser.add_argument(
        "--threshold", type=float, help="the score to reach (default: the task's, docs/accuracy.md)"
    )
    parser.add_argument("--num-fewshot", type=int, help="few-shot examples (default: the task's)")
    parser.add_argument("--seed", type=int, default=1234, help="the subset's and the harness's seed")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds the step may take (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument("--data", type=Path, help="local train.jsonl and test.jsonl instead of the HF cache")
    parser.add_argument("-o", "--output", type=Path, required=True, help="where accuracy.jsonl and .json go")


def spec_from(args: argparse.Namespace) -> AccuracySpec:
    try:
        return AccuracySpec(
            task=args.task,
            limit=args.limit,
            threshold=args.threshold,
            num_fewshot=args.num_fewshot,
            seed=args.seed,
            timeout_s=args.timeout,
        )
    except ValidationError as err:
        name, what = validation_message(err, AccuracySpec)
        raise InputError(f"accuracy {FLAGS.get(name, '--' + name)}: {what}") from None


def run(args: argparse.Namespace) -> int:
    spec = spec_from(args)
    if not args.endpoint.startswith(("http://", "https://")):
        raise InputError(f"--endpoint {args.endpoint!r}: give the server's base URL, http://host:port")
    if args.data is not None and not args.data.is_dir():
        raise InputError(f"--data {args.data}: not a directory")
    result = run_harness(spec, args.endpoint, args.model, data=args.data)
    answers, summary = write_answers(result, args.output)
    print(f"accuracy: {result.score.line()} ({result.seconds:.0f} s); {answers}, {summary}")
    return 0 if result.score.passed else BELOW_THRESHOLD
