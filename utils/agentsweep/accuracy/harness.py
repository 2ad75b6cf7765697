"""Run lm-evaluation-harness (``lm_eval``, in its own virtualenv: scripts/accuracy/setup_venv.sh) against
an OpenAI-compatible chat-completions endpoint, and read back its per-question answers.

The harness is called as InferenceX calls it for GSM8K: the ``local-chat-completions`` model type, the
served model's chat template (``--apply_chat_template --fewshot_as_multiturn``), greedy decoding as the
task states it. A sample limit is a seeded subset of the test split (``--samples``, recorded), never the
first N questions. Questions come from the Hugging Face cache (prefetched on a cluster) or from local
JSON-lines files in the task's own format (``--data DIR`` holding ``train.jsonl`` and ``test.jsonl``):
then the run is offline.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from kv_cache_tester.inputfiles import open_regular

from agentsweep.accuracy.score import Score
from agentsweep.contract.accuracy import AccuracySpec
from agentsweep.contract.resultdir.accuracy import AccuracyRecord, write_accuracy
from agentsweep.contract.resultdir.files import ACCURACY_JSON, ACCURACY_JSONL
from agentsweep.errors import InputError, ResultFileError, RunError

HARNESS = "lm-eval"
HARNESS_VERSION = "0.4.13"
VENV_VAR = "AGENTSWEEP_LMEVAL_VENV"
# The test split's size of each task on the Hub (a seeded subset of it is drawn without loading it).
HUB_TEST_SIZE = {"gsm8k": 1319}
CONCURRENCY = 8  # requests the harness keeps in flight


class HarnessFailed(RunError):
    """The accuracy step could not run to a score (the harness failed, timed out, or wrote nothing)."""


def default_venv() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get(VENV_VAR) or cache / "agentsweep" / f"lmeval-{HARNESS_VERSION}")


def harness_executable(venv: Path | None = None) -> Path:
    """The harness's ``lm_eval``; one line naming the set-up script when it is missing."""
    venv = venv or default_venv()
    exe = venv / "bin" / "lm_eval"
    if not exe.is_file():
        raise InputError(
            f"the accuracy harness ({HARNESS} {HARNESS_VERSION}) is not installed in {venv}: run "
            f"scripts/accuracy/setup_venv.sh (or set {VENV_VAR})"
        )
    return exe


def _task_yaml(venv: Path, task: str) -> Path:
    found = sorted((venv / "lib").glob(f"python3*/site-packages/lm_eval/tasks/{task}/{task}.yaml"))
    if not found:
        raise InputError(f"{venv}: {HARNESS} has no task file for {task}")
    return found[0]


QUESTION_FILES = ("train.jsonl", "test.jsonl")


def missing_question_files(data: Path) -> list[str]:
    """The files of a local question set (``--data``, an entry's ``accuracy.data``) that ``data`` lacks."""
    return [name for name in QUESTION_FILES if not (data / name).is_file()]


def _task_file(venv: Path, task: str, work: Path, data: Path | None) -> str:
    """A task file in ``work`` that includes the harness's own definition of ``task`` (reading ``data``'s
    files in place of the Hub's when given): the name to pass to ``--tasks``."""
    missing = missing_question_files(data) if data is not None else []
    if missing:
        raise InputError(
            f"--data {data}: no {', '.join(missing)} (the task's questions, one JSON object a line)"
        )
    lines = [f"include: {json.dumps(str(_task_yaml(venv, task)))}"]
    name = task
    if data is not None:
        name = f"{task}_local"
        lines += [
            f"task: {name}",
            "dataset_path: json",
            "dataset_name: null",
            "dataset_kwargs:",
            "  data_files:",
            f"    train: {json.dumps(str((data / 'train.jsonl').resolve()))}",
            f"    test: {json.dumps(str((data / 'test.jsonl').resolve()))}",
        ]
    (work / f"{name}.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return name


# The harness's own ``lm_eval run``, with its task index built from --include_path alone: by default it
# first reads every task definition it ships (about 14,000 YAML files: 10-15 s of CPU) to find the one
# task the gate runs, whose definition the file in --include_path includes by its path.
HARNESS_MAIN = """
import sys
from lm_eval.tasks import manager
_init = manager.TaskManager.__init__
def _init_from_include_path(self, *args, **kwargs):
    kwargs["include_defaults"] = False
    _init(self, *args, **kwargs)
manager.TaskManager.__init__ = _init_from_include_path
from lm_eval.__main__ import cli_evaluate
sys.exit(cli_evaluate())
"""


def _count_lines(path: Path) -> int:
    with open_regular(path, follow_links=False) as fh:
        return sum(1 for line in fh if line.strip())


def subset(size: int, limit: int | None, seed: int) -> list[int] | None:
    """The question indices a limit takes: a seeded draw, sorted; None for every question."""
    if limit is None or limit >= size:
        return None
    return sorted(random.Random(f"accuracy:{seed}").sample(range(size), limit))


@dataclass(frozen=True, slots=True)
class Answer:
    """One question as the harness scored it."""

    doc_id: int
    question: str
    target: str
    response: str
    extracted: str
    correct: bool


@dataclass(frozen=True, slots=True)
class AccuracyRun:
    spec: AccuracySpec
    score: Score
    answers: list[Answer]
    doc_ids: list[int] | None  # the subset asked (None: the whole test split)
    seconds: float

    threshold_source: str = ""

    def record(self) -> AccuracyRecord:
        """accuracy.json's record of this run."""
        return AccuracyRecord(
            outcome="passed" if self.score.passed else "failed",
            task=self.spec.task,
            reason=self.score.line(),
            threshold=self.score.threshold,
            threshold_source=self.threshold_source,
            harness=f"{HARNESS} {HARNESS_VERSION}",
            metric=f"{self.spec.info.metric},{self.spec.info.filter}",
            num_fewshot=self.spec.effective_fewshot,
            limit=self.spec.limit,
            seed=self.spec.seed,
            doc_ids=self.doc_ids,
            questions=self.score.total,
            correct=self.score.correct,
            score=self.score.value,
            ci95=self.score.interval,
            seconds=round(self.seconds, 3),
        )


def run_harness(
    spec: AccuracySpec,
    base_url: str,
    model: str,
    *,
    data: Path | None = None,
    threshold: tuple[float, str] | None = None,
    venv: Path | None = None,
) -> AccuracyRun:
    """Score ``model`` served at ``base_url`` (``http://host:port``) on ``spec``'s task, judged against
    ``threshold`` (the score and where it comes from; default: the spec's own or its task's)."""
    venv = venv or default_venv()
    exe = harness_executable(venv)
    info = spec.info
    with tempfile.TemporaryDirectory(prefix="agentsweep-accuracy-") as tmp:
        work = Path(tmp)
        env = dict(os.environ)
        task = _task_file(venv, info.harness_task, work, data)
        command = [str(exe.parent / "python"), "-c", HARNESS_MAIN, "run", "--include_path", str(work)]
        if data is not None:
            size = _count_lines(data / "test.jsonl")
            env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
        else:
            size = HUB_TEST_SIZE[info.harness_task]
        doc_ids = subset(size, spec.limit, spec.seed)
        model_args = ",".join(
            (
                f"model={model}",
                f"base_url={base_url.rstrip('/')}/v1/chat/completions",
                f"num_concurrent={CONCURRENCY}",
                "max_retries=1",
                "tokenizer_backend=None",
            )
        )
        command += [
            "--model", "local-chat-completions", "--model_args", model_args,
            "--apply_chat_template", "--fewshot_as_multiturn",
            "--tasks", task, "--num_fewshot", str(spec.effective_fewshot),
            "--seed", str(spec.seed), "--output_path", str(work / "out"), "--log_samples",
        ]  # fmt: skip
        if doc_ids is not None:
            command += ["--samples", json.dumps({task: doc_ids})]
        started = time.monotonic()
        try:
            proc = subprocess.run(
                command,
                env=env,
                cwd=work,
                capture_output=True,
                text=True,
                timeout=spec.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise HarnessFailed(f"accuracy: {spec.task} did not finish within {spec.timeout_s:g} s") from None
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
            last = lines[-1][-400:] if lines else "no message"  # the exception's own line, not its trace
            raise HarnessFailed(f"accuracy: {HARNESS} exited with status {proc.returncode}: {last}")
        answers = list(_answers(work / "out", task, info.filter, info.metric))
    if not answers:
        raise HarnessFailed(f"accuracy: {HARNESS} scored no question of {spec.task}")
    expected = len(doc_ids) if doc_ids is not None else size
    if len(answers) != expected:
        raise HarnessFailed(f"accuracy: {HARNESS} scored {len(answers)} of the {expected} questions asked")
    correct = sum(a.correct for a in answers)
    value, source = threshold or spec.threshold_for(None)
    score = Score(spec.task, correct, len(answers), value)
    return AccuracyRun(spec, score, answers, doc_ids, seconds, source)


def _answers(out: Path, task: str, filter_name: str, metric: str) -> Iterator[Answer]:
    files = sorted(out.glob(f"*/samples_{task}_*.jsonl"))
    if not files:
        raise HarnessFailed(f"accuracy: {HARNESS} wrote no per-question file for {task}")
    with open_regular(files[-1], follow_links=False) as fh:
        for number, line in enumerate(fh, 1):
            try:
                row = json.loads(line)
                if row.get("filter") != filter_name:
                    continue
                doc = row["doc"]
                yield Answer(
                    doc_id=int(row["doc_id"]),
                    question=str(doc.get("question", "")),
                    target=str(row["target"]),
                    response=str(row["resps"][0][0]),
                    extracted=str(row["filtered_resps"][0]),
                    correct=float(row[metric]) == 1.0,
                )
            except (ValueError, KeyError, IndexError, TypeError) as err:
                raise HarnessFailed(
                    f"accuracy: {files[-1].name} line {number}: {type(err).__name__}: {err}"
                ) from None


def read_answers(directory: Path) -> list[Answer]:
    """``accuracy.jsonl`` of ``directory`` (none when absent); ResultFileError naming a line that is not
    a scored question."""
    path = directory / ACCURACY_JSONL
    if not path.exists():
        return []
    answers = []
    with open_regular(path, follow_links=False) as fh:
        for number, line in enumerate(fh, 1):
            try:
                answers.append(Answer(**json.loads(line)))
            except (ValueError, TypeError) as err:
                raise ResultFileError(f"{ACCURACY_JSONL}: line {number}: {err}") from None
    return answers


def write_answers(run: AccuracyRun, directory: Path) -> tuple[Path, Path]:
    """``accuracy.jsonl`` (one scored question a line, for audit) and ``accuracy.json`` (the score)."""
    directory.mkdir(parents=True, exist_ok=True)
    answers = directory / ACCURACY_JSONL
    with answers.open("w", encoding="utf-8") as fh:
        for answer in run.answers:
            fh.write(json.dumps(asdict(answer)) + "\n")
    write_accuracy(directory, run.record())
    return answers, directory / ACCURACY_JSON
