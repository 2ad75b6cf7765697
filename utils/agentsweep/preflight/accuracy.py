"""The accuracy gate's checks: the harness is installed where the cells run it, and each task's
questions are there to read (a local ``data`` directory, or the dataset in the HF cache the cells
use, since compute nodes are often offline). Only cells whose gate runs are checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from agentsweep.accuracy.harness import harness_executable, missing_question_files
from agentsweep.contract.accuracy import TASKS
from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError
from agentsweep.preflight.hub import cache_dir, cached_repo, hf_token
from agentsweep.preflight.report import Check, failed, passed, skipped

# What a container runner needs: the cell runs the harness where it runs, which for a single-engine
# cell is inside the image.
IN_IMAGE = (
    "a cell that runs in its image runs the harness there: set AGENTSWEEP_LMEVAL_VENV to a virtualenv "
    "built with the image's Python on a shared path (mounted into the container; docs/accuracy.md, "
    "'Container runners'), or accuracy: off"
)


def accuracy_checks(
    cells: Sequence[Cell], hf_cache: str | None, environ: Mapping[str, str], container_runtime: str = "none"
) -> list[Check]:
    gated = [c for c in cells if c.accuracy.applies(c.simulated)]
    if not gated:
        why = "every cell's gate is off or its engine simulated (accuracy not measured)"
        return [skipped("accuracy", why)]
    checks: list[Check] = []
    note = f"; {IN_IMAGE}" if container_runtime != "none" else ""
    try:
        exe = harness_executable()
        checks.append(passed("accuracy.harness", f"{exe}{note}"))
    except InputError as err:
        checks.append(failed("accuracy.harness", str(err), f"run scripts/accuracy/setup_venv.sh{note}"))
    for task, data in sorted({(c.accuracy.task, c.accuracy.data) for c in gated}):
        checks.append(_data_check(task, TASKS[task].dataset, data, hf_cache, environ))
    return checks


def _data_check(
    task: str, dataset: str, data: str, hf_cache: str | None, environ: Mapping[str, str]
) -> Check:
    name = f"accuracy.data.{task}"
    if data:
        missing = missing_question_files(Path(data))
        if missing:
            return failed(
                name, f"{data}: no {', '.join(missing)}", "give the task's questions there, or drop data:"
            )
        return passed(name, f"{task} questions from {data}")
    cache = cache_dir(hf_cache, environ)
    present, size = cached_repo(cache, dataset, "dataset")
    if present:
        return passed(name, f"{dataset} is in the HF cache {cache} ({size / 1e6:.1f} MB)")
    fix = f"hf download {dataset} --repo-type dataset --cache-dir {cache}"
    if environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return failed(name, f"{dataset} is not in the HF cache {cache} and HF_HUB_OFFLINE is set", fix)
    from huggingface_hub import HfApi

    try:
        HfApi(endpoint=environ.get("HF_ENDPOINT") or None).dataset_info(
            dataset, token=hf_token(environ) or False
        )
    except Exception as err:  # every hub failure is a line, never a traceback
        return failed(name, f"{dataset}: not in the HF cache {cache}; the hub: {type(err).__name__}", fix)
    return passed(name, f"{dataset} downloadable (not yet in {cache}; nodes without a network need: {fix})")
