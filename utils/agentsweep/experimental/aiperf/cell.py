"""Drive one matrix cell with ``aiperf profile`` instead of the replayer, and leave the same result files.

The cell runner starts the engine and the scraper as usual, then runs :func:`aiperf_command`'s argv in
place of the replayer's (or calls :func:`run_aiperf_cell` in process). Settings mirror the replayer's:

=====================  ===============================================================================
cell field             aiperf profile
=====================  ===============================================================================
users                  --concurrency (a finished conversation is replaced; traces wrap)
duration               --benchmark-duration
warmup_requests        --warmup-request-count users x warmup_requests
api                    --endpoint-type chat|completions, always --streaming
seed                   --random-seed
traces                 --custom-dataset-type weka-trace (local hash ids) or mooncake-trace, converted
                       with think times capped at max_delay and scaled by 1/speed; max_context cuts
timing_strategy        think-only -> --use-think-time-only (weka); original -> recorded start gaps
ignore_eos             --extra-inputs ignore_eos:true
(engine metrics)       --server-metrics <endpoint>/metrics
(token counts)         --use-server-token-count
=====================  ===============================================================================

advance_min/advance_max have no AIPerf equivalent outside its agentic scenario and are not applied.
Against the simulated engine the tokenizer is a local word-level one (see tokenizer.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from agentsweep.contract.cell import Cell, flat_fields
from agentsweep.errors import InputError, RunError
from agentsweep.experimental.aiperf.exports import RECORDS_FILE, write_outputs
from agentsweep.experimental.aiperf.tokenizer import build_word_tokenizer
from agentsweep.experimental.aiperf.traces import PreparedInput, prepare_input
from agentsweep.experimental.aiperf.venv import AIPERF_VERSION, default_venv, ensure_aiperf

ARTIFACT_SUBDIR = "aiperf"  # AIPerf's own exports, kept inside the result directory


def _get(fields: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """A cell field by its flat name from ``cell_fields``'s mapping (``default`` when unset)."""
    value = fields.get(name, default)
    return default if value is None else value


def cell_fields(cell: Any) -> dict[str, Any]:
    """The cell's fields on one level (``Cell.flat``)."""
    if isinstance(cell, Cell):
        return cell.flat()
    if isinstance(cell, Mapping):
        return flat_fields(cell)
    raise InputError(f"not a matrix cell: {type(cell).__name__}")


def aiperf_command(
    cell: Any, *, endpoint: str, output_dir: Path | str, python: str = sys.executable
) -> list[str]:
    """argv the cell runner runs instead of ``replay_command(...)`` when the cell's client is aiperf."""
    fields = {k: v for k, v in cell_fields(cell).items() if v is not None}
    return [
        python,
        "-m",
        "agentsweep.experimental.aiperf",
        "run-cell",
        "--endpoint",
        endpoint,
        "--output-dir",
        str(output_dir),
        "--cell",
        json.dumps(fields, sort_keys=True, separators=(",", ":")),
    ]


def profile_args(
    cell: Any,
    *,
    aiperf: Path | str,
    endpoint: str,
    artifact_dir: Path,
    prepared: PreparedInput,
    tokenizer: str,
    metrics_url: str | None,
    word_tokenizer: bool,
) -> list[str]:
    """The ``aiperf profile`` argv for a cell (see the table in the module docstring)."""
    fields = cell_fields(cell)
    users = int(_get(fields, "users", 1))
    argv = [
        str(aiperf),
        "profile",
        "--model",
        str(_get(fields, "model")),
        "--url",
        endpoint,
        "--endpoint-type",
        str(_get(fields, "api", "chat")),
        "--streaming",
        "--concurrency",
        str(users),
        "--benchmark-duration",
        str(int(_get(fields, "duration", 60))),
        "--use-server-token-count",
        "--custom-dataset-type",
        prepared.dataset_type,
        "--input-file",
        str(prepared.path),
        "--tokenizer",
        tokenizer,
        "--artifact-dir",
        str(artifact_dir),
        "--ui",
        "none",
        "--no-gpu-telemetry",
    ]
    if prepared.dataset_type == "weka-trace":
        argv.append("--allow-dataset-wrap")
        if _get(fields, "timing_strategy", "think-only") != "original":
            argv.append("--use-think-time-only")
    else:
        argv += ["--isl-block-size", str(prepared.block_size)]
    if word_tokenizer:
        argv += ["--prompt-corpus", "sonnet"]  # the corpus the word tokenizer's vocabulary came from
    seed = _get(fields, "seed")
    if seed is not None:
        argv += ["--random-seed", str(int(seed))]
    warm = int(_get(fields, "warmup_requests", 0) or 0)
    if warm > 0:
        argv += ["--warmup-request-count", str(warm * users)]
    if metrics_url:
        argv += ["--server-metrics", metrics_url]
    else:
        argv.append("--no-server-metrics")
    if _get(fields, "ignore_eos", False):
        argv += ["--extra-inputs", "ignore_eos:true"]
    return argv


def corpus_file(aiperf: Path) -> Path:
    """The text corpus AIPerf's ``sonnet`` prompts are sampled from, asked of its own interpreter."""
    python = aiperf.parent / "python"
    code = (
        "import pathlib, aiperf.dataset.generator.prompt as p;"
        "print(pathlib.Path(p.__file__).parent / p.DEFAULT_CORPUS_FILE)"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    path = Path(proc.stdout.strip()) if proc.returncode == 0 else None
    if path is None or not path.is_file():
        raise RunError(f"{python}: cannot locate AIPerf's prompt corpus ({proc.stderr.strip()[-200:]})")
    return path


def tokenizer_cache_dir() -> Path:
    return default_venv().parent / f"word-tokenizer-aiperf-{AIPERF_VERSION}"


def run_aiperf_cell(
    cell: Any,
    endpoint_url: str,
    result_dir: Path,
    *,
    metrics_path: str | None = "/metrics",
    install: bool = True,
    log: Callable[[str], None] | None = None,
    trace_format: str = "auto",
) -> int:
    """Run ``aiperf profile`` for ``cell`` against ``endpoint_url`` (``http://HOST:PORT``).

    Writes requests.jsonl + summary.json (``client: aiperf``) into ``result_dir`` and AIPerf's own
    exports under ``result_dir/aiperf/``. Returns AIPerf's exit status (0 = success); bad input raises
    InputError, a missing AIPerf RunError.
    """
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    fields = cell_fields(cell)
    result_dir.mkdir(parents=True, exist_ok=True)
    aiperf = ensure_aiperf(install=install, log=say)
    engine = str(_get(fields, "engine", "sim"))
    speed = float(_get(fields, "speed", 1.0) or 1.0)
    artifact_dir = result_dir / ARTIFACT_SUBDIR
    if artifact_dir.exists():
        shutil.rmtree(artifact_dir)
    work = Path(tempfile.mkdtemp(prefix="agentsweep-aiperf-"))
    env = dict(os.environ)
    try:
        prepared = prepare_input(
            str(_get(fields, "traces")),
            work,
            time_scale=1.0 / speed,
            max_delay=_get(fields, "max_delay"),
            max_context=int(_get(fields, "max_context", 0) or 0) or None,
            fmt=trace_format,
        )
        word = engine == "sim"
        if word:
            tokenizer = str(build_word_tokenizer([corpus_file(aiperf)], tokenizer_cache_dir()))
            # AIPerf resolves every tokenizer name as a hub id when offline mode is on
            env.pop("HF_HUB_OFFLINE", None)
            env.pop("TRANSFORMERS_OFFLINE", None)
        else:
            tokenizer = str(_get(fields, "model"))
        metrics_url = endpoint_url.rstrip("/") + metrics_path if metrics_path else None
        argv = profile_args(
            cell,
            aiperf=aiperf,
            endpoint=endpoint_url,
            artifact_dir=artifact_dir,
            prepared=prepared,
            tokenizer=tokenizer,
            metrics_url=metrics_url,
            word_tokenizer=word,
        )
        say(
            f"aiperf: {prepared.traces} traces ({prepared.requests} requests) as {prepared.dataset_type}; "
            f"{_get(fields, 'users')} users for {_get(fields, 'duration')} s"
        )
        rc, reason, cpu_s, wall_s = _run(argv, env, result_dir / "aiperf.log")
        if not (artifact_dir / RECORDS_FILE).is_file():
            raise RunError(
                f"aiperf exited with status {rc} and left no {RECORDS_FILE} (see {result_dir}/aiperf.log)"
            )
        options = {
            "client": "aiperf",
            "aiperf_version": AIPERF_VERSION,
            "aiperf_argv": argv,
            "dataset_type": prepared.dataset_type,
            "tokenizer": "word-level (simulated engine)" if word else tokenizer,
            "cell": fields,
        }
        summary = write_outputs(
            artifact_dir,
            result_dir,
            prepared,
            users=int(_get(fields, "users", 1)),
            options=options,
            cpu_s=cpu_s,
            wall_s=wall_s,
            reason=reason,
        )
        counts = summary["counts"]
        say(f"aiperf: {counts['ok']} ok, {counts['failed']} failed, {counts['warmup']} warmup (exit {rc})")
        return rc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[int, str, float, float]:
    """Run AIPerf in its own process group; SIGTERM/SIGINT are passed on. (rc, reason, cpu s, wall s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    reason = "duration"
    with open(log_path, "w", encoding="utf-8") as log_fh:
        proc = subprocess.Popen(
            argv, env=env, stdout=log_fh, stderr=subprocess.STDOUT, start_new_session=True
        )

        def forward(signum: int, _frame: FrameType | None) -> None:
            nonlocal reason
            reason = "signal"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)  # AIPerf writes its exports on SIGINT

        old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            rc = proc.wait()
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            if proc.poll() is None:  # pragma: no cover - only when wait() was interrupted
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return rc, reason, cpu, time.monotonic() - t0
